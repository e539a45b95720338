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
    // The cost model's share of the step per op (absent where it cannot price the graph,
    // e.g. one stage's graph of a pipeline: the report then shows no prediction).
    let predicted: std::collections::HashMap<usize, _> =
        shardc_passes::parallel::search::predict_per_op(&p.begin, &p.options, &p.assignment)
            .map(|v| v.into_iter().collect())
            .unwrap_or_default();
    let mut m = Map::new();
    for (i, (n, d)) in p
        .begin
        .nodes
        .iter()
        .zip(&p.assignment.decisions)
        .enumerate()
    {
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
        if let (Some(b), Some(e)) = (predicted.get(&i), entry.as_object_mut()) {
            e.insert(
                "predicted".into(),
                json!({
                    "compute_seconds": b.compute,
                    "communication_seconds": b.communication,
                    "memory_bytes": b.memory,
                }),
            );
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

/// A communication node the partition inserted on rank `rank`'s graph, on the edge between
/// two ops (its `edge:` comment), with the bytes it sends per step.
#[derive(Clone, Debug, PartialEq)]
pub struct CommEdge {
    /// The node's index in the rank's graph.
    pub node: usize,
    /// The collective (`AllReduce`).
    pub op: OpKind,
    /// Its instance name (`mirror_grad_w_AllReduce`).
    pub instance: String,
    /// The producing op of the edge.
    pub from: String,
    /// The reading op of the edge.
    pub to: String,
    /// Bytes this rank sends per step ([`comm_bytes`]).
    pub bytes: f64,
    /// The redistribution rule that inserted it (its `rule:` comment).
    pub rule: String,
    /// Its group (`rank_list`), when it has one.
    pub group: Option<Vec<i64>>,
}

/// Every communication node of a rank's graph that sits on an edge between two ops.
pub fn comm_edges(g: &Graph) -> Vec<CommEdge> {
    let mut out = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        let Some(edge) = n.comments.iter().find(|c| c.starts_with("edge: ")) else {
            continue;
        };
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
        let rule = n
            .comments
            .iter()
            .find(|c| c.starts_with("rule: "))
            .map(|c| c.trim_start_matches("rule: "))
            .unwrap_or("");
        out.push(CommEdge {
            node: i,
            op: n.op,
            instance: n.instance.clone(),
            from: from.to_string(),
            to: to.to_string(),
            bytes: comm_bytes(g, i),
            rule: rule.to_string(),
            group: n.attrs.ints("rank_list"),
        });
    }
    out
}

/// One candidate strategy the search or the propagation weighed for an op.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The strategy (`((2, 1), (1, 4))`, with ` out ...` when it has an out strategy).
    pub strategy: String,
    /// Its communication cost (seconds when `searched`, else bytes-equivalent).
    pub communication: f64,
    /// Its compute cost (same unit).
    pub compute: f64,
    /// Its memory per device, bytes.
    pub memory: f64,
    /// Whether it is the strategy chosen.
    pub chosen: bool,
}

/// Everything `explain` says of one op: the decision the compile recorded
/// (`extra.decisions`), its candidates cheapest first, and the communication around it on
/// one rank. `shardc report` shows the same for every op.
#[derive(Clone, Debug, PartialEq)]
pub struct OpExplanation {
    /// The op's instance name.
    pub name: String,
    /// Its kind (`MatMul`).
    pub kind: String,
    /// Its scope.
    pub scope: String,
    /// The chosen strategy (with ` out ...` when it has an out strategy).
    pub strategy: String,
    /// Where it came from (annotation, default, searched, ...).
    pub source: String,
    /// The device matrix, as JSON text.
    pub dev_matrix: String,
    /// Its inputs' layouts.
    pub inputs: Vec<String>,
    /// Its results' layouts.
    pub outputs: Vec<String>,
    /// Whether the candidates' costs are the search's seconds (else bytes-equivalent).
    pub searched: bool,
    /// The candidates weighed, cheapest first (empty: given, or follows a weight).
    pub candidates: Vec<Candidate>,
    /// The communication around it on the rank.
    pub comms: Vec<CommEdge>,
}

/// The decisions a parallel compile recorded in an artifact (`extra.decisions`), or an error
/// naming the artifact and why it has none.
pub fn decisions_of<'a>(
    art: &'a Artifact,
    dir: &std::path::Path,
) -> Result<&'a Map<String, Value>> {
    match art.manifest.extra.get("decisions") {
        Some(Value::Object(d)) => Ok(d),
        _ => bail!(
            "{}: no parallel decisions recorded (an artifact compiled for {} device{} in mode \
             {}; compile with --device-num N and a parallel mode)",
            dir.display(),
            art.manifest.device_num,
            if art.manifest.device_num == 1 {
                ""
            } else {
                "s"
            },
            art.manifest.parallel_mode
        ),
    }
}

