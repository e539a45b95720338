//! `shardc explain OUT/ --op NAME`: the whole story of one op of a parallel compilation —
//! its strategy and where it came from, the candidates weighed and their costs, its layouts,
//! and the communication around it on one rank with the bytes it moves per step.
//!
//! `shardc compile` records every decision in the artifact's manifest (`extra.decisions`,
//! written by [`decisions_json`]); this command reads it back with the rank's graph.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Map, Value};
use shardc_compiler::pipeline::ParallelCompiled;
use shardc_ir::artifact::Artifact;
use shardc_ir::{Graph, OpKind, Strategy};
use shardc_passes::parallel::strategy::Source;
use std::path::PathBuf;

/// Arguments of `shardc explain`.
#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// The artifact directory written by `shardc compile` with several devices.
    pub artifact: PathBuf,
    /// The op's instance name (`relu`, `matmul2`, `grad_matmul_b`).
    #[arg(long)]
    pub op: String,
    /// The rank whose communication to show.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
}

/// A strategy as `explain` prints it: the in strategy, then ` out ` and the out strategy when
/// there is one.
fn strategy_text(strategy: &Strategy, out: Option<&Strategy>) -> String {
    match out {
        Some(o) => format!("{strategy} out {o}"),
        None => strategy.to_string(),
    }
}

/// Every op's decision as JSON (for the manifest): strategy (and out strategy, when it splits
/// a dimension no input has), source, layouts, candidates.
pub fn decisions_json(p: &ParallelCompiled) -> Value {
    let mut m = Map::new();
    for (n, d) in p.begin.nodes.iter().zip(&p.assignment.decisions) {
        let Some(d) = d else { continue };
        let layouts = |ls: Vec<String>| Value::Array(ls.into_iter().map(Value::String).collect());
        let mut entry = json!({
                "op": n.op.name(),
                "scope": n.scope,
                "strategy": d.sharding.strategy.to_string(),
                "source": d.source.to_string(),
                "dev_matrix": d.sharding.dev_matrix,
                "inputs": layouts(d.sharding.inputs.iter().map(|l| l.as_ref().map_or("constant".to_string(), |l| l.to_string())).collect()),
                "outputs": layouts(d.sharding.outputs.iter().map(|l| l.to_string()).collect()),
                "candidates": d.candidates.iter().map(|c| json!({
                    "strategy": strategy_text(&c.strategy, c.out_strategy.as_ref()),
                    "communication": c.communication,
                    "compute": c.compute,
                    "memory": c.memory,
                })).collect::<Vec<_>>(),
                "searched": matches!(d.source, Source::Searched { .. } | Source::Completed { .. }),
        });
        if let (Some(o), Some(e)) = (&d.sharding.out_strategy, entry.as_object_mut()) {
            e.insert("out_strategy".into(), Value::String(o.to_string()));
        }
        m.insert(n.instance.clone(), entry);
    }
    Value::Object(m)
}

