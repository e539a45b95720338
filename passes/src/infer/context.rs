//! The inference context shared by the op families: one node being typed, with accessors
//! that turn every malformed operand or attribute into an [`InferError`].

use super::error::InferError;
use super::shapes::to_sizes;
use super::signatures::{OperandSpec, Signature};
use super::text::{const_text, ints_text, operand_text, sh};
use shardc_ir::{Attr, Const, DType, Graph, Node, OpKind, Operand, ParamKind, TensorType, Type};

/// One node being typed: its graph, which nodes it may see, and accessors that turn every
/// malformed operand or attribute into an [`InferError`].
pub(crate) struct Cx<'a> {
    /// The graph the node's operands refer to.
    pub graph: &'a Graph,
    /// The node being typed.
    pub node: &'a Node,
    /// Nodes with an index below `limit` are visible.
    pub limit: usize,
    /// The op's operand signature.
    pub sig: Signature,
}

impl<'a> Cx<'a> {
    /// The op.
    pub fn op(&self) -> OpKind {
        self.node.op
    }

    /// An error about this node.
    pub fn err(&self, reason: impl Into<String>) -> InferError {
        InferError::new(self.node, reason)
    }

    /// `input 1 (b)`.
    pub fn name(&self, i: usize) -> String {
        format!("input {i} ({})", self.sig.name(i))
    }

    /// Checks the operand count and the kind of every operand against the op's signature.
    pub(crate) fn check_signature(&self) -> Result<(), InferError> {
        let sig = self.sig;
        let n = self.node.inputs.len();
        let names: Vec<&str> = sig.operands.iter().map(|o| o.0).collect();
        if sig.variadic {
            if n < sig.required {
                return Err(self.err(format!(
                    "expects at least {} operand(s), got {n}",
                    sig.required
                )));
            }
        } else if n < sig.required || n > sig.operands.len() {
            let expected = if sig.required == sig.operands.len() {
                format!("{}", sig.required)
            } else {
                format!("{} to {}", sig.required, sig.operands.len())
            };
            if names.is_empty() {
                return Err(self.err(format!("expects no operands, got {n}")));
            }
            return Err(self.err(format!(
                "expects {expected} operand(s) ({}), got {n}",
                names.join(", ")
            )));
        }
        for (i, operand) in self.node.inputs.iter().enumerate() {
            let spec = sig.spec(i).unwrap_or(OperandSpec::Tensor);
            self.check_kind(i, operand, spec)?;
        }
        Ok(())
    }

    fn check_kind(&self, i: usize, operand: &Operand, spec: OperandSpec) -> Result<(), InferError> {
        use OperandSpec::*;
        let wanted = match spec {
            Tensor => "a tensor",
            Ints => "a constant tuple of integers",
            Int => "a constant integer",
            Number => "a constant number",
            TensorOrNumber => "a tensor or a number constant",
            Scalar => "a number constant or a one-element float tensor",
            Weight => "a weight parameter",
        };
        let ok = match (spec, operand) {
            (Tensor, Operand::Const(_)) => false,
            (Tensor | TensorOrNumber | Scalar, _) => match operand {
                Operand::Const(c) => matches!(c, Const::Int(_) | Const::Float(_)),
                _ => true,
            },
            (Ints, Operand::Const(Const::Ints(_) | Const::Int(_))) => true,
            (Int, Operand::Const(Const::Int(_))) => true,
            (Number, Operand::Const(Const::Int(_) | Const::Float(_))) => true,
            (Weight, Operand::Param(p)) => {
                let param = self.graph.params.get(p.index()).ok_or_else(|| {
                    self.err(format!(
                        "{} refers to parameter #{}, which does not exist",
                        self.name(i),
                        p.index() + 1
                    ))
                })?;
                if !matches!(param.kind, ParamKind::Weight { .. }) {
                    return Err(self.err(format!(
                        "{} must be a weight parameter, got the data input {}",
                        self.name(i),
                        operand_text(self.graph, operand)
                    )));
                }
                true
            }
            _ => false,
        };
        if ok {
            return Ok(());
        }
        let got = match operand {
            Operand::Const(c) => format!("the constant {}", const_text(c)),
            other => format!("the tensor {}", operand_text(self.graph, other)),
        };
        Err(self.err(format!("{} must be {wanted}, got {got}", self.name(i))))
    }

