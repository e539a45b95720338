//! nnopbase exports (`libnnopbase.so`): the aclnn argument descriptors.
//!
//! # Safety
//!
//! Every export is an `unsafe extern "C" fn` called from C: each pointer argument must be
//! null or valid for the reads and writes the C API documents for it (`shardc_ascend_sys::sig`);
//! handles are checked against the emulator's registries, so a stale one is an error code.
#![allow(clippy::missing_safety_doc)]

use crate::dtype::DType;
use crate::tensor::{self, Obj, Scalar, TensorDesc};
use crate::{bail, check_sigs, ffi};
use shardc_ascend_sys::{
    aclBoolArray, aclDataType, aclFormat, aclIntArray, aclScalar, aclTensor, aclTensorList,
    aclnnStatus,
};
use std::ffi::c_void;
use std::sync::Arc;

unsafe fn slice<'a, T>(p: *const T, n: u64) -> &'a [T] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p, n as usize)
    }
}

/// `aclCreateTensor`: validates the view against the storage (null on a bad argument).
#[no_mangle]
pub unsafe extern "C" fn aclCreateTensor(
    view_dims: *const i64,
    view_dims_num: u64,
    data_type: aclDataType,
    stride: *const i64,
    offset: i64,
    format: aclFormat,
    storage_dims: *const i64,
    storage_dims_num: u64,
    tensor_data: *mut c_void,
) -> *mut aclTensor {
    let api = "aclCreateTensor";
    ffi::ptr(api, || {
        if view_dims_num > 0 && (view_dims.is_null() || stride.is_null()) {
            bail!(
                NullPtr,
                "{api}: viewDims or stride is null with {view_dims_num} dims"
            );
        }
        if storage_dims_num > 0 && storage_dims.is_null() {
            bail!(
                NullPtr,
                "{api}: storageDims is null with {storage_dims_num} dims"
            );
        }
        if view_dims_num > 8 || storage_dims_num > 8 {
            bail!(
                InvalidParam,
                "{api}: {view_dims_num} view dims / {storage_dims_num} storage dims (at most 8)"
            );
        }
        let t = TensorDesc {
            dims: slice(view_dims, view_dims_num).to_vec(),
            strides: slice(stride, view_dims_num).to_vec(),
            offset,
            dtype: DType::parse(api, data_type)?,
            format,
            storage: slice(storage_dims, storage_dims_num).to_vec(),
            data: tensor_data as u64,
        };
        t.validate(api)?;
        if !(-1..=2).contains(&format) {
            bail!(
                NotSupported,
                "{api}: aclFormat {format} is not a plain layout (ND, NCHW, NHWC); the emulator has no private formats"
            );
        }
        Ok(tensor::put(Obj::Tensor(Arc::new(t))) as *mut aclTensor)
    })
}

/// `aclCreateScalar`: copies the host value.
#[no_mangle]
pub unsafe extern "C" fn aclCreateScalar(
    value: *mut c_void,
    data_type: aclDataType,
) -> *mut aclScalar {
    let api = "aclCreateScalar";
    ffi::ptr(api, || {
        if value.is_null() {
            bail!(NullPtr, "{api}: value is null");
        }
        let dt = DType::parse(api, data_type)?;
        let b = std::slice::from_raw_parts(value as *const u8, dt.size());
        let v = if dt.is_int() {
            dt.load_i64(b, 0) as f64
        } else {
            dt.load(b, 0)
        };
        Ok(tensor::put(Obj::Scalar(Scalar {
            value: v,
            dtype: dt,
        })) as *mut aclScalar)
    })
}

/// `aclCreateIntArray`.
#[no_mangle]
pub unsafe extern "C" fn aclCreateIntArray(value: *const i64, size: u64) -> *mut aclIntArray {
    let api = "aclCreateIntArray";
    ffi::ptr(api, || {
        if size > 0 && value.is_null() {
            bail!(NullPtr, "{api}: value is null with size {size}");
        }
        Ok(tensor::put(Obj::IntArray(slice(value, size).to_vec())) as *mut aclIntArray)
    })
}

/// `aclCreateBoolArray`.
#[no_mangle]
pub unsafe extern "C" fn aclCreateBoolArray(value: *const bool, size: u64) -> *mut aclBoolArray {
    let api = "aclCreateBoolArray";
    ffi::ptr(api, || {
        if size > 0 && value.is_null() {
            bail!(NullPtr, "{api}: value is null with size {size}");
        }
        // Read as bytes: a C bool that is not 0/1 must not become an invalid Rust bool.
        let bytes = slice(value as *const u8, size);
        Ok(
            tensor::put(Obj::BoolArray(bytes.iter().map(|&b| b != 0).collect()))
                as *mut aclBoolArray,
        )
    })
}

/// `aclCreateTensorList`: the list owns the tensors.
#[no_mangle]
pub unsafe extern "C" fn aclCreateTensorList(
    value: *const *const aclTensor,
    size: u64,
) -> *mut aclTensorList {
    let api = "aclCreateTensorList";
    ffi::ptr(api, || {
        if size > 0 && value.is_null() {
            bail!(NullPtr, "{api}: value is null with size {size}");
        }
        let hs: Vec<usize> = slice(value, size).iter().map(|&p| p as usize).collect();
        for (i, &h) in hs.iter().enumerate() {
            tensor::tensor(api, &format!("value[{i}]"), h)?;
        }
        Ok(tensor::put(Obj::TensorList(hs)) as *mut aclTensorList)
    })
}

macro_rules! destroy {
    ($name:ident, $ty:ty, $kind:literal) => {
        #[doc = concat!("`", stringify!($name), "`.")]
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *const $ty) -> aclnnStatus {
            let api = stringify!($name);
            ffi::nn(api, || {
                if p.is_null() {
                    bail!(NullPtr, "{api}: null");
                }
                tensor::destroy(api, p as usize, $kind)
            })
        }
    };
}

destroy!(aclDestroyTensor, aclTensor, "aclTensor");
destroy!(aclDestroyScalar, aclScalar, "aclScalar");
destroy!(aclDestroyIntArray, aclIntArray, "aclIntArray");
destroy!(aclDestroyBoolArray, aclBoolArray, "aclBoolArray");
destroy!(aclDestroyTensorList, aclTensorList, "aclTensorList");

check_sigs!(
    aclCreateTensor,
    aclCreateScalar,
    aclCreateIntArray,
    aclCreateBoolArray,
    aclCreateTensorList,
    aclDestroyTensor,
    aclDestroyScalar,
    aclDestroyIntArray,
    aclDestroyBoolArray,
    aclDestroyTensorList,
);
