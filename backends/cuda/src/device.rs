//! The device an executor runs on: memory, kernel launches and GEMM, in one stream order.
//!
//! Two implementations: [`crate::cuda::CudaDevice`] (a GPU through the driver API, cuBLAS)
//! and [`crate::emulator::EmulatedDevice`] (the same kernel sources compiled for the host, a
//! column-major reference GEMM), so the executor and every kernel are tested on machines
//! without a GPU.

use crate::error::CudaResult;
use crate::kernels::{DevPtr, KernelArg};
use shardc_ir::geometry::Conv2dGeometry;
use shardc_ir::DType;

/// A strided batched GEMM in cuBLAS's column-major convention:
/// `C_i = alpha * op(A_i) * op(B_i) + beta * C_i` for `i < batch`, `op(A)` of `m x k`,
/// `op(B)` of `k x n`, `C` of `m x n`, leading dimensions in elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    /// Float32 or Float64.
    pub dtype: DType,
    /// `op(A) = A^T`.
    pub trans_a: bool,
    /// `op(B) = B^T`.
    pub trans_b: bool,
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// The contracted size.
    pub k: usize,
    /// A.
    pub a: DevPtr,
    /// A's leading dimension.
    pub lda: usize,
    /// Elements between consecutive A matrices (0: the same A for every batch).
    pub stride_a: usize,
    /// B.
    pub b: DevPtr,
    /// B's leading dimension.
    pub ldb: usize,
    /// Elements between consecutive B matrices.
    pub stride_b: usize,
    /// C.
    pub c: DevPtr,
    /// C's leading dimension.
    pub ldc: usize,
    /// Elements between consecutive C matrices.
    pub stride_c: usize,
    /// Number of matrices.
    pub batch: usize,
    /// Scale of the product.
    pub alpha: f64,
    /// Scale of C's old contents (0: C is only written).
    pub beta: f64,
}

