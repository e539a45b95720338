//! The oracle: MLIR's `shard-partition` against shardc's partitioner, on the same program
//! and plan (feature `mlir`).
//!
//! [`compare`] takes a forward graph whose ops carry their strategies (`in_strategy`), and a
//! device count. (a) shardc compiles it exactly as `shardc predict` does for N devices
//! (`semi_auto_parallel`, the data inputs split on their batch dimension) and runs every rank's
//! graph on the CPU backend, one thread each, with the in-process communicator. (b) The
//! logical graph with shardc's plan is exported ([`crate::export::logical_module`]), MLIR
//! partitions it ([`crate::mlir::partition`]) and [`crate::eval`] runs MLIR's per-rank
//! program on every rank. Both get the same numbers: the data inputs drawn from a fixed seed,
//! the weights from their initializers, each rank fed its block of every parameter. Every
//! rank's outputs (whole tensors on both sides: shardc returns a forward graph's outputs
//! replicated, the export asks MLIR for them so) must agree within a relative tolerance
//! (the largest difference over the largest magnitude of the tensor). The bytes every
//! collective moves are counted with one formula on both sides ([`crate::eval::collective::bytes`]).

use crate::error::{EvalError, ExportError};
use crate::eval::{self, array::Arr, ir::Elem};
use crate::export::{logical_module, plan_grid};
use crate::mlir::{self as mlirapi, MlirError};
use shardc_backend_cpu::CpuBackend;
use shardc_compiler::pipeline::{self, CompileOptions, ParallelCompiled};
use shardc_ir::{DType, Graph, OpKind, ParamKind};
use shardc_passes::parallel::{DatasetLayout, Mode, ParallelOptions};
use shardc_runtime::{Executor, InProcessWorld, Tensor};
use std::sync::Arc;
use thiserror::Error;

/// Why a comparison could not be made (a failed comparison is an [`OracleReport`]).
#[derive(Debug, Error)]
pub enum OracleError {
    /// shardc could not compile the program for the devices.
    #[error("shardc compile: {0}")]
    Compile(String),
    /// The plan could not be exported.
    #[error("export: {0}")]
    Export(#[from] ExportError),
    /// MLIR could not partition the exported program (or verify it).
    #[error("MLIR: {0}")]
    Mlir(#[from] MlirError),
    /// MLIR's partitioned program does not return what the annotated program asks for.
    #[error("MLIR's partition: {0}")]
    MlirResult(String),
    /// The evaluator could not run MLIR's partitioned program.
    #[error("evaluating MLIR's partition: {0}")]
    Eval(#[from] EvalError),
    /// shardc's ranks failed to run.
    #[error("shardc run: {0}")]
    Run(String),
}

/// One collective of one side: its op and the bytes it moved over all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Moved {
    /// `AllReduce` / `shard.all_reduce`.
    pub op: String,
    /// Its group (shardc: the group size; MLIR: the grid axes).
    pub group: String,
    /// Bytes over all ranks.
    pub bytes: f64,
}

/// The outcome of one comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct OracleReport {
    /// The device count.
    pub devices: usize,
    /// The grid the plan was written on (`2x4`).
    pub grid: String,
    /// The largest relative difference over every rank's every output.
    pub max_rel_diff: f64,
    /// The tolerance it is held to.
    pub tolerance: f64,
    /// Where it was largest, when over the tolerance: rank, output, element and both values.
    pub mismatch: Option<String>,
    /// shardc's collectives (rank graphs), in rank 0's order.
    pub shardc: Vec<Moved>,
    /// MLIR's collectives, in program order.
    pub mlir: Vec<Moved>,
}

impl OracleReport {
    /// Whether the two sides agree within the tolerance.
    pub fn passed(&self) -> bool {
        self.mismatch.is_none()
    }

    /// Bytes shardc's collectives move over all ranks.
    pub fn shardc_bytes(&self) -> f64 {
        self.shardc.iter().map(|m| m.bytes).sum()
    }

    /// Bytes MLIR's collectives move over all ranks.
    pub fn mlir_bytes(&self) -> f64 {
        self.mlir.iter().map(|m| m.bytes).sum()
    }

    /// Which side moves fewer bytes: `shardc`, `MLIR` or `equal`.
    pub fn fewer_bytes(&self) -> &'static str {
        let (s, m) = (self.shardc_bytes(), self.mlir_bytes());
        if (s - m).abs() <= 1e-9 * s.max(m).max(1.0) {
            "equal"
        } else if s < m {
            "shardc"
        } else {
            "MLIR"
        }
    }

