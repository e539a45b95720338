//! `shardc report OUT/ -o report.html`: one self-contained HTML page (inline CSS, script and
//! SVG; nothing fetched when it is viewed) that shows a parallel compilation's plan:
//!
//! - the training step's ops of one rank (forward, backward, update), laid out by
//!   `layout-rs`, each coloured by how it is split, with repeated layers folded
//!   ([`model::fold`]) and the communication on each edge drawn by its bytes per step;
//! - per op the cost model's predicted compute and communication time, and the measured
//!   time beside it when `shardc run --stats` recorded one ([`crate::run_stats`]);
//! - memory per rank ([`memory`]);
//! - selecting an op (a click, or `#op=NAME` in the address) shows what `shardc explain`
//!   says of it ([`crate::explain::OpExplanation`]).
//!
//! `docs/report.md` says how to read the page.

pub mod memory;
pub mod model;
pub mod svg;

use crate::explain::{comm_edges, decisions_of, OpExplanation};
use crate::run_stats::{self, RankTimes};
use anyhow::{bail, Context, Result};
use clap::Args;
use model::{fold, Shown, Split, StepGraph};
use serde_json::{json, Map, Value};
use shardc_ir::artifact::Artifact;
use std::path::{Path, PathBuf};

/// Arguments of `shardc report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The artifact directory written by `shardc compile` with several devices.
    pub artifact: PathBuf,
    /// The HTML file to write.
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
    /// The rank whose graph, communication and measured times to show.
    #[arg(long, default_value_t = 0)]
    pub rank: usize,
    /// Draw every op of every layer (no folding of repeated layers).
    #[arg(long)]
    pub no_fold: bool,
    /// Candidates kept per op (cheapest first, and the chosen one).
    #[arg(long, default_value_t = 12)]
    pub max_candidates: usize,
    /// Materialize every rank for the memory chart up to this many ranks; past it, the
    /// first and last rank of each stage.
    #[arg(long, default_value_t = 64)]
    pub memory_ranks: usize,
}

/// `shardc report`: writes the page and prints where, its size and what it shows.
pub fn report(a: &ReportArgs) -> Result<()> {
    let html = build(a)?;
    write_page(&a.output, &html.html)?;
    println!(
        "wrote {} ({} bytes): {} ops in {} boxes ({} folded), {} edges with communication, \
         memory of {} rank group(s){}",
        a.output.display(),
        html.html.len(),
        html.ops,
        html.boxes,
        html.folded,
        html.comm_edges,
        html.memory_groups,
        if html.measured {
            ", measured times from `run --stats`"
        } else {
            ""
        }
    );
    Ok(())
}

