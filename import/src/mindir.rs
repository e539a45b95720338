//! MindSpore's MindIR: the protobuf `mindspore.export(net, *inputs, file_format="MINDIR")`
//! writes (`mind_ir.proto`'s `ModelProto`), read into shardc's forward graph.
//!
//! A MindIR graph is MindSpore's own dataflow graph, and shardc's ops are MindSpore's
//! primitives, so most nodes map one to one. What the reader does:
//!
//! - **Inputs and parameters.** The graph's inputs become data inputs; its parameters become
//!   weights named as MindSpore names them (`fc1.weight`: the graph-name prefix MindIR adds is
//!   dropped), with their values in [`Imported::weights`]. A parameter read as a BatchNorm's
//!   moving mean or variance is not trainable.
//! - **Primitives.** A node `REF::MatMul:6` calls the model's primitive `MatMul:6`, whose
//!   attributes hold the op's configuration (`kernel_size`, `pad_mode`, ...), its
//!   `instance_name` and, for an op the user sharded, its `in_strategy` / `out_strategy`.
//!   MindSpore 2.x passes most scalar arguments (`transpose_b`, `axis`, `keep_dims`) as
//!   constant inputs; both places are read. The node's scope (`Default/fc1-Dense`, from its
//!   full name `Default/fc1-Dense/MatMul-op0`) and the primitive's instance name are kept.
//! - **Side effects.** `Load` (a parameter's read), `UpdateState`, `MakeTuple` of monads and
//!   `Depend` are MindSpore's ordering plumbing: a `Load` is its parameter, a `Depend` its
//!   first input, and the rest disappears.
//! - **Constants.** Scalar constants become shardc's in-place constants; a constant tensor
//!   operand becomes a non-trainable weight holding its value.
//! - **Checks.** Each node's output shape recorded in the file is compared with the one
//!   shardc's shape rules infer for the mapped op, so a mapping mistake is an error naming the
//!   node, not a wrong model.
//!
//! A primitive without a mapping does not stop the reader: every one is collected, and the
//! error ([`ImportError::Unmapped`]) lists each with its node and scope.

use crate::model::{placeholder_init, Format, ImportError, Imported, UnmappedOp};
use crate::proto::mind_ir::{
    attribute_proto::AttributeType, tensor_proto::DataType, AttributeProto, GraphProto, ModelProto,
    NodeProto, PrimitiveProto, TensorProto,
};
use prost::Message;
use shardc_compiler::builder::{GraphBuilder, Value};
use shardc_ir::{Attr, Attrs, Const, DType, OpKind, Operand, Strategy};
use shardc_runtime::tensor::Data;
use shardc_runtime::Tensor;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Reads a MindIR file's bytes (`path` names it in errors).
pub fn import(path: &Path, bytes: &[u8]) -> Result<Imported, ImportError> {
    let decode_error = |reason: String| ImportError::Decode {
        path: path.to_path_buf(),
        format: Format::MindIr,
        reason,
    };
    let model = ModelProto::decode(bytes).map_err(|e| decode_error(e.to_string()))?;
    let Some(graph) = model.graph.as_ref() else {
        return Err(decode_error("the model has no graph".into()));
    };
    if graph.node.is_empty() && graph.output.is_empty() {
        return Err(decode_error("the graph has no nodes and no outputs".into()));
    }
    let producer = format!(
        "{} {}",
        model
            .producer_name
            .as_deref()
            .unwrap_or("an unknown producer"),
        model
            .producer_version
            .as_deref()
            .or(model.model_version.as_deref())
            .unwrap_or("")
    )
    .trim()
    .to_string();
    let mut reader = Reader::new(&model, graph)?;
    reader.read_params()?;
    for node in &graph.node {
        reader.read_node(node)?;
    }
    if !reader.unmapped.is_empty() {
        return Err(ImportError::Unmapped(reader.unmapped));
    }
    let (graph_ir, weights) = reader.finish()?;
    Ok(Imported {
        graph: graph_ir,
        weights,
        format: Format::MindIr,
        producer,
    })
}

/// A constant of the file: a constant node's value or a primitive's attribute.
#[derive(Clone, Debug)]
enum Lit {
    None,
    Monad,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Seq(Vec<Lit>),
    Tensor(Tensor),
}

impl Lit {
    fn describe(&self) -> String {
        match self {
            Lit::None => "None".into(),
            Lit::Monad => "a monad".into(),
            Lit::Bool(b) => b.to_string(),
            Lit::Int(i) => i.to_string(),
            Lit::Float(f) => f.to_string(),
            Lit::Str(s) => format!("\"{s}\""),
            Lit::Seq(v) => format!(
                "({})",
                v.iter().map(Lit::describe).collect::<Vec<_>>().join(", ")
            ),
            Lit::Tensor(t) => format!("a {:?} tensor of shape {:?}", t.dtype(), t.shape),
        }
    }

    fn as_int(&self) -> Option<i64> {
        match self {
            Lit::Int(i) => Some(*i),
            Lit::Bool(b) => Some(i64::from(*b)),
            Lit::Tensor(t) if t.len() == 1 => scalar_of(t).map(|f| f as i64),
            _ => None,
        }
    }

    fn as_float(&self) -> Option<f64> {
        match self {
            Lit::Int(i) => Some(*i as f64),
            Lit::Float(f) => Some(*f),
            Lit::Tensor(t) if t.len() == 1 => scalar_of(t),
            _ => None,
        }
    }

    fn as_bool(&self) -> Option<bool> {
        match self {
            Lit::Bool(b) => Some(*b),
            Lit::Int(i) => Some(*i != 0),
            _ => None,
        }
    }

    /// An integer tuple (a single integer reads as one element).
    fn as_ints(&self) -> Option<Vec<i64>> {
        match self {
            Lit::Int(i) => Some(vec![*i]),
            Lit::Seq(v) => v.iter().map(Lit::as_int).collect(),
            _ => None,
        }
    }

