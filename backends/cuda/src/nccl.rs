//! NCCL collectives: MindSpore's `init("nccl")`.
//!
//! [`NcclComm`] implements the runtime's [`Communicator`] for one rank per GPU. The world's
//! NCCL communicator is created from a unique id that rank 0 makes and hands to the others
//! over the *bootstrap* communicator, the one the cluster already has (the scheduler's
//! rendezvous + TCP or shared memory, or MPI under `mpirun`); each sub-group gets its own NCCL
//! communicator the first time it is used, its id sent by its lowest member to the others
//! over the bootstrap, so only members take part. Collectives along an axis other than 0 are
//! rearranged on the device (NCCL concatenates and scatters flat buffers). Tensors given as
//! host [`Tensor`]s (the trait) are staged through device memory; the executor calls
//! [`NcclComm::run_on_device`] on its buffers directly.

use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::error::{CudaError, CudaResult};
use crate::kernels::{contiguous_strides, DevPtr, KernelArg, Strided};
use crate::probe::{self, Library};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as nccl_sys;
use shardc_ir::{DType, ReduceOp, TensorType};
use shardc_runtime::comm::{check_group, Collective};
use shardc_runtime::executor::CommCall;
use shardc_runtime::{CommError, Communicator, Tensor};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// The bootstrap tag range NCCL ids travel under (far from the graph's own tags).
const ID_TAG: i64 = i64::MAX - 4096;

fn nccl_err(call: &'static str) -> impl Fn(nccl::NcclError) -> CudaError {
    move |e| CudaError::Nccl {
        call,
        reason: format!("{e:?}"),
    }
}

struct Comms(HashMap<Vec<usize>, usize>);

// SAFETY: NCCL communicators are used under the mutex, with the device's context current.
unsafe impl Send for Comms {}

/// NCCL for one rank (see the module doc).
pub struct NcclComm {
    device: Arc<CudaDevice>,
    bootstrap: Arc<dyn Communicator>,
    comms: Mutex<Comms>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclComm(rank {} of {})", self.rank, self.size)
    }
}

fn nccl_dtype(d: DType) -> CudaResult<nccl_sys::ncclDataType_t> {
    use nccl_sys::ncclDataType_t::*;
    Ok(match d {
        DType::Float32 => ncclFloat32,
        DType::Float64 => ncclFloat64,
        DType::Float16 => ncclFloat16,
        DType::Int32 => ncclInt32,
        DType::Int64 => ncclInt64,
        DType::Bool => ncclUint8,
        other => return Err(CudaError::Other(format!("NCCL cannot carry {other}"))),
    })
}

fn nccl_op(op: ReduceOp) -> nccl_sys::ncclRedOp_t {
    use nccl_sys::ncclRedOp_t::*;
    match op {
        ReduceOp::Sum => ncclSum,
        ReduceOp::Max => ncclMax,
        ReduceOp::Min => ncclMin,
        ReduceOp::Prod => ncclProd,
    }
}

/// The dims of `shape` around `axis` split into `parts`: (pre, parts, d / parts, post).
fn around(shape: &[usize], axis: usize, parts: usize) -> (usize, usize, usize) {
    let pre: usize = shape[..axis].iter().product();
    let post: usize = shape[axis + 1..].iter().product();
    (pre, shape[axis] / parts.max(1), post)
}

impl NcclComm {
    /// Joins the world of `bootstrap` with NCCL on `device`: rank 0's unique id goes to
    /// every rank over the bootstrap. Every rank must call it.
    pub fn new(device: Arc<CudaDevice>, bootstrap: Arc<dyn Communicator>) -> CudaResult<NcclComm> {
        probe::require(Library::Nccl)?;
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        let c = NcclComm {
            device,
            bootstrap,
            comms: Mutex::new(Comms(HashMap::new())),
            rank,
            size,
        };
        c.comm_for(&(0..size).collect::<Vec<_>>())?;
        Ok(c)
    }

    /// NCCL's version (`2.28.3` as 22803).
    pub fn version() -> CudaResult<i32> {
        probe::require(Library::Nccl)?;
        nccl::get_nccl_version().map_err(nccl_err("ncclGetVersion"))
    }

