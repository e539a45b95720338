//! The graph: parameters, nodes in program order, and the returned values.

use crate::attr::{Attrs, Const, Strategy};
use crate::op::OpKind;
use crate::types::{TensorType, Type};
use serde::{Deserialize, Serialize};

/// Index of a node in [`Graph::nodes`]. Printed as `%{index + 1}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The index into [`Graph::nodes`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Index of a parameter in [`Graph::params`]. Printed as `%para{index + 1}_{name}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ParamId(pub u32);

impl ParamId {
    /// The index into [`Graph::params`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// An operand of a node: the result of an earlier node, a parameter, or a constant written in
/// place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Operand {
    /// The result of an earlier node.
    Node(NodeId),
    /// A graph parameter (data input or weight).
    Param(ParamId),
    /// A constant.
    Const(Const),
}

impl Operand {
    /// The constant, if this operand is one.
    pub fn as_const(&self) -> Option<&Const> {
        match self {
            Operand::Const(c) => Some(c),
            _ => None,
        }
    }
}

impl From<NodeId> for Operand {
    fn from(n: NodeId) -> Self {
        Operand::Node(n)
    }
}

impl From<ParamId> for Operand {
    fn from(p: ParamId) -> Self {
        Operand::Param(p)
    }
}

impl From<Const> for Operand {
    fn from(c: Const) -> Self {
        Operand::Const(c)
    }
}

/// How a weight is initialised. Every random initializer carries its own seed, so the same
/// graph always starts from the same numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Init {
    /// `normal(sigma=.., mean=.., seed=..)`.
    Normal {
        /// Standard deviation.
        sigma: f64,
        /// Mean.
        mean: f64,
        /// Seed.
        seed: u64,
    },
    /// `uniform(scale=.., seed=..)`: uniform on `[-scale, scale]`.
    Uniform {
        /// Half-width of the interval.
        scale: f64,
        /// Seed.
        seed: u64,
    },
    /// `zeros`.
    Zeros,
    /// `ones`.
    Ones,
    /// `constant(value=..)`.
    Constant {
        /// The value of every element.
        value: f64,
    },
    /// `xavier_uniform(gain=.., seed=..)`: uniform with bound `gain * sqrt(6 / (fan_in + fan_out))`.
    XavierUniform {
        /// Gain.
        gain: f64,
        /// Seed.
        seed: u64,
    },
    /// `he_normal(seed=..)`: normal with `sigma = sqrt(2 / fan_in)` (fan-in mode, ReLU gain).
    HeNormal {
        /// Seed.
        seed: u64,
    },
    /// `INIT block (0, 8) of (32, 16)`: the block at `offset` (of the parameter's own shape) of
    /// the tensor that `of` initialises at `global_shape`. A rank's slice of a sharded weight
    /// carries it, so that the slices of all ranks assemble to the single-device weight.
    Block {
        /// The initializer of the whole (logical) tensor.
        of: Box<Init>,
        /// The shape of the whole tensor.
        global_shape: Vec<usize>,
        /// Where the block starts, per dimension.
        offset: Vec<usize>,
    },
}

/// What a parameter is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ParamKind {
    /// A data input, fed every step: `<Tensor[Float32], (16, 32)>`.
    Input,
    /// A weight or optimizer state (a MindSpore `Ref` parameter) with its initializer.
    Weight {
        /// How it is initialised.
        init: Init,
        /// Whether autodiff computes its gradient (false for optimizer state, moving
        /// statistics, step counters).
        requires_grad: bool,
    },
}

/// A graph parameter: a data input or a weight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Param {
    /// The parameter's name (`x`, `w`, `moments.w`).
    pub name: String,
    /// Its type.
    pub ty: TensorType,
    /// Input or weight.
    pub kind: ParamKind,
}

impl Param {
    /// Whether this is a weight (a `Ref` parameter).
    pub fn is_weight(&self) -> bool {
        matches!(self.kind, ParamKind::Weight { .. })
    }

    /// Whether autodiff should compute this parameter's gradient.
    pub fn requires_grad(&self) -> bool {
        matches!(
            self.kind,
            ParamKind::Weight {
                requires_grad: true,
                ..
            }
        )
    }
}