    fn to_attr(&self) -> Option<Attr> {
        Some(match self {
            Lit::None | Lit::Monad | Lit::Tensor(_) => return None,
            Lit::Bool(b) => Attr::Bool(*b),
            Lit::Int(i) => Attr::Int(*i),
            Lit::Float(f) => Attr::Float(*f),
            Lit::Str(s) => Attr::Str(s.clone()),
            Lit::Seq(v) => Attr::Tuple(v.iter().map(Lit::to_attr).collect::<Option<_>>()?),
        })
    }
}

fn scalar_of(t: &Tensor) -> Option<f64> {
    Some(match &t.data {
        Data::F32(v) => f64::from(*v.first()?),
        Data::F64(v) => *v.first()?,
        Data::F16(v) => f64::from(v.first()?.to_f32()),
        Data::BF16(v) => f64::from(v.first()?.to_f32()),
        Data::I32(v) => f64::from(*v.first()?),
        Data::I64(v) => *v.first()? as f64,
        Data::Bool(v) => f64::from(u8::from(*v.first()?)),
    })
}

/// A value of the file's graph as the reader holds it.
#[derive(Clone, Debug)]
enum Val {
    /// A tensor of the graph being built.
    Tensor(Value),
    /// A constant.
    Lit(Lit),
    /// A tuple (`MakeTuple`) of values.
    Seq(Vec<Val>),
    /// The result of a node that could not be mapped (already reported).
    Unknown,
}

/// Why one node could not be mapped.
enum Fault {
    /// No mapping for the primitive: collected and reported with the others.
    Unmapped,
    /// An input is the result of an unmapped node: skipped silently (the cause is reported).
    Upstream,
    /// The node is mapped but unusable as written.
    Bad(String),
}

type NodeResult = Result<Val, Fault>;

fn bad<T>(reason: impl Into<String>) -> Result<T, Fault> {
    Err(Fault::Bad(reason.into()))
}

struct Reader<'m> {
    graph: &'m GraphProto,
    primitives: HashMap<&'m str, &'m PrimitiveProto>,
    functions: HashSet<&'m str>,
    prefix: String,
    builder: GraphBuilder,
    values: HashMap<String, Val>,
    weights: Vec<(String, Tensor)>,
    unmapped: Vec<UnmappedOp>,
    constants: usize,
}

impl<'m> Reader<'m> {
    fn new(model: &'m ModelProto, graph: &'m GraphProto) -> Result<Self, ImportError> {
        let name = graph.name.clone().unwrap_or_default();
        // `59_1_make_ckpt_Network_construct_17`: the cell's class before `_construct_`.
        let class = name
            .split_once("_construct")
            .map(|(head, _)| head.rsplit('_').next().unwrap_or(head))
            .filter(|c| !c.is_empty())
            .unwrap_or("model");
        let builder = GraphBuilder::new(&sanitize(class));
        Ok(Reader {
            graph,
            primitives: model
                .primitives
                .iter()
                .filter_map(|p| Some((p.name.as_deref()?, p)))
                .collect(),
            functions: model
                .functions
                .iter()
                .filter_map(|g| g.name.as_deref())
                .collect(),
            prefix: format!("{name}:"),
            builder,
            values: HashMap::new(),
            weights: Vec::new(),
            unmapped: Vec::new(),
            constants: 0,
        })
    }

