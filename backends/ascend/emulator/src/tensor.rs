//! aclnn's argument objects: tensors (views on device memory), scalars, int / float / bool
//! arrays and tensor lists, behind fake handles; and the gather / scatter of a strided view.
//!
//! A tensor is `tensorData` (the start of its storage), a view (`viewDims`, `strides` in
//! elements, `offset` in elements into the storage), a dtype, a format and the storage dims.
//! Element `idx` of the view lives at `tensorData + (offset + Σ idx[i]·strides[i]) · size`.

use crate::diag::EmuResult;
use crate::dtype::DType;
use crate::mem::{AccessReq, Resolved};
use crate::{bail, emu_err};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A tensor descriptor as made by `aclCreateTensor`.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    /// View dims.
    pub dims: Vec<i64>,
    /// View strides, in elements.
    pub strides: Vec<i64>,
    /// Offset of the view's first element in the storage, in elements.
    pub offset: i64,
    /// Element type.
    pub dtype: DType,
    /// aclFormat value (kept, not interpreted beyond ND/NCHW being plain layouts).
    pub format: i32,
    /// Storage dims.
    pub storage: Vec<i64>,
    /// Device address of the storage.
    pub data: u64,
}

/// Number of elements of `dims`.
pub fn numel(dims: &[i64]) -> usize {
    dims.iter().map(|&d| d.max(0) as usize).product()
}

/// Contiguous row-major strides of `dims`.
pub fn contiguous_strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1].max(1);
    }
    s
}

impl TensorDesc {
    /// Checks a descriptor as `aclCreateTensor` would.
    pub fn validate(&self, api: &str) -> EmuResult<()> {
        if self.dims.len() != self.strides.len() {
            bail!(
                InvalidParam,
                "{api}: {} view dims but {} strides",
                self.dims.len(),
                self.strides.len()
            );
        }
        if self.dims.len() > 8 {
            bail!(InvalidParam, "{api}: {} dims (at most 8)", self.dims.len());
        }
        if let Some(d) = self.dims.iter().chain(&self.storage).find(|&&d| d < 0) {
            bail!(
                InvalidParam,
                "{api}: negative dim {d} in {:?} / storage {:?}",
                self.dims,
                self.storage
            );
        }
        if let Some(s) = self.strides.iter().find(|&&s| s < 0) {
            bail!(
                InvalidParam,
                "{api}: negative stride {s} in {:?}",
                self.strides
            );
        }
        if self.offset < 0 {
            bail!(InvalidParam, "{api}: negative offset {}", self.offset);
        }
        if self.numel() > 0 {
            let last = self.offset + self.max_rel();
            let cap = numel(&self.storage) as i64;
            if last >= cap {
                bail!(
                    InvalidParam,
                    "{api}: the view (dims {:?}, strides {:?}, offset {}) reaches element {last} but the storage {:?} has {cap}",
                    self.dims,
                    self.strides,
                    self.offset,
                    self.storage
                );
            }
        }
        Ok(())
    }

    /// Number of elements of the view.
    pub fn numel(&self) -> usize {
        numel(&self.dims)
    }

    fn max_rel(&self) -> i64 {
        self.dims
            .iter()
            .zip(&self.strides)
            .map(|(&d, &s)| (d - 1).max(0) * s)
            .sum()
    }

    /// The device bytes the view touches, as an access request.
    pub fn req(&self, write: bool, role: &str) -> AccessReq {
        let es = self.dtype.size() as u64;
        let (addr, len) = if self.numel() == 0 {
            (self.data, 0)
        } else {
            (
                self.data + self.offset as u64 * es,
                (self.max_rel() as u64 + 1) * es,
            )
        };
        AccessReq {
            addr,
            len,
            write,
            role: role.to_string(),
        }
    }

    /// Element offsets (relative to the view's first element) of the view in row-major order.
    pub fn offsets(&self) -> Vec<usize> {
        let n = self.numel();
        let mut out = Vec::with_capacity(n);
        if n == 0 {
            return out;
        }
        let r = self.dims.len();
        let mut idx = vec![0i64; r];
        let mut off = 0i64;
        for _ in 0..n {
            out.push(off as usize);
            for k in (0..r).rev() {
                idx[k] += 1;
                off += self.strides[k];
                if idx[k] < self.dims[k] {
                    break;
                }
                off -= self.strides[k] * self.dims[k];
                idx[k] = 0;
            }
        }
        out
    }

    /// Whether the view is contiguous row-major.
    pub fn is_contiguous(&self) -> bool {
        let c = contiguous_strides(&self.dims);
        self.dims
            .iter()
            .zip(self.strides.iter().zip(&c))
            .all(|(&d, (&s, &cs))| d <= 1 || s == cs)
    }