/// Bytes one rank sends per step for a communication node of `g` (ring algorithms).
pub fn comm_bytes(g: &Graph, i: usize) -> f64 {
    let n = &g.nodes[i];
    let p = n
        .attrs
        .ints("rank_list")
        .map(|v| v.len())
        .unwrap_or(1)
        .max(1) as f64;
    let in_bytes = n
        .inputs
        .first()
        .and_then(|o| g.operand_tensor_type(o))
        .map_or(0.0, |t| t.size_bytes() as f64);
    let out_bytes = n.ty.size_bytes() as f64;
    match n.op {
        OpKind::AllReduce => 2.0 * (p - 1.0) / p * in_bytes,
        OpKind::AllGather => (p - 1.0) / p * out_bytes,
        OpKind::ReduceScatter | OpKind::AllToAll => (p - 1.0) / p * in_bytes,
        OpKind::Broadcast | OpKind::Send => in_bytes,
        _ => 0.0,
    }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// `shardc explain`.
pub fn explain(a: &ExplainArgs) -> Result<()> {
    let art = Artifact::read(&a.artifact)?;
    let Some(Value::Object(decisions)) = art.manifest.extra.get("decisions") else {
        bail!(
            "{}: no parallel decisions recorded (compile with --device-num N and a parallel mode)",
            a.artifact.display()
        );
    };
    let Some(d) = decisions.get(&a.op) else {
        let mut near: Vec<&String> = decisions
            .keys()
            .filter(|k| k.contains(&a.op) || a.op.contains(k.as_str()))
            .collect();
        near.truncate(12);
        bail!(
            "no op '{}' in {}; ops with a similar name: {}",
            a.op,
            a.artifact.display(),
            if near.is_empty() {
                "none".to_string()
            } else {
                near.iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    };
    let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    println!("op {} ({}), scope {}", a.op, s("op"), s("scope"));
    let chosen = match s("out_strategy") {
        o if o.is_empty() => s("strategy"),
        o => format!("{} out {o}", s("strategy")),
    };
    println!("  strategy   {chosen}");
    println!("  from       {}", s("source"));
    println!(
        "  device matrix {}",
        d.get("dev_matrix")
            .map(|v| v.to_string())
            .unwrap_or_default()
    );
    for (k, l) in d
        .get("inputs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        println!("  input {k}    {}", l.as_str().unwrap_or(""));
    }
    for (k, l) in d
        .get("outputs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        println!("  result {k}   {}", l.as_str().unwrap_or(""));
    }
    let cands = d
        .get("candidates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let searched = d.get("searched").and_then(Value::as_bool).unwrap_or(false);
    let field = |c: &Value, k: &str| num(&c[k]);
    if cands.is_empty() {
        println!("  candidates: none weighed (the strategy was given, or follows a weight)");
    } else if searched {
        println!(
            "  candidates weighed by the search ({}), against the chosen neighbours: step time = compute + communication, and memory per device:",
            cands.len()
        );
        let mut rows: Vec<&Value> = cands.iter().collect();
        rows.sort_by(|x, y| {
            (field(x, "compute") + field(x, "communication"))
                .total_cmp(&(field(y, "compute") + field(y, "communication")))
        });
        println!(
            "    {:<28} {:>12} {:>12} {:>14} {:>12}",
            "strategy", "total us", "compute us", "comm. us", "memory KiB"
        );
        for c in rows {
            let st = c.get("strategy").and_then(Value::as_str).unwrap_or("");
            let (comp, comm) = (field(c, "compute"), field(c, "communication"));
            println!(
                "    {:<28} {:>12.3} {:>12.3} {:>14.3} {:>12.1}{}",
                st,
                (comp + comm) * 1e6,
                comp * 1e6,
                comm * 1e6,
                field(c, "memory") / 1024.0,
                if st == chosen { "   <- chosen" } else { "" }
            );
        }
    } else {
        println!(
            "  candidates weighed ({}), cost in bytes-equivalent = communication + compute:",
            cands.len()
        );
        let mut rows: Vec<(String, f64, f64)> = cands
            .iter()
            .map(|c| {
                (
                    c.get("strategy")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    num(&c["communication"]),
                    num(&c["compute"]),
                )
            })
            .collect();
        rows.sort_by(|x, y| (x.1 + x.2).total_cmp(&(y.1 + y.2)));
        for (st, comm, comp) in rows {
            println!(
                "    {:<28} {:>12.0} = {:>12.0} + {:>10.0}{}",
                st,
                comm + comp,
                comm,
                comp,
                if st == chosen { "   <- chosen" } else { "" }
            );
        }
    }
    let g = &art
        .rank_graph(a.rank as usize)
        .with_context(|| format!("rank {} of the artifact", a.rank))?;
    println!("  communication around it on rank {}:", a.rank);
    let mut total = 0.0;
    let mut any = false;
    for (i, n) in g.nodes.iter().enumerate() {
        let edge = n.comments.iter().find(|c| c.starts_with("edge: "));
        let Some(edge) = edge else { continue };
        let head = edge.split(':').nth(1).unwrap_or("");
        let mut ends = head.split(" -> ");
        let from = ends.next().unwrap_or("").trim();
        let to = ends
            .next()
            .unwrap_or("")
            .split(" input")
            .next()
            .unwrap_or("")
            .trim();
        if from != a.op && to != a.op {
            continue;
        }
        any = true;
        let bytes = comm_bytes(g, i);
        total += bytes;
        let rule = n
            .comments
            .iter()
            .find(|c| c.starts_with("rule: "))
            .map(|c| c.trim_start_matches("rule: "))
            .unwrap_or("");
        let group = n
            .attrs
            .ints("rank_list")
            .map(|v| format!(" over {v:?}"))
            .unwrap_or_default();
        println!(
            "    %{} {} '{}'{group}: {} -> {}, {:.0} bytes/step",
            i + 1,
            n.op,
            n.instance,
            from,
            to,
            bytes
        );
        println!("        rule: {rule}");
    }
    if !any {
        println!("    none: its inputs arrive and its results leave in the layouts they need");
    } else {
        println!(
            "    total {total:.0} bytes sent per step by rank {}",
            a.rank
        );
    }
    Ok(())
}