    /// A parameter's or input's name without the graph prefix MindIR adds.
    fn short_name<'a>(&self, name: &'a str) -> &'a str {
        name.strip_prefix(self.prefix.as_str()).unwrap_or(name)
    }

    /// The graph's inputs, then its parameters (weights with their values).
    fn read_params(&mut self) -> Result<(), ImportError> {
        for input in &self.graph.input {
            let full = input.name.clone().unwrap_or_default();
            let name = self.short_name(&full).to_string();
            let Some(t) = input.tensor.first() else {
                return Err(ImportError::Model(format!(
                    "input `{name}` has no tensor type"
                )));
            };
            let dtype = dtype_of(t.data_type.unwrap_or(0)).ok_or_else(|| {
                ImportError::Model(format!(
                    "input `{name}`: element type {} is not supported",
                    type_name(t.data_type.unwrap_or(0))
                ))
            })?;
            let shape = static_shape(&t.dims).ok_or_else(|| {
                ImportError::Model(format!(
                    "input `{name}` has the dynamic shape {:?}: export with a fixed input shape",
                    t.dims
                ))
            })?;
            let v = self
                .builder
                .input(&name, dtype, &shape)
                .map_err(|e| ImportError::Model(e.to_string()))?;
            self.values.insert(full, Val::Tensor(v));
        }
        let statistics = self.statistics();
        for p in &self.graph.parameter {
            let full = p.name.clone().unwrap_or_default();
            let name = self.short_name(&full).to_string();
            let value = tensor_of(p)
                .map_err(|reason| ImportError::Model(format!("parameter `{name}`: {reason}")))?;
            let dtype = value.dtype();
            let trainable = !statistics.contains(full.as_str()) && dtype.is_float();
            let init = placeholder_init(&name, &value.shape);
            let v = self
                .builder
                .weight_with(&name, dtype, &value.shape.clone(), init, trainable)
                .map_err(|e| ImportError::Model(e.to_string()))?;
            self.weights.push((name, value));
            self.values.insert(full, Val::Tensor(v));
        }
        Ok(())
    }

    /// The parameters a BatchNorm reads as its moving mean or variance (through `Load`).
    fn statistics(&self) -> HashSet<&'m str> {
        let loads: HashMap<&str, &str> = self
            .graph
            .node
            .iter()
            .filter(|n| self.primitive_type(n) == Some("Load"))
            .filter_map(|n| Some((n.output.first()?.as_str(), n.input.first()?.as_str())))
            .collect();
        let mut out = HashSet::new();
        for n in &self.graph.node {
            if self.primitive_type(n) == Some("BatchNorm") {
                for i in [3, 4] {
                    if let Some(input) = n.input.get(i) {
                        let param = loads.get(input.as_str()).copied().unwrap_or(input);
                        out.insert(param);
                    }
                }
            }
        }
        out
    }

    /// The primitive a node calls, if it calls one.
    fn primitive(&self, node: &NodeProto) -> Option<&'m PrimitiveProto> {
        let op = node.op_type.as_deref()?;
        let key = op.strip_prefix("REF::")?;
        self.primitives.get(key).copied()
    }

    /// The op type of the primitive a node calls (`MatMul`), or the node's own op type.
    fn primitive_type<'n>(&self, node: &'n NodeProto) -> Option<&'n str>
    where
        'm: 'n,
    {
        match self.primitive(node) {
            Some(p) => p.op_type.as_deref(),
            None => node.op_type.as_deref(),
        }
    }

    fn read_node(&mut self, node: &'m NodeProto) -> Result<(), ImportError> {
        let name = node.name.clone().unwrap_or_default();
        let op_type = node.op_type.clone().unwrap_or_default();
        if op_type == "Constant" {
            let attr = node
                .attribute
                .iter()
                .find(|a| a.name.as_deref() == Some("value"));
            let lit = match attr {
                Some(a) => lit_of(a).map_err(|reason| ImportError::Node {
                    node: name.clone(),
                    op: op_type.clone(),
                    reason,
                })?,
                None => Lit::None,
            };
            for out in &node.output {
                self.values.insert(out.clone(), Val::Lit(lit.clone()));
            }
            return Ok(());
        }
        let prim = self.primitive(node);
        let prim_type = match prim {
            Some(p) => p.op_type.clone().unwrap_or_default(),
            None => op_type
                .strip_prefix("REF::")
                .unwrap_or(&op_type)
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        let domain = node.domain.clone().unwrap_or_default();
        let scope = match domain.rsplit_once('/') {
            Some((scope, _)) => scope.to_string(),
            None => String::new(),
        };
        let args: Vec<Val> = node
            .input
            .iter()
            .map(|i| self.values.get(i).cloned().unwrap_or(Val::Unknown))
            .collect();
        let missing: Vec<&String> = node
            .input
            .iter()
            .filter(|i| !self.values.contains_key(*i))
            .collect();
        let called_graph = self.functions.contains(op_type.as_str())
            || op_type.starts_with("REF::") && prim.is_none();
        let result = if called_graph {
            Err(Fault::Unmapped)
        } else if !missing.is_empty() && !self.unmapped.is_empty() {
            Err(Fault::Upstream)
        } else if let Some(m) = missing.first() {
            Err(Fault::Bad(format!(
                "input `{m}` is defined by no earlier node"
            )))
        } else {
            let mut cx = NodeCx {
                reader: self,
                prim,
                args,
                instance: prim
                    .and_then(|p| p.instance_name.as_deref())
                    .map(sanitize)
                    .unwrap_or_default(),
                first: true,
            };
            cx.reader.builder.push_scope(&scope);
            let r = cx.map(&prim_type);
            cx.reader.builder.pop_scope();
            r
        };
        let val = match result {
            Ok(v) => {
                self.check_shape(node, &name, &prim_type, &v)?;
                v
            }
            Err(Fault::Unmapped) => {
                self.unmapped.push(UnmappedOp {
                    op: if called_graph {
                        format!("call of graph `{op_type}`")
                    } else {
                        prim_type.clone()
                    },
                    node: self.short_name(&name).to_string(),
                    scope: domain,
                });
                Val::Unknown
            }
            Err(Fault::Upstream) => Val::Unknown,
            Err(Fault::Bad(reason)) => {
                return Err(ImportError::Node {
                    node: name,
                    op: prim_type,
                    reason,
                })
            }
        };
        for out in &node.output {
            self.values.insert(out.clone(), val.clone());
        }
        Ok(())
    }

    /// Compares a mapped node's type with the output shape the file records for it.
    fn check_shape(
        &self,
        node: &NodeProto,
        name: &str,
        op: &str,
        val: &Val,
    ) -> Result<(), ImportError> {
        let Val::Tensor(v) = val else { return Ok(()) };
        let Some(attr) = node
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some("shape"))
        else {
            return Ok(());
        };
        if attr.r#type != Some(AttributeType::Tensors as i32) {
            return Ok(());
        }
        let (Some(expected), Some(got)) = (attr.tensors.first(), self.builder.ty(v)) else {
            return Ok(());
        };
        let Some(shape) = static_shape(&expected.dims) else {
            return Ok(());
        };
        if shape != got.shape {
            return Err(ImportError::Node {
                node: name.to_string(),
                op: op.to_string(),
                reason: format!(
                    "the file records the output shape {shape:?}, the mapped op gives {:?}",
                    got.shape
                ),
            });
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(shardc_ir::Graph, Vec<(String, Tensor)>), ImportError> {
        let mut outputs = Vec::new();
        for o in &self.graph.output {
            let name = o.name.clone().unwrap_or_default();
            match self.values.get(&name) {
                Some(val) => flatten(val, &mut outputs).map_err(|what| {
                    ImportError::Model(format!("output `{name}` is {what}, not a tensor"))
                })?,
                None => {
                    return Err(ImportError::Model(format!(
                        "output `{name}` is defined by no node"
                    )))
                }
            }
        }
        if outputs.is_empty() {
            return Err(ImportError::Model("the graph has no outputs".into()));
        }
        for (k, v) in outputs.iter().enumerate() {
            let name = if outputs.len() == 1 {
                "output".to_string()
            } else {
                format!("output_{k}")
            };
            self.builder.set_value_name(*v, &name);
        }
        let graph = self
            .builder
            .finish(&outputs)
            .map_err(|e| ImportError::Model(e.to_string()))?;
        Ok((graph, self.weights))
    }
}

fn flatten(val: &Val, out: &mut Vec<Value>) -> Result<(), String> {
    match val {
        Val::Tensor(v) => out.push(*v),
        Val::Seq(items) => {
            for i in items {
                flatten(i, out)?;
            }
        }
        Val::Lit(l) => return Err(format!("the constant {}", l.describe())),
        Val::Unknown => return Err("unknown".into()),
    }
    Ok(())
}

