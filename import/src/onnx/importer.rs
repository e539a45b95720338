//! The state of one ONNX import ([`Importer`]), the node being read ([`Ctx`]), the values
//! ([`Val`]: graph tensors or constants known at import time), and the naming and decoding
//! helpers the op mappings (`map`) share.

use super::consts::{code, dtype_of_code, ConstT};
use crate::model::{placeholder_init, ImportError, UnmappedOp};
use crate::proto::onnx::{NodeProto, TensorProto};
use shardc_compiler::builder::{BuildError, GraphBuilder, Value};
use shardc_ir::{DType, Operand};
use shardc_runtime::tensor::Data;
use shardc_runtime::Tensor;
use std::collections::{HashMap, HashSet};

/// A value of the ONNX graph while it is read.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// A tensor of shardc's graph.
    T(Value),
    /// A tensor known at import time.
    C(ConstT),
    /// The result of a node that could not be mapped (its consumers are skipped).
    Missing,
}

/// A TensorProto's value (raw_data or the typed fields).
pub(crate) fn tensor_value(t: &TensorProto) -> Result<ConstT, String> {
    const EXTERNAL: i32 = 1;
    if t.data_location == Some(EXTERNAL) || !t.external_data.is_empty() {
        let loc = t
            .external_data
            .iter()
            .find(|e| e.key.as_deref() == Some("location"))
            .and_then(|e| e.value.clone())
            .unwrap_or_else(|| "?".into());
        return Err(format!(
            "its data is in the external file `{loc}`, which shardc does not read \
             (save the model with its weights inside: onnx.save(model, f, save_as_external_data=False))"
        ));
    }
    let c = t.data_type.unwrap_or(0);
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        if d < 0 {
            return Err(format!("dimension {d} is negative"));
        }
        shape.push(d as usize);
    }
    let n: usize = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("its shape overflows")?;
    let data: Vec<f64> = if let Some(raw) = &t.raw_data {
        let width = match c {
            code::FLOAT | code::INT32 => 4,
            code::DOUBLE | code::INT64 => 8,
            code::FLOAT16 => 2,
            code::BOOL | code::INT8 | code::UINT8 => 1,
            _ => return Err(format!("element type {c} is not supported")),
        };
        if Some(raw.len()) != n.checked_mul(width) {
            return Err(format!(
                "raw_data has {} bytes, but {n} elements of {width} bytes are needed",
                raw.len()
            ));
        }
        raw.chunks_exact(width)
            .map(|b| {
                let mut a8 = [0u8; 8];
                a8[..width].copy_from_slice(b);
                match c {
                    code::FLOAT => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                    code::INT32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                    code::DOUBLE => f64::from_le_bytes(a8),
                    code::INT64 => i64::from_le_bytes(a8) as f64,
                    code::FLOAT16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
                    code::INT8 => b[0] as i8 as f64,
                    _ => b[0] as f64,
                }
            })
            .collect()
    } else {
        match c {
            code::FLOAT => t.float_data.iter().map(|&v| v as f64).collect(),
            code::DOUBLE => t.double_data.clone(),
            code::INT64 => t.int64_data.iter().map(|&v| v as f64).collect(),
            code::INT32 | code::INT8 | code::UINT8 | code::BOOL => {
                t.int32_data.iter().map(|&v| v as f64).collect()
            }
            code::FLOAT16 => t
                .int32_data
                .iter()
                .map(|&v| half::f16::from_bits(v as u16).to_f64())
                .collect(),
            _ => return Err(format!("element type {c} is not supported")),
        }
    };
    if data.len() != n {
        return Err(format!(
            "it holds {} elements, its shape {shape:?} needs {n}",
            data.len()
        ));
    }
    Ok(ConstT::new(c, shape, data))
}

