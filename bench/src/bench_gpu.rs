//! `shardc bench gpu`: the CUDA backend against PyTorch on the same GPU, in one invocation.
//!
//! GEMM: cuBLAS through shardc's device (f32 with TF32 off, TF32, BF16) at 1024–8192 against
//! `torch.matmul` (goal: ≥ 95 % of PyTorch's TFLOP/s). Training steps: the MLP, ResNet-18
//! (CIFAR shapes) and the 2-layer transformer on [`GpuExecutor`] against PyTorch eager and
//! `torch.compile` (`bench/gpu/reference.py`; goal: ≤ 1.0× eager), in `--rounds` rounds of
//! both sides, alternating (3 by default, 1 with `--quick`), each side's figure its best
//! round's median. Each line prints both figures and the ratio, and in parentheses shardc's step without graph replay (every
//! kernel launched by the host, as PyTorch eager does); the GPU's name heads the output.
//! Where convolutions go through cuDNN, ResNet-18's rows compare like with like: shardc's
//! default keeps to cuDNN's deterministic algorithms (`resnet18 =`), against PyTorch eager with
//! `torch.backends.cudnn.deterministic = True`; with non-deterministic algorithms allowed
//! (`resnet18 *`) against PyTorch's default; and with im2col + cuBLAS instead of cuDNN
//! (`resnet18 +`) against PyTorch's default too. `--models mlp,resnet18` (either or both)
//! limits the training rows to those models. With `--stats`, each model's
//! measured steps are followed by a few profiled ones: the GPU time per op kind. Needs a GPU
//! (`shardc gpu info`).

use crate::args::{BenchArgs, TrainModel};
use crate::reference::{bench_dir, reference_python};
use anyhow::{anyhow, bail, Context, Result};
use shardc_backend_cpu::CpuBackend;
use shardc_backend_cuda::cuda::{CudaDevice, GemmPrecision};
use shardc_backend_cuda::{Device, GpuExecutor};
use shardc_compiler::pipeline::{compile, CompileOptions};
use shardc_compiler::transformer::{transformer, TransformerConfig};
use shardc_ir::Graph;
use shardc_passes::autodiff::Optimizer;
use shardc_runtime::data::synthetic::SyntheticData;
use shardc_runtime::Tensor;
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

/// The transformer of the GPU benchmark (as `bench/gpu/reference.py` builds it).
fn transformer_step() -> Result<Graph> {
    let g = transformer(&TransformerConfig::new(2, 256, 4, 128, 8))?;
    let opts = CompileOptions {
        optimizer: Some(Optimizer::Momentum {
            learning_rate: 0.01,
            momentum: 0.9,
            use_nesterov: false,
        }),
        ..Default::default()
    };
    Ok(compile(g, &opts)?.graph)
}