/// An instance name usable in the text IR.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The mapping of one node: its primitive, resolved inputs and the builder.
struct NodeCx<'r, 'm> {
    reader: &'r mut Reader<'m>,
    prim: Option<&'m PrimitiveProto>,
    args: Vec<Val>,
    instance: String,
    /// Whether the next emitted op is the node's first (it takes the instance name and the
    /// strategies).
    first: bool,
}

impl NodeCx<'_, '_> {
    fn map(&mut self, prim: &str) -> NodeResult {
        use OpKind as K;
        match prim {
            // ---- MindSpore's ordering plumbing ----
            "Load" | "Depend" | "StopGradient" | "Identity" => Ok(self.arg(0)?.clone()),
            "UpdateState" => Ok(Val::Lit(Lit::Monad)),
            "MakeTuple" => {
                let items = self.args.clone();
                if items.iter().any(|v| matches!(v, Val::Unknown)) {
                    return Err(Fault::Upstream);
                }
                Ok(Val::Seq(items))
            }
            "TupleGetItem" => {
                let index = self.int_arg(1, "index")?;
                match self.arg(0)?.clone() {
                    Val::Seq(items) => usize::try_from(index)
                        .ok()
                        .and_then(|i| items.get(i).cloned())
                        .map_or_else(|| bad(format!("index {index} is out of the tuple")), Ok),
                    Val::Tensor(t) => self.emit(
                        K::TupleGetItem,
                        vec![t.into(), Const::Int(index).into()],
                        Attrs::new(),
                    ),
                    other => bad(format!("input 0 is {}, not a tuple", describe(&other))),
                }
            }
            // ---- contractions ----
            "MatMul" | "BatchMatMul" => {
                let a = self.tensor(0)?;
                let b = self.tensor(1)?;
                let ta = self.flag(2, "transpose_a", "transpose_x1")?;
                let tb = self.flag(3, "transpose_b", "transpose_x2")?;
                let op = if prim == "MatMul" {
                    K::MatMul
                } else {
                    K::BatchMatMul
                };
                self.emit(
                    op,
                    vec![a.into(), b.into()],
                    Attrs::new()
                        .with("transpose_a", Attr::Bool(ta))
                        .with("transpose_b", Attr::Bool(tb)),
                )
            }
            "Conv2D" => {
                let x = self.tensor(0)?;
                let w = self.tensor(1)?;
                let mut attrs = Attrs::new();
                for (from, to) in [
                    ("out_channel", "out_channel"),
                    ("kernel_size", "kernel_size"),
                    ("stride", "stride"),
                    ("dilation", "dilation"),
                    ("group", "group"),
                ] {
                    if let Some(a) = self.prim_attr(from).and_then(|l| l.to_attr()) {
                        attrs.set(to, a);
                    }
                }
                let mode = self.prim_str("pad_mode")?.unwrap_or_else(|| "valid".into());
                attrs.set("pad_mode", Attr::Str(mode.to_ascii_lowercase()));
                let pad = self
                    .prim_attr("pad_list")
                    .or_else(|| self.prim_attr("pad"))
                    .and_then(|l| l.as_ints());
                if let Some(pad) = pad.filter(|p| p.iter().any(|&v| v != 0)) {
                    let pad = if pad.len() == 1 { vec![pad[0]; 4] } else { pad };
                    attrs.set("pad", Attr::ints(&pad));
                }
                self.data_format(&mut attrs)?;
                self.emit(K::Conv2D, vec![x.into(), w.into()], attrs)
            }
            "BiasAdd" => {
                let x = self.tensor(0)?;
                let b = self.tensor(1)?;
                self.emit(K::BiasAdd, vec![x.into(), b.into()], Attrs::new())
            }
            // ---- elementwise ----
            "Add" | "Sub" | "Mul" | "RealDiv" | "Div" | "AddExt" | "SubExt" | "Muls" | "Divs"
            | "Equal" => {
                if matches!(prim, "AddExt" | "SubExt") {
                    let alpha = self.float_arg(2, "alpha").unwrap_or(1.0);
                    if alpha != 1.0 {
                        return bad(format!("alpha {alpha} is not supported (only 1)"));
                    }
                }
                let op = match prim {
                    "Add" | "AddExt" => K::Add,
                    "Sub" | "SubExt" => K::Sub,
                    "Mul" | "Muls" => K::Mul,
                    "Equal" => K::Equal,
                    _ => K::RealDiv,
                };
                let a = self.operand(0)?;
                let b = self.operand(1)?;
                if a.as_const().is_some() && b.as_const().is_some() {
                    return bad("both operands are constants");
                }
                self.emit(op, vec![a, b], Attrs::new())
            }
            "Neg" | "Square" | "Sqrt" | "Exp" | "Log" | "ReLU" | "GeLU" | "Sigmoid" | "Tanh"
            | "SiLU" | "Erf" => {
                let op = match prim {
                    "Neg" => K::Neg,
                    "Square" => K::Square,
                    "Sqrt" => K::Sqrt,
                    "Exp" => K::Exp,
                    "Log" => K::Log,
                    "ReLU" => K::ReLU,
                    "GeLU" => K::GeLU,
                    "Sigmoid" => K::Sigmoid,
                    "Tanh" => K::Tanh,
                    "Erf" => K::Erf,
                    _ => K::SiLU,
                };
                if prim == "GeLU" && self.prim_str("approximate")?.is_some_and(|a| a != "tanh") {
                    return Err(Fault::Unmapped);
                }
                let x = self.tensor(0)?;
                self.emit(op, vec![x.into()], Attrs::new())
            }
            // ---- reductions and normalisation ----
            "Softmax" | "LogSoftmax" => {
                let x = self.tensor(0)?;
                let axis = match self.lit_or_attr(1, "axis") {
                    Some(l) => l
                        .as_ints()
                        .filter(|v| v.len() == 1)
                        .map(|v| v[0])
                        .ok_or_else(|| {
                            Fault::Bad(format!("axis {} is not one integer", l.describe()))
                        })?,
                    None => -1,
                };
                let op = if prim == "Softmax" {
                    K::Softmax
                } else {
                    K::LogSoftmax
                };
                self.emit(
                    op,
                    vec![x.into()],
                    Attrs::new().with("axis", Attr::Int(axis)),
                )
            }
            "ReduceSum" | "ReduceMean" | "ReduceMax" => {
                let x = self.tensor(0)?;
                let axes = match self.lit_or_attr(1, "axis") {
                    Some(Lit::None) | None => Vec::new(),
                    Some(l) => l.as_ints().ok_or_else(|| {
                        Fault::Bad(format!("axis {} is not integers", l.describe()))
                    })?,
                };
                let keep = self.flag(2, "keep_dims", "keep_dims")?;
                let op = match prim {
                    "ReduceSum" => K::ReduceSum,
                    "ReduceMean" => K::ReduceMean,
                    _ => K::ReduceMax,
                };
                self.emit(
                    op,
                    vec![x.into(), Const::Ints(axes).into()],
                    Attrs::new().with("keep_dims", Attr::Bool(keep)),
                )
            }
            "LayerNorm" => {
                let x = self.tensor(0)?;
                let g = self.tensor(1)?;
                let b = self.tensor(2)?;
                let bna = self.int_arg(3, "begin_norm_axis").unwrap_or(-1);
                let bpa = self.int_arg(4, "begin_params_axis").unwrap_or(-1);
                let eps = self.float_arg(5, "epsilon").unwrap_or(1e-7);
                self.emit(
                    K::LayerNorm,
                    vec![x.into(), g.into(), b.into()],
                    Attrs::new()
                        .with("begin_norm_axis", Attr::Int(bna))
                        .with("begin_params_axis", Attr::Int(bpa))
                        .with("epsilon", Attr::Float(eps)),
                )
            }
            "BatchNorm" => {
                let inputs: Vec<Operand> = (0..5)
                    .map(|i| self.tensor(i).map(Operand::from))
                    .collect::<Result<_, _>>()?;
                let training = self.flag(5, "is_training", "is_training")?;
                let eps = self.float_arg(6, "epsilon").unwrap_or(1e-5);
                let momentum = self.float_arg(7, "momentum").unwrap_or(0.1);
                if training {
                    return bad("is_training is true: export the network in inference mode \
                         (net.set_train(False))");
                }
                self.emit(
                    K::BatchNorm,
                    inputs,
                    Attrs::new()
                        .with("is_training", Attr::Bool(false))
                        .with("epsilon", Attr::Float(eps))
                        .with("momentum", Attr::Float(momentum)),
                )
            }
            "MaxPool" | "AvgPool" => {
                let x = self.tensor(0)?;
                let mut attrs = Attrs::new();
                for key in ["kernel_size", "strides"] {
                    match self.lit_or_attr(usize::MAX, key).and_then(|l| l.to_attr()) {
                        Some(a) => attrs.set(key, a),
                        None if key == "kernel_size" => {
                            return bad("the primitive has no kernel_size")
                        }
                        None => {}
                    }
                }
                let mode = self.prim_str("pad_mode")?.unwrap_or_else(|| "valid".into());
                attrs.set("pad_mode", Attr::Str(mode.to_ascii_lowercase()));
                self.data_format(&mut attrs)?;
                let op = if prim == "MaxPool" {
                    K::MaxPool
                } else {
                    K::AvgPool
                };
                self.emit(op, vec![x.into()], attrs)
            }
            // ---- movement ----
            "Reshape" => {
                let x = self.tensor(0)?;
                let shape = self.ints_arg(1, "shape")?;
                self.emit(
                    K::Reshape,
                    vec![x.into(), Const::Ints(shape).into()],
                    Attrs::new(),
                )
            }
            "Flatten" => {
                let x = self.tensor(0)?;
                let shape = self.shape(x)?;
                let n = shape.first().copied().unwrap_or(1) as i64;
                self.emit(
                    K::Reshape,
                    vec![x.into(), Const::Ints(vec![n, -1]).into()],
                    Attrs::new(),
                )
            }
            "ExpandDims" | "Squeeze" => {
                let x = self.tensor(0)?;
                let mut shape: Vec<i64> = self.shape(x)?.iter().map(|&d| d as i64).collect();
                let rank = shape.len() as i64;
                if prim == "ExpandDims" {
                    let axis = self.int_arg(1, "axis")?;
                    let at = if axis < 0 { axis + rank + 1 } else { axis };
                    if !(0..=rank).contains(&at) {
                        return bad(format!("axis {axis} is out of range for rank {rank}"));
                    }
                    shape.insert(at as usize, 1);
                } else {
                    let axes = self
                        .lit_or_attr(1, "axis")
                        .and_then(|l| l.as_ints())
                        .unwrap_or_default();
                    let axes: Vec<i64> = axes
                        .iter()
                        .map(|&a| if a < 0 { a + rank } else { a })
                        .collect();
                    let mut k = 0i64;
                    shape.retain(|&d| {
                        let drop = if axes.is_empty() {
                            d == 1
                        } else {
                            axes.contains(&k)
                        };
                        k += 1;
                        !drop
                    });
                }
                self.emit(
                    K::Reshape,
                    vec![x.into(), Const::Ints(shape).into()],
                    Attrs::new(),
                )
            }
            "Transpose" => {
                let x = self.tensor(0)?;
                let perm = self.ints_arg(1, "perm")?;
                self.emit(
                    K::Transpose,
                    vec![x.into(), Const::Ints(perm).into()],
                    Attrs::new(),
                )
            }
            "StridedSlice" => self.strided_slice(),
            "Gather" => {
                let params = self.tensor(0)?;
                let indices = self.tensor(1)?;
                let axis = self.int_arg(2, "axis")?;
                let batch_dims = self.int_arg(3, "batch_dims").unwrap_or(0);
                if batch_dims != 0 {
                    return bad(format!("batch_dims {batch_dims} is not supported (only 0)"));
                }
                self.emit(
                    K::Gather,
                    vec![params.into(), indices.into(), Const::Int(axis).into()],
                    Attrs::new(),
                )
            }
            "Concat" => {
                let items = match self.arg(0)?.clone() {
                    Val::Seq(items) => items,
                    other => return bad(format!("input 0 is {}, not a tuple", describe(&other))),
                };
                let inputs: Vec<Operand> = items
                    .iter()
                    .map(|v| match v {
                        Val::Tensor(t) => Ok(Operand::from(*t)),
                        other => bad(format!("an element is {}, not a tensor", describe(other))),
                    })
                    .collect::<Result<_, _>>()?;
                let axis = self.int_arg(1, "axis").unwrap_or(0);
                self.emit(
                    K::Concat,
                    inputs,
                    Attrs::new().with("axis", Attr::Int(axis)),
                )
            }
            "Split" => {
                let x = self.tensor(0)?;
                let axis = self.int_arg(1, "axis").unwrap_or(0);
                let n = self.int_arg(2, "output_num")?;
                self.emit(
                    K::Split,
                    vec![x.into()],
                    Attrs::new()
                        .with("axis", Attr::Int(axis))
                        .with("output_num", Attr::Int(n)),
                )
            }
            "ZerosLike" | "OnesLike" => {
                let x = self.tensor(0)?;
                let op = if prim == "ZerosLike" {
                    K::ZerosLike
                } else {
                    K::OnesLike
                };
                self.emit(op, vec![x.into()], Attrs::new())
            }
            // ---- losses (a file that ends in its loss is used as it is) ----
            "SparseSoftmaxCrossEntropyWithLogits" => {
                let logits = self.tensor(0)?;
                let labels = self.tensor(1)?;
                let is_grad = self.flag(usize::MAX, "is_grad", "is_grad")?;
                self.emit(
                    K::SparseSoftmaxCrossEntropyWithLogits,
                    vec![logits.into(), labels.into()],
                    Attrs::new().with("is_grad", Attr::Bool(is_grad)),
                )
            }
            "SoftmaxCrossEntropyWithLogits" => {
                let logits = self.tensor(0)?;
                let labels = self.tensor(1)?;
                self.emit(
                    K::SoftmaxCrossEntropyWithLogits,
                    vec![logits.into(), labels.into()],
                    Attrs::new(),
                )
            }
            _ => Err(Fault::Unmapped),
        }
    }

