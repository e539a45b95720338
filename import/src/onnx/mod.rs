//! ONNX (`onnx.proto`, default-domain opsets 13 to 21) read into shardc's forward graph.
//!
//! - Graph inputs that are not initializers become data inputs; their shapes must be static
//!   (a symbolic dimension is an error naming the input and the dimension).
//! - Initializers are tensors known at import time ([`ConstT`]). A float initializer that an
//!   op takes as a tensor operand becomes a trainable weight named after it (its value in
//!   [`Imported::weights`]); BatchNormalization's statistics become non-trainable weights;
//!   integer initializers and any initializer consumed only by shape arithmetic are folded.
//! - Every node whose inputs are all known is evaluated at import time where the importer
//!   can (`Constant`, `Shape`, `Gather`, `Concat`, `ConstantOfShape`, `Range`, `Cast`,
//!   arithmetic, comparisons, `Where`, `Slice`, `Reshape`, ...), so only real tensor
//!   computation reaches the graph. A tensor constant that a real op needs becomes a
//!   non-trainable weight; a one-element float constant of a binary op becomes a scalar
//!   operand (`Const::Float`).
//! - Every other node is mapped to shardc ops (the private module `map`); a node without a mapping is
//!   collected, and [`ImportError::Unmapped`] lists every one.
//!
//! Torch's node names (`/layer1/layer1.0/conv1/Conv`) give each node its scope
//! (`layer1/layer1.0/conv1`) and its instance name (`Conv`, numbered when repeated); the
//! node producing a graph output takes the output's name as its instance name, the name
//! `shardc predict` keys it by.

pub mod consts;
mod map;

use crate::proto::onnx::{
    tensor_shape_proto::dimension, type_proto, ModelProto, NodeProto, TensorProto,
};
use crate::{placeholder_init, Format, ImportError, Imported, UnmappedOp};
use consts::{code, dtype_of_code, ConstT};
use prost::Message;
use shardc_compiler::builder::{BuildError, GraphBuilder, Value};
use shardc_ir::{DType, Operand, ParamKind};
use shardc_runtime::tensor::Data;
use shardc_runtime::Tensor;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The default-domain opsets the importer reads.
pub const OPSETS: std::ops::RangeInclusive<i64> = 13..=21;

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

/// Reads an ONNX file's bytes (`path` names it in errors).
pub fn import(path: &Path, bytes: &[u8]) -> Result<Imported, ImportError> {
    let model = ModelProto::decode(bytes).map_err(|e| ImportError::Decode {
        path: path.to_path_buf(),
        format: Format::Onnx,
        reason: e.to_string(),
    })?;
    let file = path.display().to_string();
    let opset = default_opset(&model).map_err(|r| ImportError::Model(format!("{file}: {r}")))?;
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| ImportError::Model(format!("{file}: the model has no graph")))?;
    let name = graph
        .name
        .as_deref()
        .filter(|n| is_ident(n))
        .unwrap_or("Net")
        .to_string();
    let mut cx = Importer {
        b: GraphBuilder::new(&name),
        opset,
        vals: HashMap::new(),
        weights: HashMap::new(),
        materialized: HashMap::new(),
        names: HashSet::new(),
        unmapped: Vec::new(),
    };
    cx.b.set_training(false);
    for t in &graph.initializer {
        let n = t.name.clone().unwrap_or_default();
        let mut c = tensor_value(t)
            .map_err(|r| ImportError::Model(format!("{file}: initializer `{n}`: {r}")))?;
        c.origin = Some(n.clone());
        cx.vals.insert(n, Val::C(c));
    }
    for input in &graph.input {
        let n = input.name.clone().unwrap_or_default();
        if cx.vals.contains_key(&n) {
            continue;
        }
        let (dtype, shape) = input_type(input)
            .map_err(|r| ImportError::Model(format!("{file}: graph input `{n}`: {r}")))?;
        let pname = cx.fresh_name(&n);
        let v =
            cx.b.input(&pname, dtype, &shape)
                .map_err(|e| ImportError::Model(format!("{file}: graph input `{n}`: {e}")))?;
        cx.vals.insert(n, Val::T(v));
    }
    for node in &graph.node {
        cx.node(node)?;
    }
    if !cx.unmapped.is_empty() {
        return Err(ImportError::Unmapped(cx.unmapped));
    }
    let mut outputs = Vec::new();
    let mut out_names = Vec::new();
    for o in &graph.output {
        let n = o.name.clone().unwrap_or_default();
        let v = match cx.vals.get(&n) {
            Some(Val::T(v)) => *v,
            Some(Val::C(c)) => {
                let c = c.clone();
                cx.materialize(&n, &c, false)
                    .map_err(|e| ImportError::Model(format!("{file}: output `{n}`: {e}")))?
            }
            _ => {
                return Err(ImportError::Model(format!(
                    "{file}: graph output `{n}` is not produced by any node"
                )))
            }
        };
        outputs.push(v);
        out_names.push(n);
    }
    if outputs.is_empty() {
        return Err(ImportError::Model(format!(
            "{file}: the graph has no output"
        )));
    }
    let Importer { b, weights, .. } = cx;
    let mut g = b
        .finish(&outputs)
        .map_err(|e| ImportError::Model(format!("{file}: {e}")))?;
    // The node of each output takes the output's name as its instance name.
    for (v, n) in outputs.iter().zip(&out_names) {
        if let Value::Node(id) = v {
            let taken = g.nodes.iter().any(|x| &x.instance == n);
            if is_ident(n) && !taken {
                if let Some(node) = g.nodes.get_mut(id.index()) {
                    node.instance = n.clone();
                }
            }
        }
    }
    let mut values = Vec::new();
    for p in &g.params {
        if matches!(p.kind, ParamKind::Weight { .. }) {
            let t = weights.get(&p.name).cloned().ok_or_else(|| {
                ImportError::Model(format!("{file}: weight `{}` has no value", p.name))
            })?;
            values.push((p.name.clone(), t));
        }
    }
    let producer = format!(
        "{} {}",
        model.producer_name.as_deref().unwrap_or("unknown"),
        model.producer_version.as_deref().unwrap_or("")
    )
    .trim()
    .to_string();
    Ok(Imported {
        graph: g,
        weights: values,
        format: Format::Onnx,
        producer,
    })
}

