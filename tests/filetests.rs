//! Golden IR tests, in the spirit of Cranelift's filetests and MLIR's lit tests.
//!
//! Each `tests/filetests/**/*.ir` file starts with directive lines beginning with `;`, then a
//! graph in the text IR:
//!
//! ```text
//! ; test: train momentum lr=0.2 momentum=0.1
//! ; CHECK: ApplyMomentum
//! ; CHECK-NEXT: ...
//! ; CHECK-NOT: AllReduce
//! ; error: expected message fragment
//! ;; a comment
//! ```
//!
//! `test:` names what to run on the parsed graph. The pipeline's stages run through the
//! production pipeline (`compiler::pipeline::compile_until`, its verifier on after every
//! pass), stopped after the stage whose result is printed:
//! - `parse`: print the parsed graph back (the parser's own dump);
//! - `infer`: the pipeline to `infer_types` (types filled by the shape rules), printed;
//! - `verify`: the pipeline to `infer_types`, which verifies its input: prints `ok` or the
//!   error;
//! - `train OPT [lr=..] [momentum=..]`: the pipeline to `autodiff`, the whole training step
//!   (`momentum`, `sgd`, `adam`);
//! - `recompute OPT [lr=..] [momentum=..]`: the pipeline to `recompute`, the training step
//!   with the nodes marked `recompute: true` replayed in the backward pass;
//! - `strategy device_num=N mode=MODE [dataset=..] [gradients_mean=..] [alltoall]`: the
//!   pipeline to `step_parallel_begin` on the training step (Momentum lr 0.2, momentum 0.1):
//!   every op's strategy and its source, the `step_parallel_begin` dump (MODE:
//!   `data_parallel`, `semi_auto_parallel`, `auto_parallel`; dataset: `data_parallel`,
//!   `full_batch`; `parallel_optimizer_threshold=KB`, `optimizer_weight_shard_size=N` and
//!   `gradient_accumulation_shard=BOOL` turn the parallel optimizer on; `search=` one of `sharding_propagation`, `recursive_programming`,
//!   `dynamic_programming`, `ilp`, with `device=PRESET` and `max_device_memory=BYTES` for the
//!   cost model);
//! - `partition device_num=N mode=MODE rank=R [...]`: the pipeline to `step_parallel_end`,
//!   rank R's graph (its `step_parallel_end` dump).
//! - `micro_batch micro_size=M`: the pipeline to `micro_batch` (one device), the forward
//!   with its micro-batches;
//! - `pipeline_split device_num=N mode=MODE stages=S micro_size=M [scheduler=gpipe] rank=R
//!   [...]`: the pipeline to `pipeline_split`, rank R's stage graph (its `pipeline_split`
//!   dump; with `stages=1` the program with its gradient accumulation reduced once).
//!
//! Two commands run one pass on a hand-written input, as Cranelift's filetests do:
//! - `autodiff`: `passes::autodiff::gradients`, the gradient graph of the loss w.r.t. every
//!   trainable weight;
//! - `grad_fusion auto|none|size:MB|index:I,J`: `passes::grad_fusion` on a per-rank graph
//!   (a `step_parallel_end` dump): gradient AllReduces hoisted and bucketed;
//!
//! The output is compared with `NAME.expected` beside the file when that exists (exact text),
//! and with the `CHECK` lines in order (`CHECK`, `CHECK-NEXT`, `CHECK-NOT`), FileCheck-style.
//! A test with `; error: TEXT` expects the pipeline to fail with a message containing TEXT.
//! `SHARDC_BLESS=1 cargo nextest run --test filetests` rewrites the `.expected` files (and
//! creates them for tests with neither expectations nor checks) and prints what changed.

use shardc::compiler::pipeline::{compile_until, CompileOptions, CompileState};
use shardc::ir::text::{parse_graph, print_graph};
use shardc::ir::Graph;
use shardc::passes::autodiff::{self, Optimizer};
use shardc::passes::{infer, verify};
use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|e| e == "ir") {
            out.push(p);
        }
    }
}

fn parse_optimizer(words: &[&str]) -> Result<Optimizer, String> {
    let mut lr = 0.01;
    let mut momentum = 0.9;
    for w in words.iter().skip(1) {
        let (k, v) = w.split_once('=').ok_or(format!("bad option {w}"))?;
        let v: f64 = v.parse().map_err(|_| format!("bad number in {w}"))?;
        match k {
            "lr" => lr = v,
            "momentum" => momentum = v,
            _ => return Err(format!("unknown option {k}")),
        }
    }
    Ok(match words.first().copied() {
        Some("momentum") | None => Optimizer::Momentum {
            learning_rate: lr,
            momentum,
            use_nesterov: false,
        },
        Some("sgd") => Optimizer::Sgd {
            learning_rate: lr,
            momentum,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        },
        Some("adam") => Optimizer::Adam {
            learning_rate: lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        },
        Some(o) => return Err(format!("unknown optimizer {o}")),
    })
}