    /// `StridedSlice(x, begin, end, strides, begin_mask, end_mask, ellipsis_mask,
    /// new_axis_mask, shrink_axis_mask)`: the masks are resolved against x's shape into
    /// explicit bounds (shardc's StridedSlice takes none), and a shrunk axis is dropped by a
    /// Reshape after the slice.
    fn strided_slice(&mut self) -> NodeResult {
        let x = self.tensor(0)?;
        let shape = self.shape(x)?;
        let begin = self.ints_arg(1, "begin")?;
        let end = self.ints_arg(2, "end")?;
        let strides = self.ints_arg(3, "strides")?;
        let mask = |cx: &Self, i: usize, name: &str| cx.int_arg(i, name).unwrap_or(0);
        let begin_mask = mask(self, 4, "begin_mask");
        let end_mask = mask(self, 5, "end_mask");
        let ellipsis = mask(self, 6, "ellipsis_mask");
        let new_axis = mask(self, 7, "new_axis_mask");
        let shrink = mask(self, 8, "shrink_axis_mask");
        if ellipsis != 0 || new_axis != 0 {
            return bad(format!(
                "ellipsis_mask {ellipsis} and new_axis_mask {new_axis} are not supported (only 0)"
            ));
        }
        if begin.len() != end.len() || begin.len() != strides.len() || begin.len() > shape.len() {
            return bad(format!(
                "begin {begin:?}, end {end:?} and strides {strides:?} do not fit a rank-{} input",
                shape.len()
            ));
        }
        let (mut b, mut e, mut s, mut kept) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, &dim) in shape.iter().enumerate() {
            let dim = dim as i64;
            let bit = |m: i64| (m >> i) & 1 == 1;
            let Some(&stride) = strides.get(i) else {
                b.push(0);
                e.push(dim);
                s.push(1);
                kept.push(dim);
                continue;
            };
            if stride != 1 {
                return bad(format!(
                    "stride {stride} on axis {i} is not supported (only 1)"
                ));
            }
            let norm = |v: i64| {
                if v < 0 {
                    (v + dim).clamp(0, dim)
                } else {
                    v.min(dim)
                }
            };
            let lo = if bit(begin_mask) { 0 } else { norm(begin[i]) };
            let hi = if bit(shrink) {
                lo + 1
            } else if bit(end_mask) {
                dim
            } else {
                norm(end[i])
            };
            if hi <= lo || hi > dim {
                return bad(format!(
                    "axis {i}: the slice [{lo}, {hi}) of {dim} is empty"
                ));
            }
            b.push(lo);
            e.push(hi);
            s.push(1);
            if !bit(shrink) {
                kept.push(hi - lo);
            }
        }
        let sliced = self.emit(
            OpKind::StridedSlice,
            vec![
                x.into(),
                Const::Ints(b).into(),
                Const::Ints(e).into(),
                Const::Ints(s).into(),
            ],
            Attrs::new(),
        )?;
        if shrink == 0 {
            return Ok(sliced);
        }
        let Val::Tensor(t) = sliced else {
            return Ok(sliced);
        };
        self.emit(
            OpKind::Reshape,
            vec![t.into(), Const::Ints(kept).into()],
            Attrs::new(),
        )
    }

    /// Copies the primitive's `format` / `data_format` to shardc's `data_format` (only
    /// `NCHW` is supported).
    fn data_format(&self, attrs: &mut Attrs) -> Result<(), Fault> {
        let format = match self.prim_str("format")? {
            Some(f) => Some(f),
            None => self.prim_str("data_format")?,
        };
        match format.as_deref() {
            None | Some("NCHW") => {
                attrs.set("data_format", Attr::Str("NCHW".into()));
                Ok(())
            }
            Some(other) => bad(format!("data format {other} is not supported (only NCHW)")),
        }
    }

    /// Adds one op. The node's first op takes its instance name and strategies.
    fn emit(&mut self, op: OpKind, inputs: Vec<Operand>, attrs: Attrs) -> NodeResult {
        let (instance, in_s, out_s) = if self.first {
            self.first = false;
            (
                self.instance.clone(),
                self.strategy("in_strategy")?,
                self.strategy("out_strategy")?,
            )
        } else {
            (String::new(), None, None)
        };
        self.reader
            .builder
            .op_full(op, &inputs, attrs, &instance, in_s, out_s)
            .map(Val::Tensor)
            .map_err(|e| Fault::Bad(e.to_string()))
    }

    fn strategy(&self, name: &str) -> Result<Option<Strategy>, Fault> {
        let Some(lit) = self.prim_attr(name) else {
            return Ok(None);
        };
        let Lit::Seq(entries) = &lit else {
            return bad(format!(
                "{name} {} is not a tuple of tuples",
                lit.describe()
            ));
        };
        let rows: Option<Vec<Vec<i64>>> = entries.iter().map(Lit::as_ints).collect();
        match rows {
            Some(rows) => Ok(Some(Strategy(rows))),
            None => bad(format!(
                "{name} {} is not a tuple of integer tuples",
                lit.describe()
            )),
        }
    }

    fn arg(&self, i: usize) -> Result<&Val, Fault> {
        match self.args.get(i) {
            Some(Val::Unknown) => Err(Fault::Upstream),
            Some(v) => Ok(v),
            None => bad(format!(
                "input {i} is missing (the node has {})",
                self.args.len()
            )),
        }
    }

    fn tensor(&self, i: usize) -> Result<Value, Fault> {
        match self.arg(i)? {
            Val::Tensor(t) => Ok(*t),
            other => bad(format!("input {i} is {}, not a tensor", describe(other))),
        }
    }

    /// Input `i` as an operand: a tensor, a scalar constant in place, or a constant tensor as
    /// a non-trainable weight.
    fn operand(&mut self, i: usize) -> Result<Operand, Fault> {
        match self.arg(i)?.clone() {
            Val::Tensor(t) => Ok(t.into()),
            Val::Lit(Lit::Int(v)) => Ok(Const::Float(v as f64).into()),
            Val::Lit(Lit::Float(v)) => Ok(Const::Float(v).into()),
            Val::Lit(Lit::Tensor(t)) if t.len() == 1 && t.shape.is_empty() => {
                Ok(Const::Float(scalar_of(&t).unwrap_or(0.0)).into())
            }
            Val::Lit(Lit::Tensor(t)) => {
                let r = &mut *self.reader;
                r.constants += 1;
                let name = format!("constant_{}", r.constants);
                let v = r
                    .builder
                    .weight_with(
                        &name,
                        t.dtype(),
                        &t.shape.clone(),
                        shardc_ir::Init::Zeros,
                        false,
                    )
                    .map_err(|e| Fault::Bad(e.to_string()))?;
                r.weights.push((name, t));
                Ok(v.into())
            }
            other => bad(format!(
                "input {i} is {}, not a tensor or a number",
                describe(&other)
            )),
        }
    }

    fn shape(&self, v: Value) -> Result<Vec<usize>, Fault> {
        self.reader
            .builder
            .ty(&v)
            .map(|t| t.shape)
            .ok_or_else(|| Fault::Bad("an input has no tensor type".into()))
    }

    fn prim_attr(&self, name: &str) -> Option<Lit> {
        let attr = self
            .prim?
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))?;
        lit_of(attr).ok()
    }

    fn prim_str(&self, name: &str) -> Result<Option<String>, Fault> {
        match self.prim_attr(name) {
            None => Ok(None),
            Some(Lit::Str(s)) => Ok(Some(s)),
            Some(Lit::Int(0)) if name.contains("format") => Ok(Some("NCHW".into())),
            Some(other) => bad(format!(
                "attribute {name} {} is not a string",
                other.describe()
            )),
        }
    }

    /// Constant input `i`, else the primitive's attribute `name` (older files keep scalars
    /// there).
    fn lit_or_attr(&self, i: usize, name: &str) -> Option<Lit> {
        match self.args.get(i) {
            Some(Val::Lit(l)) => Some(l.clone()),
            _ => self.prim_attr(name),
        }
    }

    fn int_arg(&self, i: usize, name: &str) -> Result<i64, Fault> {
        match self.lit_or_attr(i, name) {
            Some(l) => l
                .as_int()
                .ok_or_else(|| Fault::Bad(format!("{name} {} is not an integer", l.describe()))),
            None => bad(format!("{name} (input {i}) is missing")),
        }
    }

    fn float_arg(&self, i: usize, name: &str) -> Result<f64, Fault> {
        match self.lit_or_attr(i, name) {
            Some(l) => l
                .as_float()
                .ok_or_else(|| Fault::Bad(format!("{name} {} is not a number", l.describe()))),
            None => bad(format!("{name} (input {i}) is missing")),
        }
    }

    fn ints_arg(&self, i: usize, name: &str) -> Result<Vec<i64>, Fault> {
        match self.lit_or_attr(i, name) {
            Some(l) => l
                .as_ints()
                .ok_or_else(|| Fault::Bad(format!("{name} {} is not integers", l.describe()))),
            None => bad(format!("{name} (input {i}) is missing")),
        }
    }

    /// A boolean from constant input `i` or the attribute `name` (or its older `alias`);
    /// false when absent.
    fn flag(&self, i: usize, name: &str, alias: &str) -> Result<bool, Fault> {
        let lit = self.lit_or_attr(i, name).or_else(|| self.prim_attr(alias));
        match lit {
            None => Ok(false),
            Some(l) => l
                .as_bool()
                .ok_or_else(|| Fault::Bad(format!("{name} {} is not a boolean", l.describe()))),
        }
    }
}