    /// Reads the view as f64 values in row-major order.
    pub fn read_f64(&self, r: &Resolved) -> Vec<f64> {
        let dt = self.dtype;
        r.data.with(|b| {
            let b = &b[r.offset..r.offset + r.len];
            if self.is_contiguous() {
                (0..self.numel()).map(|i| dt.load(b, i)).collect()
            } else {
                self.offsets().into_iter().map(|o| dt.load(b, o)).collect()
            }
        })
    }

    /// Reads the view as f32 values in row-major order.
    pub fn read_f32(&self, r: &Resolved) -> Vec<f32> {
        if self.dtype == DType::F32 {
            return r.data.with(|b| {
                let b = &b[r.offset..r.offset + r.len];
                let load = |o: usize| f32::from_le_bytes(crate::dtype::bytes(&b[o * 4..o * 4 + 4]));
                if self.is_contiguous() {
                    (0..self.numel()).map(load).collect()
                } else {
                    self.offsets().into_iter().map(load).collect()
                }
            });
        }
        self.read_f64(r).into_iter().map(|v| v as f32).collect()
    }

    /// Reads the view as i64 values in row-major order.
    pub fn read_i64(&self, r: &Resolved) -> Vec<i64> {
        let dt = self.dtype;
        r.data.with(|b| {
            let b = &b[r.offset..r.offset + r.len];
            self.offsets()
                .into_iter()
                .map(|o| dt.load_i64(b, o))
                .collect()
        })
    }

    /// Writes `vals` (row-major) into the view, converting to its dtype.
    pub fn write_f64(&self, r: &Resolved, vals: &[f64]) {
        let dt = self.dtype;
        r.data.with(|b| {
            let b = &mut b[r.offset..r.offset + r.len];
            for (o, &v) in self.offsets().into_iter().zip(vals) {
                dt.store(b, o, v);
            }
        })
    }

    /// Writes `vals` (row-major) into the view, converting to its dtype.
    pub fn write_f32(&self, r: &Resolved, vals: &[f32]) {
        let dt = self.dtype;
        r.data.with(|b| {
            let b = &mut b[r.offset..r.offset + r.len];
            if dt == DType::F32 {
                for (o, &v) in self.offsets().into_iter().zip(vals) {
                    b[o * 4..o * 4 + 4].copy_from_slice(&v.to_le_bytes());
                }
            } else {
                for (o, &v) in self.offsets().into_iter().zip(vals) {
                    dt.store(b, o, v as f64);
                }
            }
        })
    }

    /// Writes integers (row-major) into the view.
    pub fn write_i64(&self, r: &Resolved, vals: &[i64]) {
        let dt = self.dtype;
        r.data.with(|b| {
            let b = &mut b[r.offset..r.offset + r.len];
            for (o, &v) in self.offsets().into_iter().zip(vals) {
                dt.store_i64(b, o, v);
            }
        })
    }

    /// Short description for messages: `f32[2, 3]`.
    pub fn show(&self) -> String {
        format!("{:?}{:?}", self.dtype, self.dims)
    }
}

/// A scalar made by `aclCreateScalar`.
#[derive(Clone, Copy, Debug)]
pub struct Scalar {
    /// Its value.
    pub value: f64,
    /// Its type.
    pub dtype: DType,
}

/// One object behind an aclnn handle.
#[derive(Clone, Debug)]
pub enum Obj {
    /// aclTensor.
    Tensor(Arc<TensorDesc>),
    /// aclScalar.
    Scalar(Scalar),
    /// aclIntArray.
    IntArray(Vec<i64>),
    /// aclFloatArray.
    FloatArray(Vec<f32>),
    /// aclBoolArray.
    BoolArray(Vec<bool>),
    /// aclTensorList: handles of its tensors (owned by the list).
    TensorList(Vec<usize>),
    /// aclScalarList: handles of its scalars (owned by the list).
    ScalarList(Vec<usize>),
}

impl Obj {
    fn kind(&self) -> &'static str {
        match self {
            Obj::Tensor(_) => "aclTensor",
            Obj::Scalar(_) => "aclScalar",
            Obj::IntArray(_) => "aclIntArray",
            Obj::FloatArray(_) => "aclFloatArray",
            Obj::BoolArray(_) => "aclBoolArray",
            Obj::TensorList(_) => "aclTensorList",
            Obj::ScalarList(_) => "aclScalarList",
        }
    }
}

const OBJ_TAG: usize = 0x6a00_0000_0000;

fn objs() -> &'static Mutex<HashMap<usize, Obj>> {
    static O: OnceLock<Mutex<HashMap<usize, Obj>>> = OnceLock::new();
    O.get_or_init(Default::default)
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<usize, Obj>> {
    objs().lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `o` and returns its handle.
pub fn put(o: Obj) -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let h = OBJ_TAG + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 16;
    lock().insert(h, o);
    h
}