/// The production pipeline on `g` up to the pass `last`, its verifier on.
fn pipeline_until(g: Graph, opts: CompileOptions, last: &str) -> Result<CompileState, String> {
    let opts = CompileOptions {
        verify: true,
        ..opts
    };
    compile_until(g, &opts, last)
        .map(|(state, _)| state)
        .map_err(|e| e.to_string())
}

/// Runs the test's command; `Err` carries the error text of a failing pass.
fn run_command(command: &str, src: &str, file: &str) -> Result<String, String> {
    let g = parse_graph(src, file).map_err(|e| e.to_string())?;
    let words: Vec<&str> = command.split_whitespace().collect();
    let (&what, rest) = words.split_first().ok_or("empty test: line")?;
    match what {
        "parse" => Ok(print_graph(&g)),
        "infer" => {
            let s = pipeline_until(g, CompileOptions::default(), "infer_types")?;
            Ok(print_graph(&s.graph))
        }
        "verify" => {
            pipeline_until(g, CompileOptions::default(), "infer_types").map(|_| "ok\n".into())
        }
        "train" => {
            let opts = CompileOptions {
                optimizer: Some(parse_optimizer(rest)?),
                ..Default::default()
            };
            let s = pipeline_until(g, opts, "autodiff")?;
            Ok(print_graph(&s.graph))
        }
        "strategy" | "partition" | "pipeline_split" => run_parallel(what, rest, g),
        "micro_batch" => {
            let mut pipeline = shardc::passes::pipeline::PipelineOptions::default();
            for w in rest {
                match w.split_once('=') {
                    Some(("micro_size", v)) => {
                        pipeline.micro_size = v.parse().map_err(|_| format!("bad {w}"))?
                    }
                    _ => return Err(format!("bad option {w}")),
                }
            }
            let opts = CompileOptions {
                pipeline,
                ..Default::default()
            };
            let s = pipeline_until(g, opts, "micro_batch")?;
            Ok(print_graph(&s.graph))
        }
        "recompute" => {
            let opts = CompileOptions {
                optimizer: Some(parse_optimizer(rest)?),
                ..Default::default()
            };
            let s = pipeline_until(g, opts, "recompute")?;
            Ok(print_graph(&s.graph))
        }
        "autodiff" => {
            let g = pipeline_until(g, CompileOptions::default(), "infer_types")?.graph;
            let (grad, _) = autodiff::gradients(&g).map_err(|e| e.to_string())?;
            verify::verify(&grad).map_err(|e| e.to_string())?;
            Ok(print_graph(&grad))
        }
        "grad_fusion" => {
            use shardc::passes::grad_fusion::{fuse, GradFusion};
            let mut g = g;
            infer::infer_graph(&mut g).map_err(|e| e.to_string())?;
            verify::verify(&g).map_err(|e| e.to_string())?;
            let mode = match rest {
                ["auto"] => GradFusion::Auto,
                ["none"] => GradFusion::Each,
                [w] if w.starts_with("size:") => {
                    GradFusion::SizeMb(w[5..].parse().map_err(|_| format!("bad size in {w}"))?)
                }
                [w] if w.starts_with("index:") => GradFusion::Index(
                    w[6..]
                        .split(',')
                        .map(|x| x.parse().map_err(|_| format!("bad index in {w}")))
                        .collect::<Result<_, String>>()?,
                ),
                _ => {
                    return Err(format!(
                        "grad_fusion needs auto, none, size:MB or index:I,J; got {rest:?}"
                    ))
                }
            };
            let (out, _) = fuse(&g, &mode).map_err(|e| e.to_string())?;
            verify::verify(&out).map_err(|e| e.to_string())?;
            Ok(print_graph(&out))
        }
        other => Err(format!("unknown test command '{other}'")),
    }
}

