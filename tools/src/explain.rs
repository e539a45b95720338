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
    #[arg(required_unless_present = "plan_pipeline")]
    pub artifact: Option<PathBuf>,
    /// The op's instance name (`relu`, `matmul2`, `grad_matmul_b`).
    #[arg(long, required_unless_present = "plan_pipeline")]
    pub op: Option<String>,
    /// The rank whose communication to show.
    #[arg(long, default_value_t = 0)]
    pub rank: u32,
    /// Instead of an op: plan the pipeline of the transformer builder's model
    /// `LAYERS,HIDDEN,HEADS,SEQ` (stages, layer split, intra-op mesh, micro-batches, ZeRO-1,
    /// recompute) and show the stage plan, each stage's memory and the predicted bubble.
    #[arg(long, value_name = "LAYERS,HIDDEN,HEADS,SEQ", conflicts_with_all = ["artifact", "op"])]
    pub plan_pipeline: Option<String>,
    /// `--plan-pipeline`: devices.
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// `--plan-pipeline`: the global batch, in sequences.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// `--plan-pipeline`: the machine, a preset (cpu, 8xh100, ascend910) or a device
    /// description file.
    #[arg(long, default_value = "8xh100")]
    pub device: String,
    /// `--plan-pipeline`: the memory limit per device in GB (`max_device_memory`); the
    /// device's memory when absent.
    #[arg(long)]
    pub max_device_memory: Option<f64>,
}

/// `shardc explain --plan-pipeline L,H,A,S`: the stage plan of the transformer `L,H,A,S` on
/// `--devices` devices with `--batch` sequences, each stage's memory and the predicted
/// bubble, and the best Megatron-LM 3D plan under the same cost model for comparison.
pub fn explain_plan(a: &ExplainArgs, spec: &str) -> Result<()> {
    use shardc_compiler::device::DeviceDescription;
    use shardc_compiler::transformer::TransformerConfig;
    use shardc_compiler::transformer_layers::TransformerLayers;
    use shardc_passes::parallel::search::stage_plan::plan;
    let v: Vec<usize> = spec
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("--plan-pipeline {spec}: expected LAYERS,HIDDEN,HEADS,SEQ"))?;
    let [layers, hidden, heads, seq] = v[..] else {
        bail!("--plan-pipeline {spec}: expected four numbers, LAYERS,HIDDEN,HEADS,SEQ");
    };
    let d = if DeviceDescription::PRESETS.contains(&a.device.as_str()) {
        DeviceDescription::preset(&a.device)?
    } else {
        DeviceDescription::load(std::path::Path::new(&a.device))?
    };
    let cfg = TransformerConfig::new(layers, hidden, heads, seq, a.batch);
    cfg.validate()?;
    let mut o = d.plan_options(a.devices, a.batch);
    if let Some(gb) = a.max_device_memory {
        o.memory_limit = o.memory_limit.min(gb * 1e9);
    }
    let r = plan(&TransformerLayers { cfg }, &o)?;
    println!(
        "pipeline plan of the transformer layers={layers} hidden={hidden} heads={heads} seq={seq} \
         batch={} on {} devices of {} (memory limit {:.2} GiB per device; {} intra-op \
         profiles, {} pipeline shapes, {:.2} s)",
        a.batch,
        a.devices,
        d.name,
        o.memory_limit / (1u64 << 30) as f64,
        r.profiles,
        r.shapes,
        r.seconds
    );
    print!("{}", r.auto);
    println!(
        "predicted bubble {:.1}% of the step: (S - 1) = {} idle slots of the slowest stage \
         ({:.3} ms per micro-batch) in a step of {:.3} ms ({} micro-batches)",
        100.0 * r.auto.bubble,
        r.auto.stages.len() - 1,
        r.auto.slowest * 1e3,
        r.auto.step * 1e3,
        r.auto.shape.micro_batches
    );
    match &r.megatron {
        Some(m) => print!("best Megatron-LM 3D plan under the same model: {}", m),
        None => println!("no Megatron-LM 3D plan fits"),
    }
    Ok(())
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

/// What `shardc explain` explains of an artifact: one op, one rank's communication.
struct Explained {
    artifact: PathBuf,
    op: String,
    rank: u32,
}

/// `shardc explain`.
pub fn explain(a: &ExplainArgs) -> Result<()> {
    if let Some(spec) = &a.plan_pipeline {
        return explain_plan(a, spec);
    }
    let (Some(artifact), Some(op)) = (&a.artifact, &a.op) else {
        bail!("shardc explain needs an artifact and --op, or --plan-pipeline");
    };
    let a = &Explained {
        artifact: artifact.clone(),
        op: op.clone(),
        rank: a.rank,
    };
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