/// Destroys the object `h`, which must be a `kind`; lists destroy their members.
pub fn destroy(api: &str, h: usize, kind: &str) -> EmuResult<()> {
    let mut m = lock();
    match m.get(&h) {
        None => bail!(
            InvalidParam,
            "{api}: {h:#x} is not a live {kind} (destroyed twice?)"
        ),
        Some(o) if o.kind() != kind => {
            bail!(
                InvalidParam,
                "{api}: {h:#x} is an {}, not an {kind}",
                o.kind()
            )
        }
        Some(_) => {}
    }
    match m.remove(&h) {
        Some(Obj::TensorList(v)) | Some(Obj::ScalarList(v)) => {
            for x in v {
                m.remove(&x);
            }
        }
        _ => {}
    }
    Ok(())
}

fn get(api: &str, role: &str, h: usize) -> EmuResult<Obj> {
    if h == 0 {
        bail!(NullPtr, "{api}: {role} is null");
    }
    lock().get(&h).cloned().ok_or_else(|| {
        emu_err!(
            InvalidParam,
            "{api}: {role} ({h:#x}) is not a live aclnn object (destroyed, or never created)"
        )
    })
}

/// The tensor behind handle `h` (`role` names the argument in messages).
pub fn tensor(api: &str, role: &str, h: usize) -> EmuResult<Arc<TensorDesc>> {
    match get(api, role, h)? {
        Obj::Tensor(t) => Ok(t),
        o => bail!(
            InvalidParam,
            "{api}: {role} is an {}, not an aclTensor",
            o.kind()
        ),
    }
}

/// The tensor behind `h`, or None when `h` is null (optional arguments).
pub fn opt_tensor(api: &str, role: &str, h: usize) -> EmuResult<Option<Arc<TensorDesc>>> {
    if h == 0 {
        Ok(None)
    } else {
        tensor(api, role, h).map(Some)
    }
}

/// The scalar behind handle `h`.
pub fn scalar(api: &str, role: &str, h: usize) -> EmuResult<Scalar> {
    match get(api, role, h)? {
        Obj::Scalar(s) => Ok(s),
        o => bail!(
            InvalidParam,
            "{api}: {role} is an {}, not an aclScalar",
            o.kind()
        ),
    }
}

/// The int array behind handle `h`.
pub fn int_array(api: &str, role: &str, h: usize) -> EmuResult<Vec<i64>> {
    match get(api, role, h)? {
        Obj::IntArray(v) => Ok(v),
        o => bail!(
            InvalidParam,
            "{api}: {role} is an {}, not an aclIntArray",
            o.kind()
        ),
    }
}

/// The bool array behind handle `h`.
pub fn bool_array(api: &str, role: &str, h: usize) -> EmuResult<Vec<bool>> {
    match get(api, role, h)? {
        Obj::BoolArray(v) => Ok(v),
        o => bail!(
            InvalidParam,
            "{api}: {role} is an {}, not an aclBoolArray",
            o.kind()
        ),
    }
}

/// The float array behind handle `h`.
pub fn float_array(api: &str, role: &str, h: usize) -> EmuResult<Vec<f32>> {
    match get(api, role, h)? {
        Obj::FloatArray(v) => Ok(v),
        o => bail!(
            InvalidParam,
            "{api}: {role} is an {}, not an aclFloatArray",
            o.kind()
        ),
    }
}

/// The tensors of the tensor list behind handle `h`.
pub fn tensor_list(api: &str, role: &str, h: usize) -> EmuResult<Vec<Arc<TensorDesc>>> {
    match get(api, role, h)? {
        Obj::TensorList(v) => v
            .iter()
            .enumerate()
            .map(|(i, &t)| tensor(api, &format!("{role}[{i}]"), t))
            .collect(),
        o => bail!(
            InvalidParam,
            "{api}: {role} is an {}, not an aclTensorList",
            o.kind()
        ),
    }
}

/// Number of elements of a list or array object (aclGetIntArraySize & co).
pub fn size_of(api: &str, h: usize) -> EmuResult<u64> {
    Ok(match get(api, "the object", h)? {
        Obj::IntArray(v) => v.len() as u64,
        Obj::FloatArray(v) => v.len() as u64,
        Obj::BoolArray(v) => v.len() as u64,
        Obj::TensorList(v) | Obj::ScalarList(v) => v.len() as u64,
        o => bail!(InvalidParam, "{api}: an {} has no size", o.kind()),
    })
}

/// Replaces the tensor behind `h` (aclSetInputTensorAddr & co change the data pointer).
pub fn replace_tensor(h: usize, t: TensorDesc) {
    lock().insert(h, Obj::Tensor(Arc::new(t)));
}