/// `strategy ...` / `partition ...`: the pipeline to `step_parallel_begin` (the annotated
/// graph) or `step_parallel_end` (rank R's graph).
fn run_parallel(what: &str, words: &[&str], g: Graph) -> Result<String, String> {
    use shardc::passes::parallel::{DatasetLayout, Mode, ParallelOptions, SearchMode};
    let mut opts = ParallelOptions {
        mode: Mode::SemiAutoParallel,
        device_num: 1,
        dataset: DatasetLayout::DataParallel,
        gradients_mean: true,
        enable_alltoall: false,
        search: Default::default(),
        parallel_optimizer: None,
    };
    let mut rank = 0usize;
    let mut pipeline = shardc::passes::pipeline::PipelineOptions::default();
    for w in words {
        if *w == "alltoall" {
            opts.enable_alltoall = true;
            continue;
        }
        let (k, v) = w.split_once('=').ok_or(format!("bad option {w}"))?;
        match k {
            "device_num" => opts.device_num = v.parse().map_err(|_| format!("bad {w}"))?,
            "rank" => rank = v.parse().map_err(|_| format!("bad {w}"))?,
            "stages" => pipeline.stages = v.parse().map_err(|_| format!("bad {w}"))?,
            "micro_size" => pipeline.micro_size = v.parse().map_err(|_| format!("bad {w}"))?,
            "scheduler" => {
                pipeline.scheduler = shardc::passes::pipeline::Scheduler::from_name(v)
                    .ok_or(format!("unknown scheduler {v}"))?
            }
            "gradients_mean" => opts.gradients_mean = v == "true",
            "mode" => {
                opts.mode = match v {
                    "data_parallel" => Mode::DataParallel,
                    "semi_auto_parallel" => Mode::SemiAutoParallel,
                    "auto_parallel" => Mode::AutoParallel,
                    _ => return Err(format!("unknown mode {v}")),
                }
            }
            "search" => {
                opts.search.mode = match v {
                    "sharding_propagation" => SearchMode::ShardingPropagation,
                    "recursive_programming" => SearchMode::RecursiveProgramming,
                    "dynamic_programming" => SearchMode::DynamicProgramming,
                    "ilp" => SearchMode::Ilp,
                    _ => return Err(format!("unknown search mode {v}")),
                }
            }
            "device" => {
                opts.search.machine = shardc::compiler::device::DeviceDescription::preset(v)
                    .map_err(|e| e.to_string())?
                    .machine();
            }
            "max_device_memory" => {
                opts.search.max_device_memory = Some(v.parse().map_err(|_| format!("bad {w}"))?);
            }
            // The parallel optimizer on, weights from this many KB split.
            "parallel_optimizer_threshold" => {
                let po = opts.parallel_optimizer.get_or_insert_default();
                po.threshold_kb = v.parse().map_err(|_| format!("bad {w}"))?;
            }
            "gradient_accumulation_shard" => {
                let po = opts.parallel_optimizer.get_or_insert_default();
                po.gradient_accumulation_shard = v == "true";
            }
            "optimizer_weight_shard_size" => {
                let po = opts.parallel_optimizer.get_or_insert_default();
                po.weight_shard_size = Some(v.parse().map_err(|_| format!("bad {w}"))?);
            }
            "dataset" => {
                opts.dataset = match v {
                    "data_parallel" => DatasetLayout::DataParallel,
                    "full_batch" => DatasetLayout::FullBatch,
                    _ => return Err(format!("unknown dataset strategy {v}")),
                }
            }
            _ => return Err(format!("unknown option {k}")),
        }
    }
    if opts.device_num < 2 {
        return Err(format!("{what} needs device_num=N with N >= 2"));
    }
    let compile = CompileOptions {
        optimizer: Some(Optimizer::Momentum {
            learning_rate: 0.2,
            momentum: 0.1,
            use_nesterov: false,
        }),
        parallel: Some(opts),
        pipeline,
        ..Default::default()
    };
    if what == "pipeline_split" {
        let s = pipeline_until(g, compile, "pipeline_split")?;
        let program = s.unfused.as_ref().ok_or("no pipeline_split program")?;
        let rg = program.materialize(rank).map_err(|e| e.to_string())?;
        verify::verify(&rg).map_err(|e| e.to_string())?;
        return Ok(print_graph(&rg));
    }
    if what == "strategy" {
        let s = pipeline_until(g, compile, "step_parallel_begin")?;
        return Ok(print_graph(
            s.begin.as_ref().ok_or("no step_parallel_begin graph")?,
        ));
    }
    let s = pipeline_until(g, compile, "step_parallel_end")?;
    let program = s.unfused.as_ref().ok_or("no step_parallel_end program")?;
    let rg = program.materialize(rank).map_err(|e| e.to_string())?;
    verify::verify(&rg).map_err(|e| e.to_string())?;
    Ok(print_graph(&rg))
}

/// FileCheck-style matching of `checks` against `output`.
fn file_check(checks: &[(String, String)], output: &str) -> Result<(), String> {
    let lines: Vec<&str> = output.lines().collect();
    let mut pos = 0usize; // next line to search from
    let mut last: Option<usize> = None;
    let mut nots: Vec<&str> = Vec::new();
    for (kind, pat) in checks {
        match kind.as_str() {
            "CHECK-NOT" => nots.push(pat),
            "CHECK" | "CHECK-NEXT" => {
                let found = if kind == "CHECK-NEXT" {
                    let want = last.map_or(0, |l| l + 1);
                    (lines.get(want).is_some_and(|l| l.contains(pat.as_str()))).then_some(want)
                } else {
                    (pos..lines.len()).find(|&i| lines[i].contains(pat.as_str()))
                };
                let Some(i) = found else {
                    return Err(format!("{kind}: '{pat}' not found after line {pos}"));
                };
                for n in nots.drain(..) {
                    if let Some(j) = (pos..i).find(|&j| lines[j].contains(n)) {
                        return Err(format!(
                            "CHECK-NOT: '{n}' found at line {}: {}",
                            j + 1,
                            lines[j]
                        ));
                    }
                }
                last = Some(i);
                pos = i + 1;
            }
            other => return Err(format!("unknown directive {other}")),
        }
    }
    for n in nots {
        if let Some(j) = (pos..lines.len()).find(|&j| lines[j].contains(n)) {
            return Err(format!(
                "CHECK-NOT: '{n}' found at line {}: {}",
                j + 1,
                lines[j]
            ));
        }
    }
    Ok(())
}