impl Gemm {
    /// The row-major product `C (M x N) = op(a) (M x K) * op(b) (K x N)` of row-major
    /// operands (`a` stored `M x K`, or `K x M` when `transpose_a`; `b` stored `K x N`, or
    /// `N x K` when `transpose_b`), as the column-major call `C^T = op(b)^T op(a)^T`.
    #[allow(clippy::too_many_arguments)]
    pub fn row_major(
        dtype: DType,
        (m, n, k): (usize, usize, usize),
        a: DevPtr,
        transpose_a: bool,
        b: DevPtr,
        transpose_b: bool,
        c: DevPtr,
        batch: usize,
        (stride_a, stride_b, stride_c): (usize, usize, usize),
    ) -> Gemm {
        Gemm {
            dtype,
            trans_a: transpose_b,
            trans_b: transpose_a,
            m: n,
            n: m,
            k,
            a: b,
            lda: if transpose_b { k } else { n },
            stride_a: stride_b,
            b: a,
            ldb: if transpose_a { m } else { k },
            stride_b: stride_a,
            c,
            ldc: n,
            stride_c,
            batch,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Which product of a convolution [`Device::library_conv`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvDirection {
    /// `y = conv(x, w)` (Conv2D).
    Forward,
    /// `x` (the input's gradient) from `y` (dy) and `w` (Conv2DBackpropInput).
    BackwardData,
    /// `w` (the filter's gradient) from `y` (dy) and `x` (Conv2DBackpropFilter).
    BackwardFilter,
}

/// A 2-D convolution (NCHW, cross-correlation, groups, the CPU backend's geometry) for a
/// device's convolution library: three dense buffers, one of them written (see
/// [`ConvDirection`]), each of the shape the geometry gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct LibraryConv {
    /// What is computed.
    pub direction: ConvDirection,
    /// Float32 or Float64 (all three buffers).
    pub dtype: DType,
    /// Sizes, strides, padding, dilation, groups.
    pub geometry: Conv2dGeometry,
    /// The input, or its gradient.
    pub x: DevPtr,
    /// The filter, or its gradient.
    pub w: DevPtr,
    /// The output, or its gradient.
    pub y: DevPtr,
}

/// A device (see the module doc). Every operation is ordered after the previous ones
/// (one stream); [`Device::download`] and [`Device::synchronize`] wait for all of them.
///
/// Pointers come from [`Device::alloc`]; passing anything else, or a range past an
/// allocation's end, is undefined behaviour on a GPU (the emulated device checks copies).
pub trait Device: Send + Sync {
    /// What it is (`NVIDIA H100 80GB HBM3 (sm_90)`, `emulated (host C++)`).
    fn description(&self) -> String;

    /// Threads per block for the kernels (a multiple of 32, at most 1024).
    fn block_size(&self) -> u32;

    /// Threads per block for kernels whose block reduces one long row or channel (a multiple
    /// of 32, at most 1024): more threads in flight on each. The default is
    /// [`Device::block_size`].
    fn wide_block_size(&self) -> u32 {
        self.block_size()
    }

    /// The most blocks a grid-stride kernel is launched with.
    fn max_grid(&self) -> u32;

    /// Allocates `bytes` (at least 1) of device memory; contents unspecified.
    fn alloc(&self, bytes: usize) -> CudaResult<DevPtr>;

    /// Frees an allocation.
    fn free(&self, ptr: DevPtr);

    /// Copies host bytes to the device.
    fn upload(&self, dst: DevPtr, src: &[u8]) -> CudaResult<()>;

    /// Copies device bytes to the host, after every earlier operation.
    fn download(&self, src: DevPtr, dst: &mut [u8]) -> CudaResult<()>;

    /// Copies `bytes` between device addresses.
    fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> CudaResult<()>;

    /// Launches kernel `name` with `grid` blocks of `block` threads.
    fn launch(&self, name: &str, grid: u32, block: u32, args: &[KernelArg]) -> CudaResult<()>;

    /// Runs a GEMM (Float32 or Float64; TF32 off).
    fn gemm(&self, g: &Gemm) -> CudaResult<()>;

    /// Runs `c` through the device's convolution library (cuDNN) in stream order; `Ok(false)`
    /// when there is none or it cannot take this convolution, and the caller lowers it
    /// itself. The default has none.
    fn library_conv(&self, c: &LibraryConv) -> CudaResult<bool> {
        let _ = c;
        Ok(false)
    }

    /// Whether [`Device::library_conv`] has a library behind it (it may still refuse a
    /// geometry). The default has none.
    fn has_conv_library(&self) -> bool {
        false
    }

    /// Marks the point the compute stream has reached, for profiling, and returns the mark's
    /// number (counted from 0 after [`Device::reset_marks`]); None where the device cannot
    /// time its stream. The default cannot.
    fn mark(&self) -> CudaResult<Option<usize>> {
        Ok(None)
    }

    /// Seconds between marks `a` and `b`, once the stream has passed both (after a download
    /// or [`Device::synchronize`]).
    fn seconds_between(&self, a: usize, b: usize) -> CudaResult<f64> {
        Err(crate::error::CudaError::Other(format!(
            "this device has no marks ({a}, {b})"
        )))
    }

    /// Forgets the marks (a device may reuse what held them).
    fn reset_marks(&self) {}

    /// Waits for every earlier operation.
    fn synchronize(&self) -> CudaResult<()>;

    /// Starts recording instead of running (a CUDA Graph, captured from the compute stream
    /// and, through the events that join them, the communication stream): every launch,
    /// GEMM, device copy, library convolution and collective issued until
    /// [`Device::end_capture`] is recorded with its arguments' values of now, and nothing of
    /// it runs. Copies from or to the host, [`Device::synchronize`] and marks are not
    /// permitted meanwhile: they fail and spoil the recording. `Ok(false)` where the device
    /// cannot record (the default).
    fn begin_capture(&self) -> CudaResult<bool> {
        Ok(false)
    }

    /// Ends the recording begun by [`Device::begin_capture`] and returns the number of the
    /// recorded graph, for [`Device::replay`]. An error when something issued meanwhile could
    /// not be recorded; the recording is then discarded (none of it ran) and the device
    /// runs work as before.
    fn end_capture(&self) -> CudaResult<usize> {
        Err(crate::error::CudaError::Other(
            "this device cannot record graphs".into(),
        ))
    }

    /// Runs recorded graph `graph`, in stream order after everything issued before: the same
    /// work on the same addresses with the same arguments as when it was recorded.
    fn replay(&self, graph: usize) -> CudaResult<()> {
        Err(crate::error::CudaError::Other(format!(
            "this device has no recorded graph {graph}"
        )))
    }

    /// Frees recorded graph `graph`.
    fn drop_graph(&self, graph: usize) {
        let _ = graph;
    }

    /// Compiles `text` (kernel source in the dialect of `kernels/prelude.cuh`, without the
    /// prelude) as one more module named `unit`, and makes its kernels `names` launchable:
    /// kernels generated for a graph (fused elementwise chains).
    fn load_kernels(&self, unit: &str, text: &str, names: &[String]) -> CudaResult<()>;

    /// Orders the communication stream after everything issued so far on the compute
    /// stream (before a collective reads what the kernels wrote). A device with one stream
    /// does nothing.
    fn comm_after_compute(&self) -> CudaResult<()> {
        Ok(())
    }

    /// Marks, in event `slot`, everything issued so far on the communication stream.
    fn comm_record(&self, slot: usize) -> CudaResult<()> {
        let _ = slot;
        Ok(())
    }

    /// Orders the compute stream after event `slot` (before a kernel reads what a
    /// collective wrote); the host does not wait.
    fn compute_after_comm(&self, slot: usize) -> CudaResult<()> {
        let _ = slot;
        Ok(())
    }
}
