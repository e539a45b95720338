//! `shardc-backend-cpu`: CPU kernels for every compute op of the IR.
//!
//! [`CpuBackend`] implements [`shardc_runtime::Backend`]: it runs one node at a time on host
//! [`Tensor`]s, in Float32 and Float64 (plus every dtype for `Cast` and the data-movement
//! ops, and Int32 / Int64 indices and labels). Contractions go through the `gemm` crate
//! ([`sgemm`], [`dgemm`]); Conv2D is im2col + gemm; loops are parallel with rayon over
//! rows, planes or batches when the work is large enough.
//!
//! Results never depend on the number of threads: work is split into chunks whose
//! boundaries depend only on shapes, and no floating-point sum is ever split between threads
//! (sums over a batch, such as the filter gradient, use fixed partial sums added in order).

#![warn(missing_docs)]

mod conv;
mod conv_winograd;
mod elementwise;
mod loss;
mod matmul;
mod movement;
mod norm;
mod optim;
mod pool;
mod real;
mod reduce;
mod util;

pub use elementwise::dropout_uniform;
pub use matmul::{dgemm, sgemm, GemmError, MatRef};
pub use real::{Elem, Real};

use shardc_ir::{DType, Node, OpClass, OpKind};
use shardc_runtime::{Arg, Backend, KernelContext, KernelError, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use util::{with_float, Ctx, KResult, Par};

/// The CPU backend.
///
/// Kernels run on rayon: [`CpuBackend::new`] uses the global pool,
/// [`CpuBackend::with_threads`] a dedicated pool (or none at all for one thread).
#[derive(Debug)]
pub struct CpuBackend {
    /// The dedicated pool, if any (`None`: the global pool, or serial when `threads == 1`).
    pool: Option<rayon::ThreadPool>,
    /// Threads the kernels may use (1: fully serial).
    threads: usize,
    /// Whether a kernel has run on several threads: from then on, steps run on the pool
    /// (see [`Backend::in_context`]); a graph of small kernels only (the quickstart net) stays
    /// on the caller's thread and pays no hand-off per step.
    used_pool: AtomicBool,
}

impl CpuBackend {
    /// Kernels parallelised over the global rayon pool.
    pub fn new() -> Self {
        CpuBackend {
            pool: None,
            threads: rayon::current_num_threads().max(1),
            used_pool: AtomicBool::new(false),
        }
    }

    /// Kernels run in a dedicated rayon pool of `threads` threads; `1` (or `0`) runs every
    /// kernel serially on the calling thread, without rayon. Should the pool fail to start
    /// (the OS refusing threads), kernels run serially.
    pub fn with_threads(threads: usize) -> Self {
        if threads <= 1 {
            return CpuBackend {
                pool: None,
                threads: 1,
                used_pool: AtomicBool::new(false),
            };
        }
        match rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("shardc-cpu-{i}"))
            .build()
        {
            Ok(pool) => CpuBackend {
                pool: Some(pool),
                threads,
                used_pool: AtomicBool::new(false),
            },
            Err(_) => CpuBackend {
                pool: None,
                threads: 1,
                used_pool: AtomicBool::new(false),
            },
        }
    }

    /// The number of threads kernels may use (1: serial).
    pub fn threads(&self) -> usize {
        self.threads
    }
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn run(
        &self,
        node: &Node,
        inputs: &[Arg<'_>],
        outputs: &mut [Tensor],
        ctx: &KernelContext,
    ) -> Result<(), KernelError> {
        // Small ops run inline on the caller's thread: handing them to the pool costs a
        // thread wake-up (tens of microseconds), more than the work. Chunking depends only on
        // shapes, so the result is the same either way.
        let parallel = self.threads > 1 && work_elements(inputs, outputs) >= PARALLEL_WORK;
        let kctx = Ctx {
            node,
            par: Par {
                threads: if parallel { self.threads } else { 1 },
            },
            step: ctx.step,
        };
        if parallel && !self.used_pool.load(Ordering::Relaxed) {
            self.used_pool.store(true, Ordering::Relaxed);
        }
        match &self.pool {
            Some(pool) if parallel => pool.install(|| dispatch(&kctx, inputs, outputs)),
            _ => dispatch(&kctx, inputs, outputs),
        }
    }

    /// With a dedicated pool, once a kernel has used it, the step runs on one of its workers:
    /// serial kernels then run inline on that worker, and no caller thread competes with the
    /// pool's spinning workers for the cores (with two cores and two workers, the caller made
    /// three threads, and every small kernel ran several times slower).
    fn in_context(&self, step: &mut (dyn FnMut() + Send)) {
        match &self.pool {
            Some(pool) if self.used_pool.load(Ordering::Relaxed) => pool.install(step),
            _ => step(),
        }
    }
}

/// The element type a float kernel computes in: that of its first tensor operand.
/// Elements touched by an op (operands and results) from which it is worth running on
/// several threads.
const PARALLEL_WORK: usize = 1 << 15;

/// Elements of every tensor operand and result: a cheap measure of an op's work.
fn work_elements(inputs: &[Arg<'_>], outputs: &[Tensor]) -> usize {
    inputs
        .iter()
        .filter_map(|a| a.tensor().map(Tensor::len))
        .chain(outputs.iter().map(Tensor::len))
        .sum()
}

fn compute_dtype(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &[Tensor]) -> KResult<DType> {
    inputs
        .iter()
        .find_map(|a| a.tensor().map(Tensor::dtype))
        .or_else(|| outputs.first().map(Tensor::dtype))
        .ok_or_else(|| ctx.err("no tensor operand or result to take the element type from"))
}

/// Runs one node.
fn dispatch(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    use OpKind::*;
    let op = ctx.node.op;
    if matches!(op.class(), OpClass::Communication | OpClass::Plumbing) {
        return Err(ctx.err(format!(
            "{op} is not a compute op: the executor or the communicator runs it, not a backend"
        )));
    }
    // Ops defined for every element type.
    match op {
        Cast => return elementwise::cast(ctx, inputs, outputs),
        Equal => return elementwise::equal(ctx, inputs, outputs),
        ZerosLike | OnesLike => return elementwise::fill_like(ctx, inputs, outputs),
        Reshape => return movement::reshape(ctx, inputs, outputs),
        Transpose => return movement::transpose(ctx, inputs, outputs),
        BroadcastTo => return movement::broadcast_to(ctx, inputs, outputs),
        StridedSlice => return movement::strided_slice(ctx, inputs, outputs),
        StridedSliceGrad => return movement::strided_slice_grad(ctx, inputs, outputs),
        Concat => return movement::concat(ctx, inputs, outputs),
        Split => return movement::split(ctx, inputs, outputs),
        Gather => return movement::gather(ctx, inputs, outputs),
        OneHot => return movement::one_hot(ctx, inputs, outputs),
        _ => {}
    }
    let dtype = compute_dtype(ctx, inputs, outputs)?;
    with_float!(ctx, dtype, T => float_op::<T>(ctx, inputs, outputs))
}

/// Runs a float compute op in `T`.
fn float_op<T: Real>(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    use OpKind::*;
    match ctx.node.op {
        MatMul => matmul::matmul::<T>(ctx, inputs, outputs),
        BatchMatMul => matmul::batch_matmul::<T>(ctx, inputs, outputs),
        Conv2D => conv::conv2d::<T>(ctx, inputs, outputs),
        Conv2DBackpropInput => conv::conv2d_backprop_input::<T>(ctx, inputs, outputs),
        Conv2DBackpropFilter => conv::conv2d_backprop_filter::<T>(ctx, inputs, outputs),
        BiasAdd => elementwise::bias_add::<T>(ctx, inputs, outputs),
        Add | Sub | Mul | RealDiv | ReluGrad | SigmoidGrad | TanhGrad | SqrtGrad | DropoutGrad => {
            elementwise::binary::<T>(ctx, inputs, outputs)
        }
        Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid | Tanh => {
            elementwise::unary::<T>(ctx, inputs, outputs)
        }
        GeLUGrad => elementwise::gelu_grad_kernel::<T>(ctx, inputs, outputs),
        Dropout => elementwise::dropout::<T>(ctx, inputs, outputs),
        ReduceSum | ReduceMean | ReduceMax => reduce::reduce::<T>(ctx, inputs, outputs),
        BiasAddGrad => reduce::bias_add_grad::<T>(ctx, inputs, outputs),
        Softmax | LogSoftmax => reduce::softmax::<T>(ctx, inputs, outputs),
        SoftmaxGrad | LogSoftmaxGrad => reduce::softmax_grad::<T>(ctx, inputs, outputs),
        BatchNorm => norm::batch_norm::<T>(ctx, inputs, outputs),
        BatchNormGrad => norm::batch_norm_grad::<T>(ctx, inputs, outputs),
        BNTrainingReduce => norm::bn_training_reduce::<T>(ctx, inputs, outputs),
        BNTrainingUpdate => norm::bn_training_update::<T>(ctx, inputs, outputs),
        BNTrainingUpdateGrad => norm::bn_training_update_grad::<T>(ctx, inputs, outputs),
        BNTrainingReduceGrad => norm::bn_training_reduce_grad::<T>(ctx, inputs, outputs),
        LayerNorm => norm::layer_norm::<T>(ctx, inputs, outputs),
        LayerNormGrad => norm::layer_norm_grad::<T>(ctx, inputs, outputs),
        MaxPool | AvgPool => pool::pool::<T>(ctx, inputs, outputs),
        MaxPoolGrad | AvgPoolGrad => pool::pool_grad::<T>(ctx, inputs, outputs),
        SoftmaxCrossEntropyWithLogits => loss::softmax_ce::<T>(ctx, inputs, outputs),
        SparseSoftmaxCrossEntropyWithLogits => loss::sparse_softmax_ce::<T>(ctx, inputs, outputs),
        ApplyMomentum => optim::apply_momentum::<T>(ctx, inputs, outputs),
        ApplyGradientDescent => optim::apply_gradient_descent::<T>(ctx, inputs, outputs),
        SGD => optim::sgd::<T>(ctx, inputs, outputs),
        Adam => optim::adam::<T>(ctx, inputs, outputs),
        UnsortedSegmentSum => movement::unsorted_segment_sum::<T>(ctx, inputs, outputs),
        op => Err(ctx.err(format!("{op} has no CPU kernel"))),
    }
}