    /// One line: agreement, difference and both sides' collectives and bytes.
    pub fn summary(&self) -> String {
        let list = |v: &[Moved]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.iter()
                    .map(|m| format!("{}[{}]", m.op, m.group))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        format!(
            "{} on {} devices (grid {}): max rel diff {:.2e}; shardc {} B ({}), MLIR {} B ({}); fewer: {}{}",
            if self.passed() { "agree" } else { "DISAGREE" },
            self.devices,
            self.grid,
            self.max_rel_diff,
            self.shardc_bytes(),
            list(&self.shardc),
            self.mlir_bytes(),
            list(&self.mlir),
            self.fewer_bytes(),
            self.mismatch
                .as_ref()
                .map(|m| format!("; {m}"))
                .unwrap_or_default()
        )
    }
}

/// A corruption of shardc's rank graphs (rank `r` = element `r`).
pub type RankTamper<'a> = &'a dyn Fn(&mut [Graph]);

/// A corruption of MLIR's partitioned text.
pub type TextTamper<'a> = &'a dyn Fn(&str) -> String;

/// A way of running MLIR's partition on exported text.
pub type Partitioner<'a> = &'a dyn Fn(&str) -> Result<String, MlirError>;

/// What [`compare_with`] lets a caller change: deliberate corruption of either side (tests
/// that show the comparison can fail), and how MLIR's partition is run.
#[derive(Default)]
pub struct Hooks<'a> {
    /// Applied to shardc's rank graphs before they run.
    pub shardc: Option<RankTamper<'a>>,
    /// Applied to MLIR's partitioned text before it is evaluated.
    pub mlir: Option<TextTamper<'a>>,
    /// Runs MLIR's partition instead of [`crate::mlir::partition`] in this process (the
    /// grid runs it in a child process: MLIR 22's `shard-partition` dies of SIGSEGV on some
    /// reshardings, an assertion compiled out of the release build).
    pub partition: Option<Partitioner<'a>>,
    /// The data inputs' layout (`None`: split on the batch, as `shardc predict` does).
    pub dataset: Option<DatasetLayout>,
}

/// Compares shardc's and MLIR's partitions of `graph` on `devices` devices (module doc).
pub fn compare(graph: &Graph, devices: usize, tolerance: f64) -> Result<OracleReport, OracleError> {
    compare_with(graph, devices, tolerance, &Hooks::default())
}