impl OpExplanation {
    /// The explanation of op `name` from its recorded decision `d` and the communication
    /// nodes `comms` of the rank shown (those on an edge from or to the op are kept).
    pub fn of(name: &str, d: &Value, comms: &[CommEdge]) -> OpExplanation {
        let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let strings = |k: &str| -> Vec<String> {
            d.get(k)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|l| l.as_str().unwrap_or("").to_string())
                .collect()
        };
        let strategy = match s("out_strategy") {
            o if o.is_empty() => s("strategy"),
            o => format!("{} out {o}", s("strategy")),
        };
        let searched = d.get("searched").and_then(Value::as_bool).unwrap_or(false);
        let mut candidates: Vec<Candidate> = d
            .get("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                let st = c.get("strategy").and_then(Value::as_str).unwrap_or("");
                Candidate {
                    strategy: st.to_string(),
                    communication: num(&c["communication"]),
                    compute: num(&c["compute"]),
                    memory: num(&c["memory"]),
                    chosen: st == strategy,
                }
            })
            .collect();
        candidates.sort_by(|x, y| {
            (x.compute + x.communication).total_cmp(&(y.compute + y.communication))
        });
        OpExplanation {
            name: name.to_string(),
            kind: s("op"),
            scope: s("scope"),
            strategy,
            source: s("source"),
            dev_matrix: d
                .get("dev_matrix")
                .map(|v| v.to_string())
                .unwrap_or_default(),
            inputs: strings("inputs"),
            outputs: strings("outputs"),
            searched,
            candidates,
            comms: comms
                .iter()
                .filter(|c| c.from == name || c.to == name)
                .cloned()
                .collect(),
        }
    }

    /// The explanation as JSON (what the report page shows when the op is selected), but
    /// its communication, which the report lists once for the whole graph: the candidates
    /// cheapest first as `[strategy, compute, communication, memory, chosen]`, at most
    /// `max_candidates` of them and the chosen one (`more_candidates`: how many were left
    /// out).
    pub fn to_json(&self, max_candidates: usize) -> Value {
        let mut kept: Vec<&Candidate> = self.candidates.iter().take(max_candidates).collect();
        if let Some(c) = self
            .candidates
            .iter()
            .skip(max_candidates)
            .find(|c| c.chosen)
        {
            kept.push(c);
        }
        json!({
            "name": self.name,
            "kind": self.kind,
            "scope": self.scope,
            "strategy": self.strategy,
            "source": self.source,
            "dev_matrix": self.dev_matrix,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "searched": self.searched,
            "candidates": kept.iter().map(|c| json!([
                c.strategy, c.compute, c.communication, c.memory, c.chosen
            ])).collect::<Vec<_>>(),
            "more_candidates": self.candidates.len() - kept.len(),
        })
    }

    /// The explanation as `shardc explain` prints it, communication shown for `rank`.
    pub fn text(&self, rank: u32) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(o, "op {} ({}), scope {}", self.name, self.kind, self.scope);
        let _ = writeln!(o, "  strategy   {}", self.strategy);
        let _ = writeln!(o, "  from       {}", self.source);
        let _ = writeln!(o, "  device matrix {}", self.dev_matrix);
        for (k, l) in self.inputs.iter().enumerate() {
            let _ = writeln!(o, "  input {k}    {l}");
        }
        for (k, l) in self.outputs.iter().enumerate() {
            let _ = writeln!(o, "  result {k}   {l}");
        }
        let chosen = |c: &Candidate| if c.chosen { "   <- chosen" } else { "" };
        if self.candidates.is_empty() {
            let _ = writeln!(
                o,
                "  candidates: none weighed (the strategy was given, or follows a weight)"
            );
        } else if self.searched {
            let _ = writeln!(
                o,
                "  candidates weighed by the search ({}), against the chosen neighbours: step time = compute + communication, and memory per device:",
                self.candidates.len()
            );
            let _ = writeln!(
                o,
                "    {:<28} {:>12} {:>12} {:>14} {:>12}",
                "strategy", "total us", "compute us", "comm. us", "memory KiB"
            );
            for c in &self.candidates {
                let _ = writeln!(
                    o,
                    "    {:<28} {:>12.3} {:>12.3} {:>14.3} {:>12.1}{}",
                    c.strategy,
                    (c.compute + c.communication) * 1e6,
                    c.compute * 1e6,
                    c.communication * 1e6,
                    c.memory / 1024.0,
                    chosen(c)
                );
            }
        } else {
            let _ = writeln!(
                o,
                "  candidates weighed ({}), cost in bytes-equivalent = communication + compute:",
                self.candidates.len()
            );
            for c in &self.candidates {
                let _ = writeln!(
                    o,
                    "    {:<28} {:>12.0} = {:>12.0} + {:>10.0}{}",
                    c.strategy,
                    c.communication + c.compute,
                    c.communication,
                    c.compute,
                    chosen(c)
                );
            }
        }
        let _ = writeln!(o, "  communication around it on rank {rank}:");
        if self.comms.is_empty() {
            let _ = writeln!(
                o,
                "    none: its inputs arrive and its results leave in the layouts they need"
            );
        } else {
            let mut total = 0.0;
            for c in &self.comms {
                total += c.bytes;
                let group = c
                    .group
                    .as_ref()
                    .map(|v| format!(" over {v:?}"))
                    .unwrap_or_default();
                let _ = writeln!(
                    o,
                    "    %{} {} '{}'{group}: {} -> {}, {:.0} bytes/step",
                    c.node + 1,
                    c.op,
                    c.instance,
                    c.from,
                    c.to,
                    c.bytes
                );
                let _ = writeln!(o, "        rule: {}", c.rule);
            }
            let _ = writeln!(o, "    total {total:.0} bytes sent per step by rank {rank}");
        }
        o
    }
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
    let decisions = decisions_of(&art, &a.artifact)?;
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
    let g = &art
        .rank_graph(a.rank as usize)
        .with_context(|| format!("rank {} of the artifact", a.rank))?;
    print!(
        "{}",
        OpExplanation::of(&a.op, d, &comm_edges(g)).text(a.rank)
    );
    Ok(())
}