/// Writes `html` to `path` (through a temporary file beside it).
fn write_page(path: &Path, html: &str) -> Result<()> {
    let tmp = path.with_extension("html.tmp");
    std::fs::write(&tmp, html)
        .with_context(|| format!("{}: cannot write the report", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("{}: cannot write the report", path.display()))?;
    Ok(())
}

/// A built page and what it holds.
#[derive(Clone, Debug)]
pub struct Page {
    /// The HTML.
    pub html: String,
    /// Ops of the step.
    pub ops: usize,
    /// Boxes drawn.
    pub boxes: usize,
    /// Folded boxes among them.
    pub folded: usize,
    /// Edges carrying communication.
    pub comm_edges: usize,
    /// Bars of the memory chart.
    pub memory_groups: usize,
    /// Whether measured times were found.
    pub measured: bool,
}

/// Builds the page of the artifact `a.artifact`.
pub fn build(a: &ReportArgs) -> Result<Page> {
    let dir = &a.artifact;
    if !dir.is_dir() {
        bail!(
            "{}: not an artifact directory ({})",
            dir.display(),
            if dir.exists() {
                "a file"
            } else {
                "no such directory"
            }
        );
    }
    let art = Artifact::read(dir)?;
    let decisions = decisions_of(&art, dir)?;
    let n = art.device_num();
    if n < 2 {
        bail!(
            "{}: compiled for {n} device; a report shows a plan over several devices \
             (compile with --device-num N)",
            dir.display()
        );
    }
    if a.rank >= n {
        bail!(
            "--rank {}: the artifact {} has ranks 0 to {}",
            a.rank,
            dir.display(),
            n - 1
        );
    }
    let g = art
        .rank_graph(a.rank)
        .with_context(|| format!("rank {} of {}", a.rank, dir.display()))?;
    let comms = comm_edges(&g);
    let step = StepGraph::of(&g, decisions, comms);
    let folded = fold(&step, !a.no_fold);
    let (svg, edges) = svg::draw(&step, &folded)?;
    let times = run_stats::read_all(dir)?;
    let measured = times.get(&a.rank);
    let (groups, measured_ranks) = memory::rank_memory(&art, a.memory_ranks)?;
    let data = page_data(
        a,
        &art,
        &step,
        &folded,
        &edges,
        decisions,
        measured,
        &groups,
        &measured_ranks,
    );
    let mut json = serde_json::to_string(&data)?;
    // Inside <script>: no `</script>` can close it early.
    json = json.replace("</", "<\\/");
    let html = render_html(&art, &svg, &json);
    Ok(Page {
        html,
        ops: step.ops.len(),
        boxes: folded.shown.len(),
        folded: folded
            .shown
            .iter()
            .filter(|b| matches!(b, Shown::Folded(_)))
            .count(),
        comm_edges: edges.iter().filter(|e| !e.comms.is_empty()).count(),
        memory_groups: groups.len(),
        measured: measured.is_some(),
    })
}

/// A group as `[0, 8, 16, …, 504] (64 ranks)`.
fn group_text(group: &Option<Vec<i64>>) -> String {
    let Some(v) = group else {
        return String::new();
    };
    if v.len() <= 8 {
        return format!("{v:?} ({} ranks)", v.len());
    }
    let head: Vec<String> = v.iter().take(4).map(|x| x.to_string()).collect();
    format!(
        "[{}, …, {}] ({} ranks)",
        head.join(", "),
        v.last().map_or(String::new(), |x| x.to_string()),
        v.len()
    )
}

/// The page's data: what the script shows on selection.
#[allow(clippy::too_many_arguments)]
fn page_data(
    a: &ReportArgs,
    art: &Artifact,
    step: &StepGraph,
    folded: &model::Folded,
    edges: &[model::BoxEdge],
    decisions: &Map<String, Value>,
    measured: Option<&RankTimes>,
    groups: &[memory::MemoryGroup],
    measured_ranks: &[usize],
) -> Value {
    let time_of = |name: &str| {
        measured
            .and_then(|t| t.nodes.get(name))
            .map(|t| t.seconds_per_step)
    };
    let comms: Vec<Value> = step
        .comms
        .iter()
        .map(|c| {
            json!({
                "op": c.op.name(),
                "instance": c.instance,
                "from": c.from,
                "to": c.to,
                "bytes": c.bytes,
                "rule": c.rule,
                "group": group_text(&c.group),
                "measured": time_of(&c.instance),
            })
        })
        .collect();
    let mut ops = Map::new();
    for (k, op) in step.ops.iter().enumerate() {
        let Some(d) = decisions.get(&op.name) else {
            continue;
        };
        let e = OpExplanation::of(&op.name, d, &[]);
        let mut v = e.to_json(a.max_candidates);
        let comm_ids: Vec<usize> = step
            .comms
            .iter()
            .enumerate()
            .filter(|(_, c)| c.from == op.name || c.to == op.name)
            .map(|(i, _)| i)
            .collect();
        if let Some(m) = v.as_object_mut() {
            m.insert("box".into(), json!(folded.box_of[k]));
            m.insert("split".into(), json!(op.split.class()));
            m.insert("phase".into(), json!(op.phase.name()));
            m.insert("layer".into(), json!(op.layer));
            m.insert("comms".into(), json!(comm_ids));
            m.insert(
                "predicted".into(),
                d.get("predicted").cloned().unwrap_or(Value::Null),
            );
            m.insert("measured".into(), json!(time_of(&op.name)));
        }
        ops.insert(op.name.clone(), v);
    }
    let boxes: Vec<Value> = folded
        .shown
        .iter()
        .map(|b| match b {
            Shown::Op(k) => json!({"op": step.ops[*k].name}),
            Shown::Folded(f) => json!({
                "label": f.label(step.cell.as_ref()),
                "layers": [f.layers.0, f.layers.1],
                "updates": matches!(f.kind, model::FoldKind::Updates(_)),
                "phase": f.phase.name(),
                "split": f.split.class(),
                "ops": f.ops.iter().map(|&k| step.ops[k].name.as_str()).collect::<Vec<_>>(),
            }),
        })
        .collect();
    let edges: Vec<Value> = edges
        .iter()
        .map(|e| json!({"from": e.from, "to": e.to, "comms": e.comms, "label": e.label(step)}))
        .collect();
    let memory: Vec<Value> = groups
        .iter()
        .map(|g| {
            json!({
                "ranks": [g.ranks.0, g.ranks.1],
                "stage": g.stage,
                "weights": g.memory.weights,
                "optimizer_state": g.memory.optimizer_state,
                "activations_peak": g.memory.activations_peak,
                "inputs": g.memory.inputs,
            })
        })
        .collect();
    json!({
        "model": art.manifest.model,
        "device_num": art.device_num(),
        "parallel_mode": art.manifest.parallel_mode,
        "stages": art.program.stage_count(),
        "rank": a.rank,
        "search": art.manifest.extra.get("search").cloned().unwrap_or(Value::Null),
        "cell": step.cell.as_ref().map(|c| c.name()),
        "legend": Split::ALL.iter().map(|s| json!([s.class(), s.name(), s.colour()])).collect::<Vec<_>>(),
        "ops": ops,
        "boxes": boxes,
        "edges": edges,
        "comms": comms,
        "memory": memory,
        "memory_ranks": measured_ranks,
        "measured": measured.map(|t| json!({"rank": t.rank, "steps": t.steps})),
    })
}

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The page: the header, the legend, the graph, the detail panel and the memory chart
/// (filled in by the script from the data).
fn render_html(art: &Artifact, svg: &str, json: &str) -> String {
    let legend: String = Split::ALL
        .iter()
        .map(|s| {
            format!(
                "<span class=\"key\"><i style=\"background:{}\"></i>{}</span>",
                s.colour(),
                esc(s.name())
            )
        })
        .collect();
    let title = format!(
        "{} on {} devices ({})",
        art.manifest.model,
        art.device_num(),
        art.manifest.parallel_mode
    );
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>shardc report: {title}</title><style>{css}</style></head><body>\
         <header><h1>shardc report: {title}</h1><div id=\"summary\"></div>\
         <div class=\"legend\">{legend}<span class=\"key\"><i class=\"edgekey\"></i>\
         communication per step (width: bytes)</span></div></header>\
         <main><section id=\"graphpane\"><div id=\"zoom\"><button id=\"zoomout\">−</button>\
         <button id=\"zoomfit\">fit</button><button id=\"zoomin\">+</button></div>\
         <div id=\"graphwrap\">{svg}</div></section>\
         <aside id=\"detail\"><p class=\"hint\">Select an op (click a box) to see its plan.</p>\
         </aside></main><section id=\"memory\"><h2>Memory per rank</h2><div id=\"memchart\">\
         </div></section>\
         <script type=\"application/json\" id=\"data\">{json}</script>\
         <script>{js}</script></body></html>\n",
        title = esc(&title),
        css = include_str!("page.css"),
        js = include_str!("page.js"),
    )
}

#[cfg(test)]
mod tests;