/// `ref=torch ...` lines of the reference, as field maps.
fn reference(args: &BenchArgs, sub: &[&str]) -> Result<Vec<HashMap<String, String>>> {
    let dir = bench_dir(args)?;
    let python = reference_python(args, &dir);
    if args.python.is_none() && !python.is_file() {
        bail!(
            "{} is missing: run {} (PyTorch with CUDA), pass --python with an interpreter that has \
             PyTorch, or pass --no-reference",
            python.display(),
            dir.join("setup_venv.sh").display()
        );
    }
    let out = Command::new(&python)
        .arg(dir.join("gpu/reference.py"))
        .args(sub)
        .output()
        .with_context(|| format!("running {}", dir.join("gpu/reference.py").display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "bench/gpu/reference.py failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text
        .lines()
        .filter(|l| l.starts_with("ref="))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect())
}

fn field(lines: &[HashMap<String, String>], want: &[(&str, &str)], key: &str) -> Option<f64> {
    lines
        .iter()
        .find(|m| {
            want.iter()
                .all(|(k, v)| m.get(*k).map(String::as_str) == Some(*v))
        })
        .and_then(|m| m.get(key))
        .and_then(|v| v.parse().ok())
}

/// The median step time in ms and the last loss; with `profile`, then a few more steps with
/// every op timed on the GPU, their breakdown printed (after the measured steps, which it
/// would slow).
/// With `replay` off, every step launches its kernels one by one (no recorded graph).
fn step_ms(
    dev: &Arc<CudaDevice>,
    graph: &Graph,
    (warmup, steps): (usize, usize),
    profile: bool,
    replay: bool,
) -> Result<(f64, f64)> {
    let data = SyntheticData::new(graph, 1, 4)?;
    let d: Arc<dyn Device> = dev.clone();
    let mut exec = GpuExecutor::new(graph.clone(), d, Arc::new(CpuBackend::with_threads(1)))?;
    if !replay {
        exec.disable_graph_replay();
    }
    let mut samples = Vec::with_capacity(steps);
    let mut loss = f64::NAN;
    for s in 0..warmup + steps {
        let t = Instant::now();
        let out = exec.step(&data.feeds(s as u64))?;
        if s >= warmup {
            samples.push(t.elapsed().as_secs_f64());
        }
        loss = out
            .first()
            .and_then(Tensor::scalar_value)
            .unwrap_or(f64::NAN);
    }
    if profile {
        exec.set_profiling(true);
        for s in 0..5 {
            exec.step(&data.feeds((warmup + steps + s) as u64))?;
        }
        println!("{}: {}", graph.name, exec.stats().summary());
    } else {
        let host: u64 = exec.stats().host_ops.values().map(|(n, _)| n).sum();
        if host > 0 || (replay && exec.stats().no_replay.is_some()) {
            eprintln!("{}: {}", graph.name, exec.stats().summary());
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok((samples[samples.len() / 2] * 1e3, loss))
}

/// How the ResNet-18 rows run their convolutions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Convs {
    /// The device's default: cuDNN's deterministic algorithms where cuDNN is loaded.
    Default,
    /// cuDNN with its non-deterministic algorithms allowed.
    AnyAlgorithm,
    /// im2col + cuBLAS.
    Im2col,
}

/// The training rows' models: all three, or those `--models` names (the transformer has no
/// name there: it is measured when `--models` is not given).
fn gpu_models(chosen: &[TrainModel]) -> Result<Vec<&'static str>> {
    if chosen.is_empty() {
        return Ok(vec!["mlp", "resnet18", "transformer"]);
    }
    chosen
        .iter()
        .map(|m| match m {
            TrainModel::Mlp | TrainModel::Resnet18 => Ok(m.name()),
            other => bail!(
                "shardc bench gpu has no {} row: its models are mlp and resnet18 (--models \
                 mlp,resnet18), and the transformer when --models is not given",
                other.name()
            ),
        })
        .collect()
}

/// Runs the benchmark (see the module doc).
pub fn run(args: &BenchArgs) -> Result<()> {
    let dev = Arc::new(CudaDevice::new(0).map_err(|e| anyhow!("shardc bench gpu: {e}"))?);
    println!("GPU: {}", dev.description());
    let sizes: Vec<usize> = if args.quick {
        vec![1024, 2048]
    } else {
        vec![1024, 2048, 4096, 8192]
    };
    let size_text = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut sub = vec!["gemm", "--sizes", size_text.as_str()];
    if args.quick {
        sub.push("--quick");
    }
    let refs = if args.no_reference {
        Vec::new()
    } else {
        reference(args, &sub)?
    };
    println!("GEMM (n x n x n)         shardc TFLOP/s   torch TFLOP/s   ratio   goal >= 0.95");
    for &n in &sizes {
        for (p, name) in [
            (GemmPrecision::F32, "f32"),
            (GemmPrecision::Tf32, "tf32"),
            (GemmPrecision::Bf16, "bf16"),
        ] {
            let t = dev.time_gemm(p, n, if args.quick { 20 } else { 100 })?;
            let ours = 2.0 * (n as f64).powi(3) / t / 1e12;
            let theirs = field(
                &refs,
                &[("precision", name), ("n", &n.to_string())],
                "tflops",
            );
            match theirs {
                Some(r) => println!(
                    "{name:<5} n={n:<6}            {ours:>10.2}      {r:>10.2}   {:>5.2}   {}",
                    ours / r,
                    if ours / r >= 0.95 { "met" } else { "missed" }
                ),
                None => println!("{name:<5} n={n:<6}            {ours:>10.2}"),
            }
        }
    }
    let names = gpu_models(&args.models)?;
    let models = names.join(",");
    let models = models.as_str();
    let resnet = names.contains(&"resnet18");
    let batch = args.batch.to_string();
    let (warmup, steps) = if args.quick { (3, 20) } else { (10, 100) };
    // Where convolutions go through cuDNN, ResNet-18 again with its non-deterministic
    // algorithms allowed (PyTorch's default, which its reference row runs with), and with
    // im2col + cuBLAS instead.
    let with_cudnn = dev.convolutions().starts_with("cuDNN");
    let extra = [
        ("resnet18", Convs::AnyAlgorithm),
        ("resnet18", Convs::Im2col),
    ];
    let rows: Vec<(&str, Convs, Graph)> = names
        .iter()
        .map(|&name| (name, Convs::Default))
        .chain(extra.into_iter().filter(|_| with_cudnn && resnet))
        .map(|(name, convs)| {
            let graph = match name {
                "mlp" => TrainModel::Mlp.training_graph(args.batch)?,
                "resnet18" => TrainModel::Resnet18.training_graph(args.batch)?,
                _ => transformer_step()?,
            };
            anyhow::Ok((name, convs, graph))
        })
        .collect::<Result<_>>()?;
    // Rounds of both sides, alternating, as the CPU benchmark does: a GPU's clocks (and a
    // shared machine) drift between runs, so each side's figure is its best round's median.
    // torch.compile is measured in the first round only.
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 3 });
    // Per row: (shardc ms, loss, without replay ms), the best over the rounds.
    let mut ours: Vec<(f64, f64, f64)> = vec![(f64::INFINITY, f64::NAN, f64::INFINITY); rows.len()];
    let mut eager: HashMap<String, f64> = HashMap::new();
    let mut compiled: HashMap<String, f64> = HashMap::new();
    let mut deterministic: HashMap<String, f64> = HashMap::new();
    for round in 0..rounds {
        for (k, (_, convs, graph)) in rows.iter().enumerate() {
            dev.set_deterministic_convolutions(*convs != Convs::AnyAlgorithm);
            dev.set_cudnn(*convs != Convs::Im2col);
            // The per-kind profile once, after the last round's measured steps.
            let profile = args.stats && round + 1 == rounds;
            let run = (|| {
                let (ms, loss) = step_ms(&dev, graph, (warmup, steps), profile, true)?;
                let (launched, _) = step_ms(&dev, graph, (warmup, steps), false, false)?;
                anyhow::Ok((ms, loss, launched))
            })();
            dev.set_deterministic_convolutions(true);
            dev.set_cudnn(true);
            let (ms, loss, launched) = run?;
            let best = &mut ours[k];
            if ms < best.0 {
                *best = (ms, loss, best.2);
            }
            best.2 = best.2.min(launched);
        }
        if args.no_reference {
            continue;
        }
        let modes = if round == 0 { "eager,compile" } else { "eager" };
        let mut sub = vec![
            "train", "--models", models, "--batch", &batch, "--modes", modes,
        ];
        if args.quick {
            sub.push("--quick");
        }
        let mut refs = reference(args, &sub)?;
        if with_cudnn && resnet {
            // shardc's ResNet-18 row keeps to cuDNN's deterministic algorithms: its like is
            // PyTorch with `torch.backends.cudnn.deterministic = True`.
            let mut sub = vec![
                "train",
                "--models",
                "resnet18",
                "--batch",
                &batch,
                "--modes",
                "deterministic",
            ];
            if args.quick {
                sub.push("--quick");
            }
            refs.extend(reference(args, &sub)?);
        }
        for name in models.split(',') {
            for (mode, best) in [
                ("eager", &mut eager),
                ("compile", &mut compiled),
                ("deterministic", &mut deterministic),
            ] {
                if let Some(v) = field(&refs, &[("model", name), ("mode", mode)], "step_ms") {
                    let e = best.entry(name.to_string()).or_insert(f64::INFINITY);
                    *e = e.min(v);
                }
            }
        }
    }
    println!(
        "training step            shardc ms   torch eager ms   ratio   torch.compile ms   goal <= 1.0 x eager   (no graph replay ms)   best of {rounds} alternating round(s)"
    );
    for ((name, convs, _), (ms, loss, launched)) in rows.iter().zip(&ours) {
        // The deterministic cuDNN row against PyTorch's deterministic cuDNN.
        let like = if *convs == Convs::Default && with_cudnn && *name == "resnet18" {
            &deterministic
        } else {
            &eager
        };
        let eager = like.get(*name).copied();
        let compiled = compiled.get(*name).copied();
        let ratio = eager.map(|e| ms / e);
        println!(
            "{:<12} batch {:<4}     {ms:>9.3}   {:>14}   {:>5}   {:>16}   {:<6}   ({launched:.3}; loss {loss:.4})",
            match convs {
                Convs::Default if with_cudnn && *name == "resnet18" => "resnet18 =",
                Convs::Default => *name,
                Convs::AnyAlgorithm => "resnet18 *",
                Convs::Im2col => "resnet18 +",
            },
            if *name == "transformer" { 8 } else { args.batch },
            eager.map_or("-".into(), |v| format!("{v:.3}")),
            ratio.map_or("-".into(), |r| format!("{r:.2}")),
            compiled.map_or("-".into(), |v| format!("{v:.3}")),
            match ratio {
                Some(r) if r <= 1.0 => "met",
                Some(_) => "missed",
                None => "",
            }
        );
    }
    if with_cudnn && resnet {
        println!(
            "= cuDNN's deterministic algorithms only on both sides (shardc's default; PyTorch \
             eager with torch.backends.cudnn.deterministic = True; torch.compile as PyTorch's \
             default)"
        );
        println!(
            "* with cuDNN's non-deterministic algorithms allowed on both sides \
             (SHARDC_CUDNN_DETERMINISTIC=0; PyTorch's default)"
        );
        println!("+ convolutions as im2col + cuBLAS (SHARDC_CUDNN=0) instead of cuDNN");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::gpu_models;
    use crate::args::TrainModel;

    #[test]
    fn models_select_the_training_rows_and_a_model_without_a_row_is_named() {
        assert_eq!(gpu_models(&[]).unwrap(), ["mlp", "resnet18", "transformer"]);
        assert_eq!(gpu_models(&[TrainModel::Resnet18]).unwrap(), ["resnet18"]);
        let e = gpu_models(&[TrainModel::Mlp, TrainModel::Quickstart])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no quickstart row"), "{e}");
    }
}
