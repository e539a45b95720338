//! One node as its lowering sees it ([`OpCall`]): its operands and results in device memory,
//! the device, the workspace and the temporaries, and the helpers every lowering shares.

use crate::acl::{Api, AscendDevice, DevPtr};
use crate::aclnn::{self, Arena, Runner, TensorDesc};
use crate::error::{AscendError, AscendResult};
use shardc_ascend_sys as sys;
use shardc_ir::{Const, DType, Node, TensorType};

/// An operand: a tensor in device memory, or a constant written in the graph.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Val<'a> {
    /// A tensor at `ptr`.
    Tensor {
        /// Its device address.
        ptr: DevPtr,
        /// Its type.
        ty: &'a TensorType,
    },
    /// A constant.
    Const(&'a Const),
}

/// Where a node ran: on the device, or (with the reason) on the host.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Lowered {
    /// aclnn operators (and AscendCL copies) on the compute stream.
    Device,
    /// The host backend, on copies; the reason.
    Host(String),
}

/// `Ok(Lowered::Host(why))`.
pub(crate) fn host(why: impl Into<String>) -> AscendResult<Lowered> {
    Ok(Lowered::Host(why.into()))
}

/// Alignment of the temporaries (bytes).
const ALIGN: usize = 512;

/// One node's lowering context.
pub(crate) struct OpCall<'a> {
    /// The device.
    pub dev: &'a AscendDevice,
    /// The node.
    pub node: &'a Node,
    /// Its operands.
    pub inputs: &'a [Val<'a>],
    /// Its results: address and type of each element.
    pub outputs: &'a [(DevPtr, TensorType)],
    /// The aclnn workspace.
    pub workspace: &'a Arena,
    /// The node's temporaries (one block per node, reused in stream order).
    pub temps: &'a Arena,
}