/// [`compare`] with [`Hooks`].
pub fn compare_with(
    graph: &Graph,
    devices: usize,
    tolerance: f64,
    tamper: &Hooks<'_>,
) -> Result<OracleReport, OracleError> {
    let par = compile_parallel(graph, devices, tamper.dataset.clone())?;
    let begin = &par.begin;
    let layouts = &par.assignment.param_layouts;
    // The logical value of every parameter.
    let mut logical: Vec<Tensor> = Vec::with_capacity(begin.params.len());
    for (k, p) in begin.params.iter().enumerate() {
        logical.push(match &p.kind {
            ParamKind::Weight { init, .. } => shardc_runtime::init::init_tensor(init, &p.ty)
                .map_err(|e| OracleError::Run(format!("weight {}: {e}", p.name)))?,
            ParamKind::Input => data(&p.ty.shape, p.ty.dtype, k as u64 + 1)
                .ok_or_else(|| OracleError::Run(format!("input {}: dtype", p.name)))?,
        });
    }
    let block = |k: usize, rank: usize| -> Result<Tensor, OracleError> {
        let l = layouts.get(k).ok_or_else(|| {
            OracleError::Run(format!("parameter {} has no layout", begin.params[k].name))
        })?;
        logical[k].block(&l.block(rank)).ok_or_else(|| {
            OracleError::Run(format!(
                "parameter {}: layout {l} does not fit {:?}",
                begin.params[k].name, logical[k].shape
            ))
        })
    };
    // (a) shardc.
    let mut ranks = par.ranks.clone();
    if let Some(t) = tamper.shardc {
        t(&mut ranks);
    }
    let shardc_moved = shardc_collectives(&ranks);
    let mut feeds: Vec<Vec<(String, Tensor)>> = Vec::with_capacity(devices);
    for (rank, g) in ranks.iter().enumerate() {
        let mut f = Vec::new();
        for p in g.params.iter().filter(|p| p.kind == ParamKind::Input) {
            let k = begin.param_by_name(&p.name).ok_or_else(|| {
                OracleError::Run(format!("rank {rank}: input {} is not logical", p.name))
            })?;
            f.push((p.name.clone(), block(k.index(), rank)?));
        }
        feeds.push(f);
    }
    let shardc_out = run_shardc(ranks, &feeds)?;
    // (b) MLIR.
    let grid = plan_grid(begin, &par.assignment)?;
    let text = logical_module(begin, Some(&par.assignment))?;
    let mut parted = match tamper.partition {
        Some(p) => p(&text)?,
        None => mlirapi::partition(&text)?,
    };
    if let Some(t) = tamper.mlir {
        parted = t(&parted);
    }
    let module = mlirapi::read(&parted)?;
    let mut inputs = Vec::with_capacity(devices);
    for rank in 0..devices {
        let mut ins = Vec::with_capacity(begin.params.len());
        for k in 0..begin.params.len() {
            ins.push(arr(&block(k, rank)?));
        }
        inputs.push(ins);
    }
    let func = module
        .funcs
        .first()
        .map(|f| f.name.clone())
        .ok_or_else(|| EvalError::Program("the partitioned module has no function".into()))?;
    let run = eval::run(&module, &func, &inputs)?;
    let mlir_moved = run
        .collectives
        .iter()
        .map(|c| Moved {
            op: c.op.clone(),
            group: c.grid_axes.clone(),
            bytes: c.bytes,
        })
        .collect();
    // MLIR's partition must return what the export asked for: every output whole.
    for (k, o) in begin.outputs.iter().enumerate() {
        let want = begin.operand_tensor_type(o).map(|t| t.shape.clone());
        for (rank, outs) in run.outputs.iter().enumerate() {
            let got = outs.get(k).map(|a| a.shape.clone());
            if want.is_some() && got != want {
                return Err(OracleError::MlirResult(format!(
                    "rank {rank} output {k}: MLIR's partition returns shape {got:?} where the return is annotated replicated, shape {want:?}"
                )));
            }
        }
    }
    // Compare.
    let mut worst = 0.0f64;
    let mut mismatch = None;
    for (rank, (s, m)) in shardc_out.iter().zip(&run.outputs).enumerate() {
        if s.len() != m.len() {
            mismatch = Some(format!(
                "rank {rank}: shardc returns {} outputs, MLIR {}",
                s.len(),
                m.len()
            ));
            worst = f64::INFINITY;
            continue;
        }
        for (k, (a, b)) in s.iter().zip(m).enumerate() {
            if a.shape != b.shape {
                mismatch = Some(format!(
                    "rank {rank} output {k}: shardc shape {:?}, MLIR {:?}",
                    a.shape, b.shape
                ));
                worst = f64::INFINITY;
                continue;
            }
            let scale = a
                .data
                .iter()
                .chain(&b.data)
                .fold(0.0f64, |m, x| m.max(x.abs()))
                .max(1e-30);
            for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
                let d = (x - y).abs() / scale;
                let d = if d.is_nan() { f64::INFINITY } else { d };
                if d > worst {
                    worst = d;
                    if d > tolerance {
                        mismatch = Some(format!(
                            "rank {rank} output {k} element {i}: shardc {x}, MLIR {y} (relative difference {d:.3e} > {tolerance:e})"
                        ));
                    }
                }
            }
        }
    }
    Ok(OracleReport {
        devices,
        grid: grid.text_shape(),
        max_rel_diff: worst,
        tolerance,
        mismatch,
        shardc: shardc_moved,
        mlir: mlir_moved,
    })
}

/// `graph` (a forward graph with strategies) compiled by shardc for `devices` devices, as
/// `shardc predict` compiles it.
/// `dataset` lays out the data inputs (`None`: split on the batch).
pub fn compile_parallel(
    graph: &Graph,
    devices: usize,
    dataset: Option<DatasetLayout>,
) -> Result<ParallelCompiled, OracleError> {
    let mut model = graph.clone();
    shardc_passes::infer::infer_graph(&mut model)
        .map_err(|e| OracleError::Compile(e.to_string()))?;
    let opts = CompileOptions {
        parallel: Some(ParallelOptions {
            mode: Mode::SemiAutoParallel,
            device_num: devices,
            dataset: dataset.unwrap_or(DatasetLayout::DataParallel),
            gradients_mean: true,
            enable_alltoall: false,
            search: Default::default(),
            parallel_optimizer: None,
        }),
        ..Default::default()
    };
    let compiled =
        pipeline::compile(model, &opts).map_err(|e| OracleError::Compile(e.to_string()))?;
    compiled
        .parallel
        .ok_or_else(|| OracleError::Compile("no per-rank graphs".into()))
}

