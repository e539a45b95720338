//! ONNX (`onnx.proto`, default-domain opsets 13 to 21) read into shardc's forward graph.
//!
//! - Graph inputs that are not initializers become data inputs; their shapes must be static
//!   (a symbolic dimension is an error naming the input and the dimension).
//! - Initializers are tensors known at import time ([`consts::ConstT`]). A float initializer that an
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
mod importer;
mod map;

use crate::model::{Format, ImportError, Imported, UnmappedOp};
use crate::proto::onnx::{tensor_shape_proto::dimension, type_proto, ModelProto, NodeProto};
use consts::dtype_of_code;
use importer::{is_ident, scope_and_leaf, tensor_value, Ctx, Importer, Val};
use prost::Message;
use shardc_compiler::builder::{GraphBuilder, Value};
use shardc_ir::{DType, ParamKind};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The default-domain opsets the importer reads.
pub const OPSETS: std::ops::RangeInclusive<i64> = 13..=21;

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
        self::node(&mut cx, node)?;
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

/// Reads one node: folded, mapped, or collected as unmapped.
fn node(imp: &mut Importer, node: &NodeProto) -> Result<(), ImportError> {
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
        imp.unmapped.push(unmapped(None));
        imp.set_missing(node);
        return Ok(());
    }
    if node
        .input
        .iter()
        .any(|i| matches!(imp.vals.get(i), Some(Val::Missing)))
    {
        imp.set_missing(node);
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
        imp.b.push_scope(&scope);
    }
    let r = map::convert(imp, &ctx);
    if !scope.is_empty() {
        imp.b.pop_scope();
    }
    match r? {
        map::Outcome::Done(outs) => {
            for (i, v) in outs.into_iter().enumerate() {
                if let Some(o) = node.output.get(i).filter(|o| !o.is_empty()) {
                    imp.vals.insert(o.clone(), v);
                }
            }
        }
        map::Outcome::Unmapped(why) => {
            imp.unmapped.push(unmapped(Some(why)));
            imp.set_missing(node);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