/// Whether `s` is an identifier (`[A-Za-z_][A-Za-z0-9_]*`), usable as an instance name.
pub(crate) fn is_ident(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A parameter name for an ONNX value name: leading `/` dropped, `/` as `.`, any other
/// character outside `[A-Za-z0-9_.-]` as `_`.
pub(crate) fn param_name(s: &str) -> String {
    let t: String = s
        .trim_start_matches('/')
        .chars()
        .map(|c| match c {
            '/' => '.',
            c if c.is_ascii_alphanumeric() || "_.-".contains(c) => c,
            _ => '_',
        })
        .collect();
    if t.is_empty() {
        "value".into()
    } else {
        t
    }
}

/// Torch's scope and leaf of a node name: `/layer1/layer1.0/conv1/Conv` ->
/// (`layer1/layer1.0/conv1`, `Conv`); characters outside `[A-Za-z0-9_.-/]` in the scope
/// become `_`.
pub(crate) fn scope_and_leaf(name: &str) -> (String, String) {
    let t = name.trim_start_matches('/');
    // The scope is printed in the text IR as `# scope: (...)`: only plain characters.
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-/".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    match t.rsplit_once('/') {
        Some((scope, leaf)) => (clean(scope), leaf.to_string()),
        None => (String::new(), t.to_string()),
    }
}

/// The state of one import.
pub(crate) struct Importer {
    pub(crate) b: GraphBuilder,
    pub(crate) opset: i64,
    /// Every ONNX value read so far, by name.
    pub(crate) vals: HashMap<String, Val>,
    /// The value of every weight, by parameter name.
    pub(crate) weights: HashMap<String, Tensor>,
    /// Constants already made weights: by ONNX value name, the weight.
    pub(crate) materialized: HashMap<String, Value>,
    /// Parameter names in use.
    pub(crate) names: HashSet<String>,
    pub(crate) unmapped: Vec<UnmappedOp>,
}

/// The node being converted, for messages and names.
pub(crate) struct Ctx<'a> {
    pub(crate) node: &'a NodeProto,
    /// The node's name (or its first output's, when it has none).
    pub(crate) name: String,
    pub(crate) op: String,
    /// The instance name the node's main op gets (empty: the op's default).
    pub(crate) inst: String,
}

impl Ctx<'_> {
    /// An [`ImportError::Node`] for this node.
    pub(crate) fn err(&self, reason: impl Into<String>) -> ImportError {
        ImportError::Node {
            node: self.name.clone(),
            op: self.op.clone(),
            reason: reason.into(),
        }
    }

    /// A builder error as an error of this node.
    pub(crate) fn build(&self, e: BuildError) -> ImportError {
        self.err(e.to_string())
    }
}

impl Importer {
    /// A parameter name for `onnx_name` not in use yet.
    pub(crate) fn fresh_name(&mut self, onnx_name: &str) -> String {
        let base = param_name(onnx_name);
        let mut n = base.clone();
        let mut k = 2;
        while self.names.contains(&n) {
            n = format!("{base}_{k}");
            k += 1;
        }
        self.names.insert(n.clone());
        n
    }

    /// The weight holding constant `c` (named after `key`, its ONNX value name), made once.
    pub(crate) fn materialize(
        &mut self,
        key: &str,
        c: &ConstT,
        trainable: bool,
    ) -> Result<Value, BuildError> {
        if let Some(v) = self.materialized.get(key) {
            return Ok(*v);
        }
        let dtype = dtype_of_code(c.code).unwrap_or(DType::Float32);
        let tensor = const_tensor(c, dtype).ok_or_else(|| BuildError::InvalidParam {
            name: key.to_string(),
            reason: format!("a constant of element type {} cannot be a weight", c.code),
        })?;
        let name = self.fresh_name(key);
        let shape: Vec<usize> = if c.shape.is_empty() {
            vec![1]
        } else {
            c.shape.clone()
        };
        let init = placeholder_init(&name, &shape);
        let v = self.b.weight_with(&name, dtype, &shape, init, trainable)?;
        let tensor = Tensor {
            shape,
            data: tensor.data,
        };
        self.weights.insert(name, tensor);
        self.materialized.insert(key.to_string(), v);
        Ok(v)
    }

    /// Marks every output of `node` missing (its consumers are skipped).
    pub(crate) fn set_missing(&mut self, node: &NodeProto) {
        for o in &node.output {
            self.vals.insert(o.clone(), Val::Missing);
        }
    }