/// One operation in the graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    /// The operator.
    pub op: OpKind,
    /// Operands, in the op's order.
    pub inputs: Vec<Operand>,
    /// `primitive_attrs` other than the strategies.
    pub attrs: Attrs,
    /// `cnode_attrs`, printed only when not empty.
    pub cnode_attrs: Attrs,
    /// The result type (filled by shape inference).
    pub ty: Type,
    /// The value's debug name, `out` in `%3(out)`.
    pub name: String,
    /// The instance name (`matmul`, `forward_op_...`).
    pub instance: String,
    /// The scope (`Default/network-WithLossCell/_backbone-Net`); empty when none.
    pub scope: String,
    /// The parallel strategy of the inputs, `in_strategy`.
    pub in_strategy: Option<Strategy>,
    /// The parallel strategy of the output, `out_strategy`.
    pub out_strategy: Option<Strategy>,
    /// Extra comment lines printed under the node (`# strategy from: ...`), without the `#`.
    pub comments: Vec<String>,
}

impl Node {
    /// A node with the given op and operands, no attributes, an empty tuple type (to be set by
    /// shape inference) and default names.
    pub fn new(op: OpKind, inputs: Vec<Operand>) -> Self {
        Node {
            op,
            inputs,
            attrs: Attrs::new(),
            cnode_attrs: Attrs::new(),
            ty: Type::Tuple(Vec::new()),
            name: "out".to_string(),
            instance: String::new(),
            scope: String::new(),
            in_strategy: None,
            out_strategy: None,
            comments: Vec::new(),
        }
    }
}

/// A graph: parameters (inputs and weights), nodes in a valid execution order (every operand
/// refers to a parameter or an earlier node), and the returned values. The first returned value
/// is the loss.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    /// The graph's name, `Net` in `@Net`.
    pub name: String,
    /// Parameters, in order.
    pub params: Vec<Param>,
    /// Nodes, in execution order.
    pub nodes: Vec<Node>,
    /// Returned values (`Return(%6)`).
    pub outputs: Vec<Operand>,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            params: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// Adds a parameter and returns its id.
    pub fn add_param(&mut self, param: Param) -> ParamId {
        self.params.push(param);
        ParamId((self.params.len() - 1) as u32)
    }

    /// Appends a node and returns its id. The caller is responsible for its type being right
    /// (the verifier in `shardc-passes` checks).
    pub fn push_node(&mut self, node: Node) -> NodeId {
        self.nodes.push(node);
        NodeId((self.nodes.len() - 1) as u32)
    }

    /// The node with this id.
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    /// The parameter with this id.
    pub fn param(&self, id: ParamId) -> &Param {
        &self.params[id.index()]
    }

    /// The parameter named `name`.
    pub fn param_by_name(&self, name: &str) -> Option<ParamId> {
        self.params
            .iter()
            .position(|p| p.name == name)
            .map(|i| ParamId(i as u32))
    }

    /// The node with instance name `instance`.
    pub fn node_by_instance(&self, instance: &str) -> Option<NodeId> {
        self.nodes
            .iter()
            .position(|n| n.instance == instance)
            .map(|i| NodeId(i as u32))
    }

    /// The type of a tensor operand: a parameter's type or a node's single-tensor type.
    /// `None` for constants and tuple-typed nodes.
    pub fn operand_tensor_type(&self, operand: &Operand) -> Option<&TensorType> {
        match operand {
            Operand::Node(n) => self.nodes.get(n.index())?.ty.as_tensor(),
            Operand::Param(p) => self.params.get(p.index()).map(|p| &p.ty),
            Operand::Const(_) => None,
        }
    }

    /// Ids of all nodes, in order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// For every node, the ids of the nodes that use its result, in order.
    pub fn users(&self) -> Vec<Vec<NodeId>> {
        let mut users = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for op in &n.inputs {
                if let Operand::Node(src) = op {
                    if let Some(u) = users.get_mut(src.index()) {
                        if u.last() != Some(&NodeId(i as u32)) {
                            u.push(NodeId(i as u32));
                        }
                    }
                }
            }
        }
        users
    }

    /// The first returned value (the loss, by convention).
    pub fn loss(&self) -> Option<&Operand> {
        self.outputs.first()
    }
}