fn describe(v: &Val) -> String {
    match v {
        Val::Tensor(_) => "a tensor".into(),
        Val::Lit(l) => format!("the constant {}", l.describe()),
        Val::Seq(items) => format!("a tuple of {}", items.len()),
        Val::Unknown => "unknown".into(),
    }
}

/// An attribute's value.
fn lit_of(a: &AttributeProto) -> Result<Lit, String> {
    use AttributeType as T;
    let ty = a.r#type.unwrap_or(0);
    let int = || a.i.or_else(|| a.ints.first().copied()).unwrap_or(0);
    let Ok(t) = T::try_from(ty) else {
        return Err(format!("attribute type {ty} is unknown"));
    };
    Ok(match t {
        T::Float => Lit::Float(f64::from(
            a.f.or_else(|| a.floats.first().copied()).unwrap_or(0.0),
        )),
        T::Double => Lit::Float(a.d.or_else(|| a.doubles.first().copied()).unwrap_or(0.0)),
        T::Uint8 | T::Int8 | T::Uint16 | T::Int16 | T::Int32 | T::Int64 | T::Uint32 | T::Uint64 => {
            Lit::Int(int())
        }
        T::Bool => Lit::Bool(int() != 0),
        T::String => Lit::Str(String::from_utf8_lossy(a.s.as_deref().unwrap_or_default()).into()),
        T::Tensor => match &a.t {
            Some(t) => Lit::Tensor(tensor_of(t)?),
            None => return Err("a tensor attribute without its tensor".into()),
        },
        T::Tensors => match a.tensors.first() {
            Some(t) => Lit::Tensor(tensor_of(t)?),
            None => return Err("a tensor attribute without its tensor".into()),
        },
        T::Tuple | T::List => Lit::Seq(a.values.iter().map(lit_of).collect::<Result<_, _>>()?),
        T::Umonad | T::Iomonad => Lit::Monad,
        T::None => Lit::None,
        other => {
            return Err(format!(
                "attribute type {} is not supported",
                other.as_str_name()
            ))
        }
    })
}