/// The model's default-domain opset, checked against [`OPSETS`].
fn default_opset(model: &ModelProto) -> Result<i64, String> {
    let v = model
        .opset_import
        .iter()
        .find(|o| matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")))
        .and_then(|o| o.version)
        .ok_or("the model imports no default-domain (ai.onnx) opset")?;
    if !OPSETS.contains(&v) {
        return Err(format!(
            "opset {v} is not supported (shardc reads default-domain opsets {} to {})",
            OPSETS.start(),
            OPSETS.end()
        ));
    }
    Ok(v)
}

/// A graph input's element type and static shape.
fn input_type(input: &crate::proto::onnx::ValueInfoProto) -> Result<(DType, Vec<usize>), String> {
    let Some(type_proto::Value::TensorType(t)) =
        input.r#type.as_ref().and_then(|t| t.value.as_ref())
    else {
        return Err("not a tensor".into());
    };
    let c = t.elem_type.unwrap_or(0);
    let dtype = dtype_of_code(c).ok_or_else(|| format!("element type {c} is not supported"))?;
    let dims = t
        .shape
        .as_ref()
        .ok_or("has no shape (shardc needs static input shapes)")?;
    let mut shape = Vec::new();
    for (i, d) in dims.dim.iter().enumerate() {
        match &d.value {
            Some(dimension::Value::DimValue(v)) if *v > 0 => shape.push(*v as usize),
            Some(dimension::Value::DimParam(p)) => {
                return Err(format!(
                    "dimension {i} is symbolic (`{p}`); shardc needs static input shapes: \
                     export with a fixed shape"
                ))
            }
            other => {
                return Err(format!(
                    "dimension {i} is {} (shardc needs static, positive input dims)",
                    match other {
                        Some(dimension::Value::DimValue(v)) => v.to_string(),
                        _ => "unknown".into(),
                    }
                ))
            }
        }
    }
    if shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .is_none_or(|n| n > isize::MAX as usize / 8)
    {
        return Err(format!("shape {shape:?} is too large"));
    }
    Ok((dtype, shape))
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
    fn fresh_name(&mut self, onnx_name: &str) -> String {
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

    fn node(&mut self, node: &NodeProto) -> Result<(), ImportError> {
        let op = node.op_type.clone().unwrap_or_default();
        let domain = node.domain.clone().unwrap_or_default();
        let name = node
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .or_else(|| node.output.first().cloned())
            .unwrap_or_else(|| op.clone());
        let (scope, leaf) = scope_and_leaf(&name);
        let op_full = if domain.is_empty() || domain == "ai.onnx" {
            op.clone()
        } else {
            format!("{domain}.{op}")
        };
        let unmapped = |why: Option<String>| UnmappedOp {
            op: match why {
                Some(w) => format!("{op_full} ({w})"),
                None => op_full.clone(),
            },
            node: name.clone(),
            scope: scope.clone(),
        };
        if op_full != op || !map::KNOWN.contains(&op.as_str()) {
            self.unmapped.push(unmapped(None));
            self.set_missing(node);
            return Ok(());
        }
        if node
            .input
            .iter()
            .any(|i| matches!(self.vals.get(i), Some(Val::Missing)))
        {
            self.set_missing(node);
            return Ok(());
        }
        let inst = if is_ident(&leaf) {
            leaf.clone()
        } else {
            String::new()
        };
        let ctx = Ctx {
            node,
            name: name.clone(),
            op: op.clone(),
            inst,
        };
        if !scope.is_empty() {
            self.b.push_scope(&scope);
        }
        let r = map::convert(self, &ctx);
        if !scope.is_empty() {
            self.b.pop_scope();
        }
        match r? {
            map::Outcome::Done(outs) => {
                for (i, v) in outs.into_iter().enumerate() {
                    if let Some(o) = node.output.get(i).filter(|o| !o.is_empty()) {
                        self.vals.insert(o.clone(), v);
                    }
                }
            }
            map::Outcome::Unmapped(why) => {
                self.unmapped.push(unmapped(Some(why)));
                self.set_missing(node);
            }
        }
        Ok(())
    }

    fn set_missing(&mut self, node: &NodeProto) {
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

#[cfg(test)]
mod tests;
