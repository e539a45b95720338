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

use shardc_ir::{DType, Node, OpKind};
use shardc_runtime::{Arg, Backend, KernelContext, KernelError, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use util::{Ctx, KResult, Par};

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

/// A kernel of one op: every CPU kernel takes the node's context, its operands and its
/// preallocated results.
type KernelFn = for<'a, 'b, 'c, 'd, 'e> fn(&'a Ctx<'b>, &'c [Arg<'d>], &'e mut [Tensor]) -> KResult;

/// A float kernel, monomorphised for each float element type it computes in.
#[derive(Clone, Copy)]
struct FloatKernel {
    f32: KernelFn,
    f64: KernelFn,
}

/// `FloatKernel` of a generic kernel `path::<T>`.
macro_rules! float {
    ($($path:ident)::+) => {
        FloatKernel {
            f32: $($path)::+::<f32>,
            f64: $($path)::+::<f64>,
        }
    };
}

/// How the CPU backend runs an op (private: the kernels themselves).
#[derive(Clone, Copy)]
enum Route {
    /// A kernel for every element type.
    AnyType(KernelFn),
    /// A float kernel (Float32 / Float64), by the element type of the first tensor operand.
    Float(FloatKernel),
    /// Not a compute op: the executor or the communicator runs it, for this reason.
    NotCompute(&'static str),
}

/// What the CPU backend has for an op: what [`kernel`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// A kernel for every element type (data movement, `Cast`, `Equal`, the fills).
    AnyType,
    /// A float kernel, in Float32 or Float64.
    Float,
}

/// Why the executor runs the plumbing ops itself, not a backend.
const PLUMBING: &str =
    "not a compute op: the executor runs it (TupleGetItem is an alias, Assign stores a parameter)";
/// Why the communicator runs the collectives, not a backend.
const COLLECTIVE: &str =
    "not a compute op: the executor's communication thread runs it through the communicator";

/// The CPU kernel of every op: one exhaustive match, which [`CpuBackend::run`] dispatches by
/// and [`kernel`] reports, so that the two cannot disagree and a new op does not compile
/// without an arm.
fn route(op: OpKind) -> Route {
    use OpKind::*;
    use Route::*;
    match op {
        // Ops defined for every element type.
        Cast => AnyType(elementwise::cast),
        Equal => AnyType(elementwise::equal),
        ZerosLike | OnesLike => AnyType(elementwise::fill_like),
        Reshape => AnyType(movement::reshape),
        Transpose => AnyType(movement::transpose),
        BroadcastTo => AnyType(movement::broadcast_to),
        StridedSlice => AnyType(movement::strided_slice),
        StridedSliceGrad => AnyType(movement::strided_slice_grad),
        Concat => AnyType(movement::concat),
        Split => AnyType(movement::split),
        Gather => AnyType(movement::gather),
        OneHot => AnyType(movement::one_hot),
        // Float ops.
        MatMul => Float(float!(matmul::matmul)),
        BatchMatMul => Float(float!(matmul::batch_matmul)),
        Conv2D => Float(float!(conv::conv2d)),
        Conv2DBackpropInput => Float(float!(conv::conv2d_backprop_input)),
        Conv2DBackpropFilter => Float(float!(conv::conv2d_backprop_filter)),
        BiasAdd => Float(float!(elementwise::bias_add)),
        Add | Sub | Mul | RealDiv | ReluGrad | SigmoidGrad | TanhGrad | SqrtGrad | DropoutGrad
        | SiLUGrad => Float(float!(elementwise::binary)),
        Neg | Square | Sqrt | Exp | Log | ReLU | GeLU | Sigmoid | Tanh | SiLU | Erf => {
            Float(float!(elementwise::unary))
        }
        GeLUGrad => Float(float!(elementwise::gelu_grad_kernel)),
        Dropout => Float(float!(elementwise::dropout)),
        ReduceSum | ReduceMean | ReduceMax => Float(float!(reduce::reduce)),
        BiasAddGrad => Float(float!(reduce::bias_add_grad)),
        Softmax | LogSoftmax => Float(float!(reduce::softmax)),
        SoftmaxGrad | LogSoftmaxGrad => Float(float!(reduce::softmax_grad)),
        BatchNorm => Float(float!(norm::batch_norm)),
        BatchNormGrad => Float(float!(norm::batch_norm_grad)),
        BNTrainingReduce => Float(float!(norm::bn_training_reduce)),
        BNTrainingUpdate => Float(float!(norm::bn_training_update)),
        BNTrainingUpdateGrad => Float(float!(norm::bn_training_update_grad)),
        BNTrainingReduceGrad => Float(float!(norm::bn_training_reduce_grad)),
        LayerNorm => Float(float!(norm::layer_norm)),
        LayerNormGrad => Float(float!(norm::layer_norm_grad)),
        MaxPool | AvgPool => Float(float!(pool::pool)),
        MaxPoolGrad | AvgPoolGrad => Float(float!(pool::pool_grad)),
        SoftmaxCrossEntropyWithLogits => Float(float!(loss::softmax_ce)),
        SparseSoftmaxCrossEntropyWithLogits => Float(float!(loss::sparse_softmax_ce)),
        ApplyMomentum => Float(float!(optim::apply_momentum)),
        ApplyGradientDescent => Float(float!(optim::apply_gradient_descent)),
        SGD => Float(float!(optim::sgd)),
        Adam => Float(float!(optim::adam)),
        UnsortedSegmentSum => Float(float!(movement::unsorted_segment_sum)),
        // Run by the executor or the communicator.
        TupleGetItem | Assign => NotCompute(PLUMBING),
        AllReduce | AllGather | ReduceScatter | AllToAll | Broadcast | Send | Receive => {
            NotCompute(COLLECTIVE)
        }
    }
}

/// The CPU kernel of `op`, or `None` for an op that is not a backend's to run (then
/// [`not_compute_reason`] says who runs it).
pub fn kernel(op: OpKind) -> Option<Kernel> {
    match route(op) {
        Route::AnyType(_) => Some(Kernel::AnyType),
        Route::Float(_) => Some(Kernel::Float),
        Route::NotCompute(_) => None,
    }
}

/// Why the CPU backend has no kernel for `op` (the executor or the communicator runs it), or
/// `None` when it has one.
pub fn not_compute_reason(op: OpKind) -> Option<&'static str> {
    match route(op) {
        Route::NotCompute(why) => Some(why),
        Route::AnyType(_) | Route::Float(_) => None,
    }
}

/// Runs one node.
fn dispatch(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let op = ctx.node.op;
    match route(op) {
        Route::AnyType(f) => f(ctx, inputs, outputs),
        Route::Float(k) => match compute_dtype(ctx, inputs, outputs)? {
            DType::Float32 => (k.f32)(ctx, inputs, outputs),
            DType::Float64 => (k.f64)(ctx, inputs, outputs),
            other => Err(ctx.err(format!(
                "unsupported element type {other} (this kernel computes in Float32 or Float64)"
            ))),
        },
        Route::NotCompute(_) => Err(ctx.err(format!(
            "{op} is not a compute op: the executor or the communicator runs it, not a backend"
        ))),
    }
}