    /// The NCCL communicator of `group` (sorted global ranks holding this rank), created on
    /// first use.
    fn comm_for(&self, group: &[usize]) -> CudaResult<nccl_sys::ncclComm_t> {
        let mut comms = self.comms.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&c) = comms.0.get(group) {
            return Ok(c as nccl_sys::ncclComm_t);
        }
        let me = group.iter().position(|&r| r == self.rank).ok_or_else(|| {
            CudaError::Other(format!("rank {} is not in group {group:?}", self.rank))
        })?;
        let leader = group[0];
        let tag = ID_TAG + comms.0.len() as i64;
        let id_ty = TensorType::new(DType::Int32, vec![32]);
        let boot = |e: CommError| CudaError::Other(format!("handing out the NCCL id: {e}"));
        let id = if me == 0 {
            let id = nccl::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
            let words: Vec<i32> = id
                .internal
                .chunks(4)
                .map(|c| i32::from_ne_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]))
                .collect();
            let t = Tensor::from_i32(vec![32], words)
                .ok_or_else(|| CudaError::Other("the NCCL id is not 128 bytes".into()))?;
            for &r in &group[1..] {
                self.bootstrap.send(r, tag, &t).map_err(boot)?;
            }
            id
        } else {
            let t = self.bootstrap.recv(leader, tag, &id_ty).map_err(boot)?;
            let mut id = nccl_sys::ncclUniqueId { internal: [0; 128] };
            if let shardc_runtime::Data::I32(words) = &t.data {
                for (i, w) in words.iter().enumerate() {
                    for (j, b) in w.to_ne_bytes().iter().enumerate() {
                        id.internal[i * 4 + j] = *b as _;
                    }
                }
            }
            id
        };
        self.device.bind()?;
        let mut comm: nccl_sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is written by NCCL; every member calls with the same id and size.
        unsafe { nccl::comm_init_rank(&mut comm, group.len() as i32, id, me as i32) }
            .map_err(nccl_err("ncclCommInitRank"))?;
        comms.0.insert(group.to_vec(), comm as usize);
        Ok(comm)
    }

    fn stream(&self) -> nccl_sys::cudaStream_t {
        self.device.stream_handle() as nccl_sys::cudaStream_t
    }

    /// Copies `src` (shape `(pre, parts, d, post)` read as `(parts, pre, d, post)`) into
    /// `dst`: `to_parts` makes each part contiguous (before a scatter), otherwise the
    /// reverse (after a gather).
    #[allow(clippy::too_many_arguments)]
    fn rearrange(
        &self,
        dtype: DType,
        src: DevPtr,
        dst: DevPtr,
        (pre, parts, d, post): (usize, usize, usize, usize),
        to_parts: bool,
    ) -> CudaResult<()> {
        let s = crate::ops::copy_suffix(dtype)
            .ok_or_else(|| CudaError::Other(format!("cannot rearrange {dtype} on the GPU")))?;
        let n = pre * parts * d * post;
        let (out, strides) = if to_parts {
            // dst (parts, pre, d, post) from src (pre, parts, d, post)
            let st = contiguous_strides(&[pre, parts, d, post]);
            (vec![parts, pre, d, post], vec![st[1], st[0], st[2], st[3]])
        } else {
            // dst (pre, parts, d, post) from src (parts, pre, d, post)
            let st = contiguous_strides(&[parts, pre, d, post]);
            (vec![pre, parts, d, post], vec![st[1], st[0], st[2], st[3]])
        };
        let st = Strided::single(&out, &strides)
            .ok_or_else(|| CudaError::Other("rearrangement of more than 8 dims".into()))?;
        let grid = (n.div_ceil(256).max(1) as u64).min(self.device.max_grid() as u64) as u32;
        self.device.launch(
            &format!("strided_copy_{s}"),
            grid,
            self.device.block_size(),
            &[
                KernelArg::Ptr(src),
                KernelArg::Ptr(dst),
                KernelArg::I64(n as i64),
                KernelArg::Strided(Box::new(st)),
            ],
        )
    }

    /// An in-place AllReduce of `count` elements at `buf` over `group` on the device's
    /// communication stream (a gradient bucket), after the kernels issued so far; the caller
    /// records an event after it and orders the readers after that event.
    pub fn all_reduce_on_comm_stream(
        &self,
        group: &[usize],
        op: ReduceOp,
        buf: DevPtr,
        count: usize,
        dtype: DType,
    ) -> CudaResult<()> {
        let dt = nccl_dtype(dtype)?;
        let c = self.comm_for(group)?;
        self.device.comm_after_compute()?;
        let stream = self.device.comm_stream_handle() as nccl_sys::cudaStream_t;
        // SAFETY: `buf` holds `count` elements (the executor's bucket).
        unsafe {
            nccl::all_reduce(
                buf as *const c_void,
                buf as *mut c_void,
                count,
                dt,
                nccl_op(op),
                c,
                stream,
            )
        }
        .map(drop)
        .map_err(nccl_err("ncclAllReduce"))
    }

    /// Runs a resolved collective on device memory: `input` (absent for Receive) into `out`
    /// of type `out_ty`, ordered on the device's stream after the kernels before it.
    pub fn run_on_device(
        &self,
        call: &CommCall,
        input: Option<(DevPtr, &TensorType)>,
        (out, out_ty): (DevPtr, &TensorType),
    ) -> CudaResult<()> {
        let dt = nccl_dtype(out_ty.dtype)?;
        let stream = self.stream();
        let count = out_ty.num_elements();
        let need = || input.ok_or_else(|| CudaError::Other("the collective has no operand".into()));
        let ptr = |p: DevPtr| p as *const c_void;
        let mptr = |p: DevPtr| p as *mut c_void;
        let temp = |bytes: usize| -> CudaResult<DevPtr> { self.device.alloc(bytes) };
        let elem = out_ty.dtype.size_bytes();
        self.device.bind()?;
        match call {
            CommCall::AllReduce { group, op } => {
                let (x, _) = need()?;
                let c = self.comm_for(group)?;
                // SAFETY: device buffers of `count` elements (the executor's plan).
                unsafe { nccl::all_reduce(ptr(x), mptr(out), count, dt, nccl_op(*op), c, stream) }
                    .map_err(nccl_err("ncclAllReduce"))?;
            }
            CommCall::Broadcast { group, root } => {
                let (x, _) = need()?;
                let c = self.comm_for(group)?;
                let r = group.iter().position(|g| g == root).unwrap_or(0) as i32;
                // SAFETY: as above.
                unsafe { nccl::broadcast(ptr(x), mptr(out), count, dt, r, c, stream) }
                    .map_err(nccl_err("ncclBroadcast"))?;
            }
            CommCall::AllGather { group, axis } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let n = tx.num_elements();
                if *axis == 0 {
                    // SAFETY: `out` holds g * n elements.
                    unsafe { nccl::all_gather(ptr(x), mptr(out), n, dt, c, stream) }
                        .map_err(nccl_err("ncclAllGather"))?;
                } else {
                    let t = temp(g * n * elem)?;
                    // SAFETY: `t` holds g * n elements.
                    let r = unsafe { nccl::all_gather(ptr(x), mptr(t), n, dt, c, stream) }
                        .map_err(nccl_err("ncclAllGather"));
                    let (pre, d, post) = around(&tx.shape, *axis, 1);
                    let r = r.and_then(|_| {
                        self.rearrange(out_ty.dtype, t, out, (pre, g, d, post), false)
                    });
                    self.device.synchronize()?;
                    self.device.free(t);
                    r?;
                }
            }
            CommCall::ReduceScatter { group, op, axis } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                if *axis == 0 {
                    // SAFETY: `x` holds g * count elements.
                    unsafe {
                        nccl::reduce_scatter(ptr(x), mptr(out), count, dt, nccl_op(*op), c, stream)
                    }
                    .map_err(nccl_err("ncclReduceScatter"))?;
                } else {
                    let t = temp(tx.num_elements() * elem)?;
                    let (pre, d, post) = around(&tx.shape, *axis, g);
                    let r = self
                        .rearrange(out_ty.dtype, x, t, (pre, g, d, post), true)
                        .and_then(|_| {
                            // SAFETY: `t` holds g * count elements.
                            unsafe {
                                nccl::reduce_scatter(
                                    ptr(t),
                                    mptr(out),
                                    count,
                                    dt,
                                    nccl_op(*op),
                                    c,
                                    stream,
                                )
                            }
                            .map(drop)
                            .map_err(nccl_err("ncclReduceScatter"))
                        });
                    self.device.synchronize()?;
                    self.device.free(t);
                    r?;
                }
            }
            CommCall::AllToAll {
                group,
                split_dim,
                concat_dim,
            } => {
                let (x, tx) = need()?;
                let c = self.comm_for(group)?;
                let g = group.len();
                let n = tx.num_elements();
                let part = n / g.max(1);
                let (send, recv) = (temp(n * elem)?, temp(n * elem)?);
                let (pre, d, post) = around(&tx.shape, *split_dim, g);
                let mut r = self.rearrange(out_ty.dtype, x, send, (pre, g, d, post), true);
                if r.is_ok() {
                    r = (|| {
                        nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
                        for j in 0..g {
                            // SAFETY: part j of `send` and `recv`, `part` elements each.
                            unsafe {
                                nccl::send(
                                    ptr(send + (j * part * elem) as u64),
                                    part,
                                    dt,
                                    j as i32,
                                    c,
                                    stream,
                                )
                                .map_err(nccl_err("ncclSend"))?;
                                nccl::recv(
                                    mptr(recv + (j * part * elem) as u64),
                                    part,
                                    dt,
                                    j as i32,
                                    c,
                                    stream,
                                )
                                .map_err(nccl_err("ncclRecv"))?;
                            }
                        }
                        nccl::group_end().map_err(nccl_err("ncclGroupEnd"))?;
                        Ok(())
                    })();
                }
                if r.is_ok() {
                    // The received parts (g, part) concatenate along concat_dim of the part's shape.
                    let mut part_shape = tx.shape.clone();
                    part_shape[*split_dim] /= g.max(1);
                    let (pre, d, post) = around(&part_shape, *concat_dim, 1);
                    r = self.rearrange(out_ty.dtype, recv, out, (pre, g, d, post), false);
                }
                self.device.synchronize()?;
                self.device.free(send);
                self.device.free(recv);
                r?;
            }
            CommCall::Send { dest, .. } => {
                let (x, tx) = need()?;
                let world: Vec<usize> = (0..self.size).collect();
                let c = self.comm_for(&world)?;
                // SAFETY: `x` holds the tensor.
                unsafe { nccl::send(ptr(x), tx.num_elements(), dt, *dest as i32, c, stream) }
                    .map_err(nccl_err("ncclSend"))?;
                self.device.copy(out, x, tx.num_elements() * elem)?;
            }
            CommCall::Receive { src, .. } => {
                let world: Vec<usize> = (0..self.size).collect();
                let c = self.comm_for(&world)?;
                // SAFETY: `out` holds `count` elements.
                unsafe { nccl::recv(mptr(out), count, dt, *src as i32, c, stream) }
                    .map_err(nccl_err("ncclRecv"))?;
            }
        }
        Ok(())
    }

    /// Stages a host collective through device memory.
    fn staged(
        &self,
        collective: Collective,
        group: &[usize],
        call: CommCall,
        input: Option<&Tensor>,
        out_ty: TensorType,
    ) -> Result<Tensor, CommError> {
        check_group(collective, group, self.rank, self.size)?;
        let fail = |e: CudaError| CommError::Transport {
            collective,
            group: group.to_vec(),
            rank: self.rank,
            reason: e.to_string(),
        };
        let run = || -> CudaResult<Tensor> {
            let inp = match input {
                Some(t) => {
                    let p = self.device.alloc(t.size_bytes())?;
                    self.device.upload(p, &crate::executor::tensor_bytes(t))?;
                    Some((p, t.ty()))
                }
                None => None,
            };
            let out = self
                .device
                .alloc(out_ty.num_elements() * out_ty.dtype.size_bytes())?;
            let r = self.run_on_device(&call, inp.as_ref().map(|(p, t)| (*p, t)), (out, &out_ty));
            let mut bytes = vec![0u8; out_ty.num_elements() * out_ty.dtype.size_bytes()];
            let d = r.and_then(|_| self.device.download(out, &mut bytes));
            if let Some((p, _)) = inp {
                self.device.free(p);
            }
            self.device.free(out);
            d?;
            Ok(crate::executor::tensor_of(&out_ty, &bytes))
        };
        run().map_err(fail)
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(
        &self,
        group: &[usize],
        op: ReduceOp,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let call = CommCall::AllReduce {
            group: group.to_vec(),
            op,
        };
        *tensor = self.staged(
            Collective::AllReduce,
            group,
            call,
            Some(tensor),
            tensor.ty(),
        )?;
        Ok(())
    }

    fn all_gather(
        &self,
        group: &[usize],
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let mut ty = input.ty();
        if axis >= ty.shape.len() {
            return Err(CommError::InvalidArgument {
                collective: Collective::AllGather,
                group: group.to_vec(),
                rank: self.rank,
                reason: format!("axis {axis} is out of range for {ty}"),
            });
        }
        ty.shape[axis] *= group.len();
        let call = CommCall::AllGather {
            group: group.to_vec(),
            axis,
        };
        self.staged(Collective::AllGather, group, call, Some(input), ty)
    }

    fn reduce_scatter(
        &self,
        group: &[usize],
        op: ReduceOp,
        axis: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let mut ty = input.ty();
        if axis >= ty.shape.len() || ty.shape[axis] % group.len().max(1) != 0 {
            return Err(CommError::InvalidArgument {
                collective: Collective::ReduceScatter,
                group: group.to_vec(),
                rank: self.rank,
                reason: format!(
                    "axis {axis} of {ty} does not split into {} parts",
                    group.len()
                ),
            });
        }
        ty.shape[axis] /= group.len();
        let call = CommCall::ReduceScatter {
            group: group.to_vec(),
            op,
            axis,
        };
        self.staged(Collective::ReduceScatter, group, call, Some(input), ty)
    }

    fn all_to_all(
        &self,
        group: &[usize],
        split_dim: usize,
        concat_dim: usize,
        input: &Tensor,
    ) -> Result<Tensor, CommError> {
        let mut ty = input.ty();
        let g = group.len().max(1);
        if split_dim >= ty.shape.len()
            || concat_dim >= ty.shape.len()
            || ty.shape[split_dim] % g != 0
        {
            return Err(CommError::InvalidArgument {
                collective: Collective::AllToAll,
                group: group.to_vec(),
                rank: self.rank,
                reason: format!("{ty} does not split along {split_dim} into {g} parts"),
            });
        }
        ty.shape[split_dim] /= g;
        ty.shape[concat_dim] *= g;
        let call = CommCall::AllToAll {
            group: group.to_vec(),
            split_dim,
            concat_dim,
        };
        self.staged(Collective::AllToAll, group, call, Some(input), ty)
    }

    fn broadcast(
        &self,
        group: &[usize],
        root: usize,
        tensor: &mut Tensor,
    ) -> Result<(), CommError> {
        let call = CommCall::Broadcast {
            group: group.to_vec(),
            root,
        };
        *tensor = self.staged(
            Collective::Broadcast,
            group,
            call,
            Some(tensor),
            tensor.ty(),
        )?;
        Ok(())
    }

    fn send(&self, dest: usize, tag: i64, tensor: &Tensor) -> Result<(), CommError> {
        let world: Vec<usize> = (0..self.size).collect();
        let call = CommCall::Send { dest, tag };
        self.staged(Collective::Send, &world, call, Some(tensor), tensor.ty())
            .map(drop)
    }

    fn recv(&self, src: usize, tag: i64, ty: &TensorType) -> Result<Tensor, CommError> {
        let world: Vec<usize> = (0..self.size).collect();
        let call = CommCall::Receive { src, tag };
        self.staged(Collective::Receive, &world, call, None, ty.clone())
    }

    fn barrier(&self, group: &[usize]) -> Result<(), CommError> {
        let mut t = Tensor::zeros(&TensorType::new(DType::Float32, vec![1]));
        self.all_reduce(group, ReduceOp::Sum, &mut t)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let comms = std::mem::take(&mut self.comms.lock().unwrap_or_else(|p| p.into_inner()).0);
        if self.device.bind().is_ok() {
            for (_, c) in comms {
                // SAFETY: communicators created in `comm_for`, destroyed once.
                let _ = unsafe { nccl::comm_destroy(c as nccl_sys::ncclComm_t) };
            }
        }
    }
}