/// shardc's element type of a MindIR `DataType`.
fn dtype_of(t: i32) -> Option<DType> {
    use DataType as D;
    Some(match D::try_from(t).ok()? {
        D::Float => DType::Float32,
        D::Double | D::Float64 => DType::Float64,
        D::Float16 => DType::Float16,
        D::Bfloat16 => DType::BFloat16,
        D::Int32 => DType::Int32,
        D::Int64 => DType::Int64,
        D::Bool => DType::Bool,
        _ => return None,
    })
}

fn type_name(t: i32) -> String {
    DataType::try_from(t)
        .map(|d| d.as_str_name().to_string())
        .unwrap_or_else(|_| format!("#{t}"))
}

fn static_shape(dims: &[i64]) -> Option<Vec<usize>> {
    dims.iter().map(|&d| usize::try_from(d).ok()).collect()
}

/// A tensor's value, from its raw little-endian bytes or its typed fields. Narrow integers
/// are widened to Int32, as the other readers do.
fn tensor_of(t: &TensorProto) -> Result<Tensor, String> {
    use DataType as D;
    if t.external_data.is_some() {
        return Err("its data is in an external file, which is not supported".into());
    }
    let shape = static_shape(&t.dims).ok_or_else(|| format!("dynamic shape {:?}", t.dims))?;
    let n: usize = shape.iter().product();
    let code = t.data_type.unwrap_or(0);
    let dt = D::try_from(code).map_err(|_| format!("element type #{code} is unknown"))?;
    let raw = t.raw_data.as_deref().unwrap_or_default();
    let width = match dt {
        D::Float | D::Int32 | D::Uint32 => 4,
        D::Double | D::Float64 | D::Int64 | D::Uint64 => 8,
        D::Float16 | D::Bfloat16 | D::Int16 | D::Uint16 => 2,
        D::Bool | D::Int8 | D::Uint8 => 1,
        _ => {
            return Err(format!(
                "element type {} is not supported",
                dt.as_str_name()
            ))
        }
    };
    let from_raw = !raw.is_empty() || n == 0;
    if from_raw && raw.len() != n * width {
        return Err(format!(
            "{} bytes of data for {n} elements of {} ({} bytes expected): the file is damaged",
            raw.len(),
            dt.as_str_name(),
            n * width
        ));
    }
    let chunks = |w: usize| raw.chunks_exact(w);
    let typed_len = |len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(format!(
                "{len} values for {n} elements: the file is damaged"
            ))
        }
    };
    let data = match dt {
        D::Float if from_raw => Data::F32(
            chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        D::Float => {
            typed_len(t.float_data.len())?;
            Data::F32(t.float_data.clone())
        }
        D::Double | D::Float64 if from_raw => Data::F64(
            chunks(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
        D::Double | D::Float64 => {
            typed_len(t.double_data.len())?;
            Data::F64(t.double_data.clone())
        }
        D::Float16 => Data::F16(
            chunks(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        D::Bfloat16 => Data::BF16(
            chunks(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        D::Int32 if from_raw => Data::I32(
            chunks(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ),
        D::Int32 => {
            typed_len(t.int32_data.len())?;
            Data::I32(t.int32_data.clone())
        }
        D::Int64 if from_raw => Data::I64(
            chunks(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
        ),
        D::Int64 => {
            typed_len(t.int64_data.len())?;
            Data::I64(t.int64_data.clone())
        }
        D::Uint32 => Data::I64(
            chunks(4)
                .map(|c| i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
        D::Int16 => Data::I32(
            chunks(2)
                .map(|c| i32::from(i16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        D::Uint16 => Data::I32(
            chunks(2)
                .map(|c| i32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
        ),
        D::Int8 => Data::I32(raw.iter().map(|&b| i32::from(b as i8)).collect()),
        D::Uint8 => Data::I32(raw.iter().map(|&b| i32::from(b)).collect()),
        D::Bool => Data::Bool(raw.iter().map(|&b| b != 0).collect()),
        _ => {
            return Err(format!(
                "element type {} is not supported",
                dt.as_str_name()
            ))
        }
    };
    if !from_raw && !matches!(dt, D::Float | D::Double | D::Float64 | D::Int32 | D::Int64) {
        return Err(format!(
            "{} data without raw bytes is not supported",
            dt.as_str_name()
        ));
    }
    Ok(Tensor { shape, data })
}