/// The annotated logical module MLIR partitions in [`compare`]: `graph` with shardc's plan
/// for `devices` devices.
pub fn plan_module(
    graph: &Graph,
    devices: usize,
    dataset: Option<DatasetLayout>,
) -> Result<String, OracleError> {
    let par = compile_parallel(graph, devices, dataset)?;
    Ok(logical_module(&par.begin, Some(&par.assignment))?)
}

/// Deterministic data in [-1, 1) of `shape` (xorshift from `seed`).
fn data(shape: &[usize], dtype: DType, seed: u64) -> Option<Tensor> {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let vals: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    match dtype {
        DType::Float32 => {
            Tensor::from_f32(shape.to_vec(), vals.iter().map(|&v| v as f32).collect())
        }
        DType::Float64 => Tensor::from_f64(shape.to_vec(), vals),
        _ => None,
    }
}

/// A runtime tensor as the evaluator's array.
fn arr(t: &Tensor) -> Arr {
    Arr {
        shape: t.shape.clone(),
        data: t.to_f64_vec(),
        elem: if t.dtype() == DType::Float64 {
            Elem::F64
        } else {
            Elem::F32
        },
    }
}

/// Runs every rank's graph one step on its own thread; every rank's outputs.
fn run_shardc(
    ranks: Vec<Graph>,
    feeds: &[Vec<(String, Tensor)>],
) -> Result<Vec<Vec<Arr>>, OracleError> {
    let comms = InProcessWorld::new(ranks.len());
    let mut execs = Vec::with_capacity(ranks.len());
    for (rank, (g, comm)) in ranks.into_iter().zip(comms).enumerate() {
        execs.push(
            Executor::with_communicator(g, Arc::new(CpuBackend::with_threads(1)), comm)
                .map_err(|e| OracleError::Run(format!("rank {rank}: {e}")))?,
        );
    }
    let results: Vec<Result<Vec<Arr>, OracleError>> = std::thread::scope(|s| {
        let handles: Vec<_> = execs
            .into_iter()
            .zip(feeds)
            .enumerate()
            .map(|(rank, (mut exec, f))| {
                s.spawn(move || -> Result<Vec<Arr>, OracleError> {
                    let refs: Vec<(&str, Tensor)> =
                        f.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                    let out = exec
                        .step(&refs)
                        .map_err(|e| OracleError::Run(format!("rank {rank}: {e}")))?;
                    Ok(out.iter().map(arr).collect())
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join()
                    .map_err(|_| OracleError::Run(format!("rank {rank}: its thread panicked")))
                    .and_then(|r| r)
            })
            .collect()
    });
    results.into_iter().collect()
}

/// shardc's collectives over every rank, bytes by the evaluator's formula; in rank 0's order.
pub fn shardc_collectives(ranks: &[Graph]) -> Vec<Moved> {
    let mut out: Vec<Moved> = Vec::new();
    for g in ranks {
        let mut k = 0;
        for n in &g.nodes {
            let kind = match n.op {
                OpKind::AllReduce => "all_reduce",
                OpKind::AllGather => "all_gather",
                OpKind::ReduceScatter => "reduce_scatter",
                OpKind::AllToAll => "all_to_all",
                OpKind::Broadcast => "broadcast",
                OpKind::Send => "send",
                _ => continue,
            };
            let size = n.attrs.ints("rank_list").map_or(ranks.len(), |l| l.len());
            let input = n
                .inputs
                .first()
                .and_then(|o| g.operand_tensor_type(o))
                .map_or(0, |t| t.size_bytes());
            let b = eval::collective::bytes(kind, size, input, n.ty.size_bytes());
            match out.get_mut(k) {
                Some(m) => m.bytes += b,
                None => out.push(Moved {
                    op: n.op.name().to_string(),
                    group: format!("{size}"),
                    bytes: b,
                }),
            }
            k += 1;
        }
    }
    out
}