    /// Input `i` of the node (`None` when absent or empty).
    pub(crate) fn input(&self, cx: &Ctx, i: usize) -> Result<Option<Val>, ImportError> {
        match cx.node.input.get(i).filter(|n| !n.is_empty()) {
            None => Ok(None),
            Some(n) => {
                self.vals.get(n).cloned().map(Some).ok_or_else(|| {
                    cx.err(format!("input {i} `{n}` is not defined before the node"))
                })
            }
        }
    }

    /// Input `i`, required.
    pub(crate) fn req(&self, cx: &Ctx, i: usize) -> Result<Val, ImportError> {
        self.input(cx, i)?
            .ok_or_else(|| cx.err(format!("input {i} is missing")))
    }

    /// Input `i` as a tensor of the graph: a constant becomes a weight (trainable when it is
    /// a float initializer and `trainable` is asked for).
    pub(crate) fn tensor(
        &mut self,
        cx: &Ctx,
        i: usize,
        trainable: bool,
    ) -> Result<Value, ImportError> {
        let v = self.req(cx, i)?;
        let key = cx.node.input.get(i).cloned().unwrap_or_default();
        self.as_tensor(cx, &v, &key, trainable)
    }

    /// A value as a tensor of the graph (see [`Importer::tensor`]).
    pub(crate) fn as_tensor(
        &mut self,
        cx: &Ctx,
        v: &Val,
        key: &str,
        trainable: bool,
    ) -> Result<Value, ImportError> {
        match v {
            Val::T(t) => Ok(*t),
            Val::C(c) => {
                let key = c.origin.clone().unwrap_or_else(|| key.to_string());
                let train = trainable && c.origin.is_some() && c.elem().is_float();
                self.materialize(&key, c, train).map_err(|e| cx.build(e))
            }
            Val::Missing => Err(cx.err("an input was not mapped")),
        }
    }

    /// Input `i` as a constant (an error naming the input when it is a tensor of the graph).
    pub(crate) fn konst(&self, cx: &Ctx, i: usize, what: &str) -> Result<ConstT, ImportError> {
        match self.req(cx, i)? {
            Val::C(c) => Ok(c),
            _ => Err(cx.err(format!(
                "{what} (input {i} `{}`) must be known at import time (a constant or folded \
                 shape arithmetic), but it is computed from the model's inputs",
                cx.node.input.get(i).cloned().unwrap_or_default()
            ))),
        }
    }

    /// The shape of a graph tensor.
    pub(crate) fn shape(&self, cx: &Ctx, v: Value) -> Result<Vec<usize>, ImportError> {
        self.b.shape_of(v, &cx.name).map_err(|e| cx.build(e))
    }

    /// The element type of a graph tensor.
    pub(crate) fn dtype(&self, cx: &Ctx, v: Value) -> Result<DType, ImportError> {
        self.b
            .ty(&v)
            .map(|t| t.dtype)
            .ok_or_else(|| cx.err("an input is not a single tensor"))
    }

    /// Adds an op with the node's scope; `suffix` distinguishes helper ops of one node
    /// (empty: the node's own instance name).
    pub(crate) fn op(
        &mut self,
        cx: &Ctx,
        op: shardc_ir::OpKind,
        inputs: &[Operand],
        attrs: shardc_ir::Attrs,
        main: bool,
    ) -> Result<Value, ImportError> {
        let inst = if main { cx.inst.as_str() } else { "" };
        self.b
            .op_named(op, inputs, attrs, inst, None)
            .map_err(|e| cx.build(e))
    }
}

/// A constant's values as a runtime tensor of `dtype` (`None` for Bool or a type shardc's
/// weights cannot hold).
fn const_tensor(c: &ConstT, dtype: DType) -> Option<Tensor> {
    let shape = c.shape.clone();
    match dtype {
        DType::Float32 => Tensor::from_f32(shape, c.data.iter().map(|&v| v as f32).collect()),
        DType::Float64 => Tensor::from_f64(shape, c.data.clone()),
        DType::Int64 => Tensor::from_i64(shape, c.as_i64()),
        DType::Int32 => Tensor::from_i32(shape, c.data.iter().map(|&v| v as i32).collect()),
        DType::Float16 => Some(Tensor {
            shape,
            data: Data::F16(c.data.iter().map(|&v| half::f16::from_f64(v)).collect()),
        }),
        _ => None,
    }
}