impl<'a> OpCall<'a> {
    /// The loaded API.
    pub fn api(&self) -> &'static Api {
        self.dev.api()
    }

    /// A launcher on the compute stream.
    pub fn runner(&self) -> Runner<'a> {
        Runner {
            dev: self.dev,
            workspace: self.workspace,
        }
    }

    /// An error about this node.
    pub fn err(&self, reason: impl Into<String>) -> AscendError {
        AscendError::Op {
            op: self.node.op,
            instance: self.node.instance.clone(),
            reason: reason.into(),
        }
    }

    /// Tensor operand `i`.
    pub fn tensor(&self, i: usize) -> AscendResult<(DevPtr, &'a TensorType)> {
        match self.inputs.get(i) {
            Some(Val::Tensor { ptr, ty }) => Ok((*ptr, ty)),
            Some(Val::Const(c)) => Err(self.err(format!(
                "operand {i} must be a tensor, got the constant {c:?}"
            ))),
            None => Err(self.err(format!(
                "operand {i} is missing ({} given)",
                self.inputs.len()
            ))),
        }
    }

    /// Constant operand `i`.
    pub fn constant(&self, i: usize) -> AscendResult<&'a Const> {
        match self.inputs.get(i) {
            Some(Val::Const(c)) => Ok(c),
            Some(Val::Tensor { ty, .. }) => {
                Err(self.err(format!("operand {i} must be a constant, got a {ty} tensor")))
            }
            None => Err(self.err(format!("operand {i} is missing"))),
        }
    }

    /// Result element `i`.
    pub fn out(&self, i: usize) -> AscendResult<(DevPtr, &'a TensorType)> {
        self.outputs
            .get(i)
            .map(|(p, t)| (*p, t))
            .ok_or_else(|| self.err(format!("result {i} is missing")))
    }

    /// A contiguous descriptor of `ty` at `p`.
    pub fn desc(&self, p: DevPtr, ty: &TensorType) -> AscendResult<TensorDesc> {
        aclnn::tensor(self.api(), p, ty.dtype, &ty.shape)
    }

    /// A contiguous descriptor of `shape` at `p`.
    pub fn desc_shape(&self, p: DevPtr, dtype: DType, shape: &[usize]) -> AscendResult<TensorDesc> {
        aclnn::tensor(self.api(), p, dtype, shape)
    }

    /// A strided view at `p`.
    pub fn view(
        &self,
        p: DevPtr,
        dtype: DType,
        shape: &[usize],
        strides: &[i64],
        offset: i64,
    ) -> AscendResult<TensorDesc> {
        aclnn::tensor_view(
            self.api(),
            p,
            dtype,
            shape,
            strides,
            offset,
            sys::ACL_FORMAT_ND,
        )
    }

    /// The node's temporaries: one slot per size (bytes), from one block. Call once per node.
    pub fn temps(&self, sizes: &[usize]) -> AscendResult<Vec<DevPtr>> {
        let aligned: Vec<usize> = sizes
            .iter()
            .map(|&b| b.max(1).next_multiple_of(ALIGN))
            .collect();
        let base = self.temps.get(self.dev, aligned.iter().sum())?;
        let mut at = base;
        let mut slots = Vec::with_capacity(sizes.len());
        for b in aligned {
            slots.push(at);
            at += b as u64;
        }
        Ok(slots)
    }

    /// Fills the tensor of `shape` at `p` with `v` (`aclnnInplaceFillScalar`).
    pub fn fill(&self, p: DevPtr, dtype: DType, shape: &[usize], v: f64) -> AscendResult<()> {
        let t = self.desc_shape(p, dtype, shape)?;
        let s = aclnn::scalar(self.api(), v, dtype)?;
        crate::aclnn!(
            &self.runner(),
            aclnnInplaceFillScalar,
            aclnnInplaceFillScalarGetWorkspaceSize(t.ptr(), s.ptr())
        )
    }

    /// Operand `i` as a one-element `dtype` tensor: a tensor operand as it is, a constant
    /// written into `slot` (a temporary of at least 8 bytes).
    pub fn scalar_tensor(&self, i: usize, dtype: DType, slot: DevPtr) -> AscendResult<DevPtr> {
        match self.inputs.get(i) {
            Some(Val::Tensor { ptr, ty }) if ty.num_elements() == 1 && ty.dtype == dtype => {
                Ok(*ptr)
            }
            Some(Val::Tensor { ty, .. }) => Err(self.err(format!(
                "operand {i} must be a one-element {dtype} tensor or a number, got {ty}"
            ))),
            Some(Val::Const(c)) => {
                let v = c
                    .as_f64()
                    .ok_or_else(|| self.err(format!("operand {i} must be a number, got {c:?}")))?;
                self.fill(slot, dtype, &[], v)?;
                Ok(slot)
            }
            None => Err(self.err(format!("operand {i} is missing"))),
        }
    }

    /// An integer attribute that may be written as a one-element tuple.
    pub fn int_attr(&self, key: &str, default: i64) -> AscendResult<i64> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => match a.as_ints().as_deref() {
                Some([v]) => Ok(*v),
                _ => Err(self.err(format!("attribute `{key}` must be one integer, got {a:?}"))),
            },
        }
    }

    /// `axis` (negative counts from the end) as an index below `rank`.
    pub fn axis(&self, axis: i64, rank: usize) -> AscendResult<usize> {
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        usize::try_from(a)
            .ok()
            .filter(|&a| a < rank)
            .ok_or_else(|| self.err(format!("axis {axis} is out of range for rank {rank}")))
    }
}

/// The reason a node with these tensors cannot run as Float32 aclnn math, if it cannot.
pub(crate) fn not_f32(call: &OpCall<'_>) -> Option<String> {
    let tensors = call
        .inputs
        .iter()
        .filter_map(|v| match v {
            Val::Tensor { ty, .. } => Some(ty.dtype),
            Val::Const(_) => None,
        })
        .chain(call.outputs.iter().map(|(_, t)| t.dtype));
    for d in tensors {
        if d != DType::Float32 {
            return Some(format!(
                "{d} tensors: the aclnn lowering computes in Float32 only"
            ));
        }
    }
    None
}
