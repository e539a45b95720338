//! A node as the lowering sees it ([`OpCall`]: its operands as device values, its outputs,
//! the device), what lowering it did ([`Lowered`]), and the helpers every op family's lowering
//! shares (kernel suffixes by dtype, the host answer).

use crate::device::Device;
use crate::error::{CudaError, CudaResult};
use crate::kernels::{DevPtr, KernelArg};
use shardc_ir::{Const, DType, Node, TensorType};

/// One operand as the device sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val<'a> {
    /// A tensor in device memory.
    Tensor { ptr: DevPtr, ty: &'a TensorType },
    /// A constant written in the graph.
    Const(&'a Const),
}

/// What [`lower`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lowered {
    /// Launched on the device.
    Device,
    /// Launched on the device through a vendor library (cuDNN).
    Library,
    /// Not covered on the device: the host backend runs it.
    Host(String),
}

/// A node with its operands and results on the device.
pub(crate) struct OpCall<'a> {
    pub dev: &'a dyn Device,
    pub node: &'a Node,
    pub inputs: &'a [Val<'a>],
    pub outputs: &'a [(DevPtr, TensorType)],
    /// An `int` on the device that kernels set when they meet bad data (a label out of
    /// range); the executor reads it after the step.
    pub status: DevPtr,
    /// For a Dropout node: the device word that holds its key for the running step
    /// (`shardc_ir::dropout::key` of its seeds and the step, written by the executor before
    /// each step); 0 otherwise.
    pub dropout_key: DevPtr,
    /// Scratch memory that outlives the call (im2col columns).
    pub workspace: &'a Workspace,
}

/// Device scratch memory kept by the executor: grown to the largest request, then reused by
/// every op that needs scratch (the device runs in order, so consecutive users never overlap),
/// so a step allocates nothing (an allocation or a free synchronises a GPU).
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    ptr: std::cell::Cell<DevPtr>,
    bytes: std::cell::Cell<usize>,
}

impl Workspace {
    /// A device buffer of at least `bytes`, valid until the next call.
    pub(crate) fn get(&self, dev: &dyn Device, bytes: usize) -> CudaResult<DevPtr> {
        if bytes > self.bytes.get() || self.ptr.get() == 0 {
            self.release(dev);
            let p = dev.alloc(bytes.max(1))?;
            self.ptr.set(p);
            self.bytes.set(bytes.max(1));
        }
        Ok(self.ptr.get())
    }

    /// Frees the buffer (the executor's drop).
    pub(crate) fn release(&self, dev: &dyn Device) {
        if self.ptr.get() != 0 {
            dev.free(self.ptr.get());
            self.ptr.set(0);
            self.bytes.set(0);
        }
    }
}

pub(crate) fn host(reason: impl Into<String>) -> CudaResult<Lowered> {
    Ok(Lowered::Host(reason.into()))
}

pub(crate) fn suffix(d: DType) -> Option<&'static str> {
    match d {
        DType::Float32 => Some("f32"),
        DType::Float64 => Some("f64"),
        DType::Int32 => Some("i32"),
        DType::Int64 => Some("i64"),
        _ => None,
    }
}

/// The suffix of the strided-copy kernel that moves elements of `d`: its own where it has
/// kernels, else the bit copy of its size (Bool, the 8- and 16-bit types).
pub(crate) fn copy_suffix(d: DType) -> Option<&'static str> {
    suffix(d).or(match d.size_bytes() {
        1 => Some("b8"),
        2 => Some("b16"),
        4 => Some("i32"),
        8 => Some("i64"),
        _ => None,
    })
}

pub(crate) fn float_suffix(d: DType) -> Option<&'static str> {
    match d {
        DType::Float32 => Some("f32"),
        DType::Float64 => Some("f64"),
        _ => None,
    }
}

impl<'a> OpCall<'a> {
    pub(crate) fn err(&self, reason: impl Into<String>) -> CudaError {
        CudaError::Op {
            op: self.node.op,
            instance: self.node.instance.clone(),
            reason: reason.into(),
        }
    }

    pub(crate) fn tensor(&self, i: usize) -> CudaResult<(DevPtr, &'a TensorType)> {
        match self.inputs.get(i) {
            Some(Val::Tensor { ptr, ty }) => Ok((*ptr, ty)),
            _ => Err(self.err(format!("operand {i} must be a tensor"))),
        }
    }

    /// A scalar operand: a rank-0 (or one-element) tensor's pointer, or a constant's value.
    pub(crate) fn scalar(&self, i: usize) -> CudaResult<(DevPtr, f64)> {
        match self.inputs.get(i) {
            Some(Val::Tensor { ptr, ty }) if ty.num_elements() == 1 => Ok((*ptr, 0.0)),
            Some(Val::Const(c)) => c
                .as_f64()
                .map(|v| (0, v))
                .ok_or_else(|| self.err(format!("operand {i} must be a number, got {c:?}"))),
            _ => Err(self.err(format!("operand {i} must be a scalar"))),
        }
    }

    pub(crate) fn out(&self, i: usize) -> CudaResult<(DevPtr, &'a TensorType)> {
        self.outputs
            .get(i)
            .map(|(p, t)| (*p, t))
            .ok_or_else(|| self.err(format!("the node has no result {i}")))
    }

    pub(crate) fn grid(&self, n: usize) -> u32 {
        let b = self.dev.block_size() as usize;
        (n.div_ceil(b).max(1) as u64).min(self.dev.max_grid() as u64) as u32
    }

    pub(crate) fn rows_grid(&self, rows: usize) -> u32 {
        (rows.max(1) as u64).min(self.dev.max_grid() as u64 * 4) as u32
    }

    pub(crate) fn launch(&self, name: &str, grid: u32, args: &[KernelArg]) -> CudaResult<Lowered> {
        self.dev.launch(name, grid, self.dev.block_size(), args)?;
        Ok(Lowered::Device)
    }

    /// [`OpCall::launch`] of a kernel whose blocks each reduce `per_block` elements (a row, a
    /// channel): with the device's wide blocks where each of their threads gets at least 8
    /// elements.
    pub(crate) fn launch_reducing(
        &self,
        name: &str,
        grid: u32,
        per_block: usize,
        args: &[KernelArg],
    ) -> CudaResult<Lowered> {
        let wide = self.dev.wide_block_size();
        let block = if per_block >= 8 * wide as usize {
            wide
        } else {
            self.dev.block_size()
        };
        self.dev.launch(name, grid, block, args)?;
        Ok(Lowered::Device)
    }
}

pub(crate) fn out_float<'a>(
    call: &OpCall<'a>,
) -> CudaResult<Option<(DevPtr, &'a TensorType, &'static str)>> {
    let (y, ty) = call.out(0)?;
    Ok(float_suffix(ty.dtype).map(|s| (y, ty, s)))
}

/// Blocks a reduction over few rows or channels aims at: about two per streaming
/// multiprocessor of a large GPU (an H100 has 132).
pub(crate) const TARGET_BLOCKS: usize = 256;