fn diff(expected: &str, got: &str) -> String {
    let e: Vec<&str> = expected.lines().collect();
    let g: Vec<&str> = got.lines().collect();
    let mut out = String::new();
    for i in 0..e.len().max(g.len()) {
        match (e.get(i), g.get(i)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => {
                if let Some(a) = a {
                    out.push_str(&format!("-{:4}: {a}\n", i + 1));
                }
                if let Some(b) = b {
                    out.push_str(&format!("+{:4}: {b}\n", i + 1));
                }
            }
        }
    }
    out
}

fn run_file(path: &Path, bless: bool) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut command = None;
    let mut checks = Vec::new();
    let mut error = None;
    let mut body = String::new();
    for line in text.lines() {
        if line.starts_with(";;") {
            body.push('\n'); // a comment; keep line numbers of the IR part
        } else if let Some(d) = line.strip_prefix(';') {
            let d = d.trim();
            let (k, v) = d.split_once(':').unwrap_or((d, ""));
            let v = v.trim().to_string();
            match k.trim() {
                "test" => command = Some(v),
                "error" => error = Some(v),
                k if k.starts_with("CHECK") => checks.push((k.to_string(), v)),
                other => return Err(format!("unknown directive '; {other}:'")),
            }
            body.push('\n'); // keep line numbers of the IR part
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    let command = command.ok_or("missing '; test:' line")?;
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let result = run_command(&command, &body, &file);
    match (error, result) {
        (Some(want), Err(got)) => {
            if got.contains(&want) {
                Ok(())
            } else {
                Err(format!("expected an error containing '{want}', got: {got}"))
            }
        }
        (Some(want), Ok(_)) => Err(format!(
            "expected an error containing '{want}', but it succeeded"
        )),
        (None, Err(e)) => Err(format!("failed: {e}")),
        (None, Ok(out)) => {
            file_check(&checks, &out)?;
            let exp_path = path.with_extension("expected");
            match std::fs::read_to_string(&exp_path) {
                Ok(exp) if exp == out => Ok(()),
                Ok(exp) if bless => {
                    eprintln!("blessed {}:\n{}", exp_path.display(), diff(&exp, &out));
                    std::fs::write(&exp_path, &out).map_err(|e| e.to_string())
                }
                Ok(exp) => Err(format!(
                    "output differs from {} (SHARDC_BLESS=1 to accept):\n{}",
                    exp_path.display(),
                    diff(&exp, &out)
                )),
                Err(_) if bless || checks.is_empty() => {
                    if !bless {
                        return Err(format!(
                            "no {} and no CHECK lines: run with SHARDC_BLESS=1 to create it",
                            exp_path.display()
                        ));
                    }
                    eprintln!("created {}", exp_path.display());
                    std::fs::write(&exp_path, &out).map_err(|e| e.to_string())
                }
                Err(_) => Ok(()),
            }
        }
    }
}

#[test]
fn golden_ir_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut files = Vec::new();
    collect(&root, &mut files);
    assert!(!files.is_empty(), "no filetests under {}", root.display());
    let bless = std::env::var("SHARDC_BLESS").is_ok_and(|v| v == "1");
    let mut failures = Vec::new();
    for f in &files {
        if let Err(e) = run_file(f, bless) {
            failures.push(format!("{}: {e}", f.display()));
        }
    }
    eprintln!("{} filetests, {} failed", files.len(), failures.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn file_check_semantics() {
    let out = "a\nb\nc\n";
    let c = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert!(file_check(&[c("CHECK", "a"), c("CHECK-NEXT", "b")], out).is_ok());
    assert!(file_check(&[c("CHECK", "a"), c("CHECK-NEXT", "c")], out).is_err());
    assert!(file_check(&[c("CHECK", "b"), c("CHECK", "a")], out).is_err());
    assert!(file_check(
        &[c("CHECK", "a"), c("CHECK-NOT", "b"), c("CHECK", "c")],
        out
    )
    .is_err());
    assert!(file_check(&[c("CHECK-NOT", "z")], out).is_ok());
}
