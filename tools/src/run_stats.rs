//! The per-node times `shardc run --stats` measures, written into the artifact
//! (`ART/stats/rank_R.json`) for `shardc report` to show beside the cost model's predictions.
//!
//! A file holds one rank's run: the steps it ran and, per node instance name, the calls and
//! the mean seconds per step. A node's time is its kernel (or copy, or collective) on the
//! executor's main thread; a gradient bucket's AllReduce runs on the communication thread and
//! is counted for the bucket, not per node (its members show their packing only).

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use shardc_ir::Graph;
use shardc_runtime::executor::ExecStats;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folder of an artifact that holds the measured times.
pub const STATS_DIR: &str = "stats";

/// One node's measured time.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTime {
    /// Calls, all steps together.
    pub calls: u64,
    /// Mean seconds per step.
    pub seconds_per_step: f64,
}

/// One rank's measured times.
#[derive(Clone, Debug, PartialEq)]
pub struct RankTimes {
    /// The rank.
    pub rank: usize,
    /// Steps measured.
    pub steps: u64,
    /// Per node instance name.
    pub nodes: BTreeMap<String, NodeTime>,
}

/// The file of `rank`'s times in the artifact `dir`.
pub fn stats_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(STATS_DIR).join(format!("rank_{rank}.json"))
}

/// Writes `rank`'s per-node times (`stats` of an executor that ran `graph`) into the
/// artifact `dir`; returns the file written.
pub fn write_rank_times(
    dir: &Path,
    rank: usize,
    graph: &Graph,
    stats: &ExecStats,
) -> Result<PathBuf> {
    let steps = stats.steps.max(1) as f64;
    let mut nodes = Map::new();
    for (n, s) in graph.nodes.iter().zip(&stats.per_node) {
        if s.count == 0 && s.time.is_zero() {
            continue;
        }
        nodes.insert(
            n.instance.clone(),
            json!({"calls": s.count, "seconds_per_step": s.time.as_secs_f64() / steps}),
        );
    }
    let v = json!({"rank": rank, "steps": stats.steps, "nodes": nodes});
    let path = stats_path(dir, rank);
    let folder = dir.join(STATS_DIR);
    std::fs::create_dir_all(&folder)
        .with_context(|| format!("{}: cannot create", folder.display()))?;
    let tmp = folder.join(format!(".rank_{rank}.json.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&v)?)
        .with_context(|| format!("{}: cannot write", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(path)
}

/// [`write_rank_times`] for `shardc run --stats`: a failure (a read-only artifact) is a
/// warning on stderr, not the run's failure; the printed statistics stand either way.
pub fn record(dir: &Path, rank: usize, graph: &Graph, stats: &ExecStats) {
    if let Err(e) = write_rank_times(dir, rank, graph, stats) {
        eprintln!(
            "warning: rank {rank}'s measured times were not recorded for `shardc report`: {e:#}"
        );
    }
}

/// Reads one rank's times file.
pub fn read_rank_times(path: &Path) -> Result<RankTimes> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not JSON measured times", path.display()))?;
    let bad = |what: &str| anyhow::anyhow!("{}: measured times without {what}", path.display());
    let rank = v
        .get("rank")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("a \"rank\" number"))? as usize;
    let steps = v
        .get("steps")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("a \"steps\" number"))?;
    let Some(Value::Object(m)) = v.get("nodes") else {
        return Err(bad("a \"nodes\" object"));
    };
    let mut nodes = BTreeMap::new();
    for (k, n) in m {
        let (Some(calls), Some(sec)) = (
            n.get("calls").and_then(Value::as_u64),
            n.get("seconds_per_step").and_then(Value::as_f64),
        ) else {
            bail!(
                "{}: node {k:?} has no \"calls\" and \"seconds_per_step\" numbers",
                path.display()
            );
        };
        if !sec.is_finite() || sec < 0.0 {
            bail!(
                "{}: node {k:?} has {sec} seconds per step, not a time",
                path.display()
            );
        }
        nodes.insert(
            k.clone(),
            NodeTime {
                calls,
                seconds_per_step: sec,
            },
        );
    }
    Ok(RankTimes { rank, steps, nodes })
}

/// Every rank's times found in the artifact `dir` (none when `run --stats` never ran), by
/// rank.
pub fn read_all(dir: &Path) -> Result<BTreeMap<usize, RankTimes>> {
    let folder = dir.join(STATS_DIR);
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(&folder) else {
        return Ok(out);
    };
    for e in entries {
        let e = e.with_context(|| format!("{}: cannot list", folder.display()))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !(name.starts_with("rank_") && name.ends_with(".json")) {
            continue;
        }
        let t = read_rank_times(&e.path())?;
        out.insert(t.rank, t);
    }
    Ok(out)
}