    /// The type of the value operand `i` refers to: a tensor or a tuple.
    pub fn value_type(&self, i: usize) -> Result<&'a Type, InferError> {
        self.value_type_of(i).map(|(t, _)| t)
    }

    /// `(type, producing node)` of operand `i`, which must be a node or a parameter.
    fn value_type_of(&self, i: usize) -> Result<(&'a Type, Option<&'a Node>), InferError> {
        let graph: &'a Graph = self.graph;
        let operand = self
            .node
            .inputs
            .get(i)
            .ok_or_else(|| self.err(format!("{} is missing", self.name(i))))?;
        match operand {
            Operand::Node(id) => {
                let idx = id.index();
                if idx >= self.limit {
                    let why = if idx < graph.nodes.len() {
                        "which is not computed before this node"
                    } else {
                        "which does not exist"
                    };
                    return Err(self.err(format!(
                        "{} refers to %{}, {why}",
                        self.name(i),
                        idx + 1
                    )));
                }
                let n = &graph.nodes[idx];
                Ok((&n.ty, Some(n)))
            }
            Operand::Param(p) => Err(self.err(format!(
                "{} must be the result of a node, got the parameter {}",
                self.name(i),
                operand_text(graph, &Operand::Param(*p))
            ))),
            Operand::Const(c) => Err(self.err(format!(
                "{} must be a tensor, got the constant {}",
                self.name(i),
                const_text(c)
            ))),
        }
    }

    /// Operand `i` as a tensor type (a parameter or a node with a single-tensor result).
    pub fn tensor(&self, i: usize) -> Result<&'a TensorType, InferError> {
        let graph: &'a Graph = self.graph;
        match self.node.inputs.get(i) {
            Some(Operand::Param(p)) => {
                graph.params.get(p.index()).map(|p| &p.ty).ok_or_else(|| {
                    self.err(format!(
                        "{} refers to parameter #{}, which does not exist",
                        self.name(i),
                        p.index() + 1
                    ))
                })
            }
            _ => {
                let (ty, producer) = self.value_type_of(i)?;
                match ty {
                    Type::Tensor(t) => Ok(t),
                    Type::Tuple(ts) => {
                        let what = producer.map_or_else(String::new, |n| {
                            if n.instance.is_empty() {
                                format!(" ({})", n.op)
                            } else {
                                format!(" ({} '{}')", n.op, n.instance)
                            }
                        });
                        Err(self.err(format!(
                            "{} is the {}-element tuple result of {}{what}; take one element with TupleGetItem",
                            self.name(i),
                            ts.len(),
                            operand_text(graph, &self.node.inputs[i]),
                        )))
                    }
                }
            }
        }
    }

    /// Operand `i` as a tensor of a float element type.
    pub fn float_tensor(&self, i: usize) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if !t.dtype.is_float() {
            return Err(self.err(format!(
                "{} must have a float element type, got {t}",
                self.name(i)
            )));
        }
        Ok(t)
    }

    /// Operand `i` as a tensor of an integer element type (Int32 or Int64).
    pub fn int_tensor(&self, i: usize) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if !t.dtype.is_int() {
            return Err(self.err(format!(
                "{} must have an integer element type (Int32 or Int64), got {t}",
                self.name(i)
            )));
        }
        Ok(t)
    }

    /// Checks that operands `i` and `j` (both tensors) have the same element type.
    pub fn same_dtype(&self, i: usize, j: usize) -> Result<(), InferError> {
        let (a, b) = (self.tensor(i)?, self.tensor(j)?);
        if a.dtype != b.dtype {
            return Err(self.err(format!(
                "mixed element types: {} is {} but {} is {}",
                self.name(i),
                a.dtype,
                self.name(j),
                b.dtype
            )));
        }
        Ok(())
    }

    /// Checks that tensor operand `j` has exactly the type (dtype and shape) of operand `i`.
    pub fn same_type(&self, i: usize, j: usize) -> Result<(), InferError> {
        self.same_dtype(i, j)?;
        let (a, b) = (self.tensor(i)?, self.tensor(j)?);
        if a.shape != b.shape {
            return Err(self.err(format!(
                "{} has shape {} but {} has shape {}; they must be equal",
                self.name(j),
                sh(&b.shape),
                self.name(i),
                sh(&a.shape)
            )));
        }
        Ok(())
    }

    /// Checks that tensor operand `i` has shape `expected` (`why` says where it comes from).
    pub fn expect_shape(&self, i: usize, expected: &[usize], why: &str) -> Result<(), InferError> {
        let t = self.tensor(i)?;
        if t.shape != expected {
            return Err(self.err(format!(
                "{} has shape {} but {why} requires {}",
                self.name(i),
                sh(&t.shape),
                sh(expected)
            )));
        }
        Ok(())
    }

    /// Checks that tensor operand `i` has rank `rank` (`what` describes the layout).
    pub fn expect_rank(
        &self,
        i: usize,
        rank: usize,
        what: &str,
    ) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if t.rank() != rank {
            return Err(self.err(format!(
                "{} must have rank {rank} {what}, got shape {}",
                self.name(i),
                sh(&t.shape)
            )));
        }
        Ok(t)
    }

    /// Checks that tensor operand `i` has rank at least `rank`.
    pub fn expect_min_rank(
        &self,
        i: usize,
        rank: usize,
        what: &str,
    ) -> Result<&'a TensorType, InferError> {
        let t = self.tensor(i)?;
        if t.rank() < rank {
            return Err(self.err(format!(
                "{} must have rank >= {rank} {what}, got shape {}",
                self.name(i),
                sh(&t.shape)
            )));
        }
        Ok(t)
    }

    /// Constant operand `i`.
    pub fn constant(&self, i: usize) -> Result<&'a Const, InferError> {
        let node: &'a Node = self.node;
        match node.inputs.get(i) {
            Some(Operand::Const(c)) => Ok(c),
            Some(other) => Err(self.err(format!(
                "{} must be a constant, got the tensor {}",
                self.name(i),
                operand_text(self.graph, other)
            ))),
            None => Err(self.err(format!("{} is missing", self.name(i)))),
        }
    }

    /// Constant operand `i` as integers.
    pub fn ints(&self, i: usize) -> Result<Vec<i64>, InferError> {
        let c = self.constant(i)?;
        c.as_ints().ok_or_else(|| {
            self.err(format!(
                "{} must be a tuple of integers, got {}",
                self.name(i),
                const_text(c)
            ))
        })
    }

    /// Constant operand `i` as sizes (integers >= 0).
    pub fn sizes(&self, i: usize) -> Result<Vec<usize>, InferError> {
        let v = self.ints(i)?;
        to_sizes(&v).ok_or_else(|| {
            self.err(format!(
                "{} must hold sizes (integers >= 0), got {}",
                self.name(i),
                ints_text(&v)
            ))
        })
    }

    /// Constant operand `i` as one integer.
    pub fn int(&self, i: usize) -> Result<i64, InferError> {
        let c = self.constant(i)?;
        c.as_int().ok_or_else(|| {
            self.err(format!(
                "{} must be an integer, got {}",
                self.name(i),
                const_text(c)
            ))
        })
    }

    /// Whether operand `i` is a constant.
    pub fn is_const(&self, i: usize) -> bool {
        matches!(self.node.inputs.get(i), Some(Operand::Const(_)))
    }

    /// Checks a scalar hyper-parameter operand: a number constant, or a one-element tensor
    /// with element type `dtype`.
    pub fn scalar(&self, i: usize, dtype: DType) -> Result<(), InferError> {
        if self.is_const(i) {
            let c = self.constant(i)?;
            return match c {
                Const::Int(_) | Const::Float(_) => Ok(()),
                other => Err(self.err(format!(
                    "{} must be a number, got {}",
                    self.name(i),
                    const_text(other)
                ))),
            };
        }
        let t = self.tensor(i)?;
        if t.num_elements() != 1 {
            return Err(self.err(format!(
                "{} must be a scalar (one element), got shape {}",
                self.name(i),
                sh(&t.shape)
            )));
        }
        if t.dtype != dtype {
            return Err(self.err(format!(
                "mixed element types: {} is {} but the result is {dtype}",
                self.name(i),
                t.dtype
            )));
        }
        Ok(())
    }

    // ---- attributes ----

    fn bad_attr(&self, key: &str, wanted: &str, got: &Attr) -> InferError {
        self.err(format!("attribute `{key}` must be {wanted}, got {}", got))
    }

    /// A boolean attribute (default when absent).
    pub fn attr_bool(&self, key: &str, default: bool) -> Result<bool, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a
                .as_bool()
                .ok_or_else(|| self.bad_attr(key, "true or false", a)),
        }
    }

    /// An integer attribute (default when absent).
    pub fn attr_int(&self, key: &str, default: i64) -> Result<i64, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a
                .as_int()
                .ok_or_else(|| self.bad_attr(key, "an integer", a)),
        }
    }

    /// A required integer attribute.
    pub fn attr_int_req(&self, key: &str) -> Result<i64, InferError> {
        match self.node.attrs.get(key) {
            None => Err(self.err(format!("attribute `{key}` is missing"))),
            Some(a) => a
                .as_int()
                .ok_or_else(|| self.bad_attr(key, "an integer", a)),
        }
    }

    /// A float attribute (integers convert; default when absent).
    pub fn attr_float(&self, key: &str, default: f64) -> Result<f64, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a
                .as_float()
                .ok_or_else(|| self.bad_attr(key, "a number", a)),
        }
    }

    /// A word attribute (default when absent).
    pub fn attr_str(&self, key: &str, default: &'a str) -> Result<&'a str, InferError> {
        let node: &'a Node = self.node;
        match node.attrs.get(key) {
            None => Ok(default),
            Some(a) => a.as_str().ok_or_else(|| self.bad_attr(key, "a word", a)),
        }
    }

    /// An integer tuple attribute, if present.
    pub fn attr_ints(&self, key: &str) -> Result<Option<Vec<i64>>, InferError> {
        match self.node.attrs.get(key) {
            None => Ok(None),
            Some(a) => a
                .as_ints()
                .map(Some)
                .ok_or_else(|| self.bad_attr(key, "an integer or a tuple of integers", a)),
        }
    }

    /// The single result type of float ops that keep their first operand's type.
    pub fn keep(&self, i: usize) -> Result<Type, InferError> {
        Ok(Type::Tensor(self.float_tensor(i)?.clone()))
    }
}
