//! The graph builder: the one way the frontend adds parameters and nodes to a graph.
//!
//! [`GraphBuilder`] owns a [`Graph`] under construction. Every node it adds is typed at once
//! by the shape rules of `shardc-passes` ([`shardc_passes::infer::infer_node`]), so a shape
//! mistake is reported where it is made, naming the op instance. It also keeps
//!
//! - a **scope stack**, joined by `/` into each node's scope
//!   (`Default/network-WithLossCell/_backbone-Net`);
//! - a **name-prefix stack** for parameters, so that a cell called `fc1` names its weight
//!   `fc1.weight` (MindSpore's parameter names);
//! - **instance-name counters**: an op added without an explicit instance name is named after
//!   its op in MindSpore style, lower-case snake case (`matmul`, `relu`, `reduce_mean`), and
//!   later ones of the same base get a counter from 2 (`matmul2`, `matmul3`, ...);
//! - a **seed**: every random initializer and every dropout gets a seed derived from the
//!   builder's seed and a creation index, so the same program builds the same graph.
//!
//! # Values
//!
//! [`Value`] is a small `Copy` handle to a tensor (or tuple) value of the graph under
//! construction: the result of a node or a parameter. Constants are not values; the generic
//! [`GraphBuilder::op`] takes [`Operand`]s (a `Value` converts with `.into()`, and so do
//! [`Const`]s), the typed shortcuts take constants as plain Rust arguments.

use shardc_ir::{
    Attr, Attrs, Const, DType, Graph, Init, Node, NodeId, OpKind, Operand, Param, ParamId,
    ParamKind, Strategy, TensorType, Type,
};
use shardc_passes::infer::{infer_node, InferError};
use std::collections::{HashMap, HashSet};
use std::fmt;
use thiserror::Error;

/// A handle to a value of the graph under construction: a node's result or a parameter.
///
/// It is `Copy`, so it can be used any number of times. It is only meaningful for the builder
/// that made it; a value from another builder is rejected with [`BuildError::UnknownValue`]
/// when its id is out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// The result of a node.
    Node(NodeId),
    /// A parameter (data input or weight).
    Param(ParamId),
}

impl Value {
    /// The value as an IR operand.
    pub fn operand(self) -> Operand {
        self.into()
    }
}

impl From<Value> for Operand {
    fn from(v: Value) -> Operand {
        match v {
            Value::Node(n) => Operand::Node(n),
            Value::Param(p) => Operand::Param(p),
        }
    }
}

/// An error while building a graph. Every message names the op instance (or parameter) and
/// the reason.
#[derive(Debug, Error)]
pub enum BuildError {
    /// The shape rules rejected a node.
    #[error("op `{instance}` ({op}): {source}")]
    Infer {
        /// Instance name of the rejected node.
        instance: String,
        /// Its op.
        op: OpKind,
        /// Why the shape rules rejected it.
        #[source]
        source: Box<InferError>,
    },
    /// An operand does not belong to this graph.
    #[error("op `{instance}` ({op}): operand {index} ({value}) does not exist in this graph")]
    UnknownValue {
        /// Instance name of the node being added.
        instance: String,
        /// Its op.
        op: OpKind,
        /// Position of the bad operand.
        index: usize,
        /// The operand, as printed.
        value: String,
    },
    /// A strategy does not fit the op: wrong number of entries, wrong number of dimensions
    /// in an entry, or a split count below 1 or not dividing its dimension.
    #[error("op `{instance}` ({op}): {which} {strategy}: {reason}")]
    Strategy {
        /// Instance name.
        instance: String,
        /// Its op.
        op: OpKind,
        /// `in_strategy` or `out_strategy`.
        which: &'static str,
        /// The strategy as written.
        strategy: Box<Strategy>,
        /// What is wrong, naming the entry, the value and its shape.
        reason: String,
    },
    /// Two parameters with one name.
    #[error("parameter `{name}` is defined twice")]
    DuplicateParam {
        /// The name.
        name: String,
    },
    /// A parameter's definition is unusable.
    #[error("parameter `{name}`: {reason}")]
    InvalidParam {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A cell, loss or primitive was given arguments it cannot use.
    #[error("`{instance}`: {reason}")]
    InvalidArgument {
        /// The op instance, cell or loss.
        instance: String,
        /// Why.
        reason: String,
    },
    /// The finished graph failed verification.
    #[error("graph `{graph}` failed verification: {source}")]
    Verify {
        /// The graph's name.
        graph: String,
        /// The verifier's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// MindSpore-style default instance name base of an op: lower-case snake case, with the
/// spellings MindSpore's own cells use (`matmul`, `relu`, `gelu`, `conv2d`, `batch_matmul`).
pub fn instance_base(op: OpKind) -> String {
    let name = op
        .name()
        .replace("MatMul", "Matmul")
        .replace("ReLU", "Relu")
        .replace("GeLU", "Gelu")
        .replace("SiLU", "Silu")
        .replace("Conv2D", "Conv2d")
        .replace("AlltoAll", "AllToAll")
        .replace("SGD", "Sgd");
    let mut out = String::with_capacity(name.len() + 4);
    let mut prev: Option<char> = None;
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            if prev.is_some_and(|p| p.is_ascii_lowercase() || p.is_ascii_digit()) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
        prev = Some(c);
    }
    out
}

/// SplitMix64 finaliser: a well-mixed 64-bit function of its input.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Builds a [`Graph`]: parameters, typed nodes with instance names and scopes, outputs.
///
/// ```
/// use shardc_compiler::builder::GraphBuilder;
/// use shardc_compiler::init;
/// use shardc_ir::DType;
///
/// let mut b = GraphBuilder::new("Net");
/// let x = b.input("x", DType::Float32, &[16, 32])?;
/// let w = b.weight("w", DType::Float32, &[32, 16], init::normal(0.01))?;
/// let y = b.matmul(x, w)?;
/// let y = b.relu(y)?;
/// let loss = b.reduce_mean(y, &[0, 1], false)?;
/// let g = b.finish(&[loss])?;
/// assert_eq!(g.nodes[0].instance, "matmul");
/// # Ok::<(), shardc_compiler::builder::BuildError>(())
/// ```
#[derive(Debug)]
pub struct GraphBuilder {
    graph: Graph,
    scopes: Vec<String>,
    prefixes: Vec<String>,
    instances: HashSet<String>,
    counters: HashMap<String, usize>,
    seed: u64,
    weights_created: u64,
    random_ops: u64,
    training: bool,
    /// The open `pipeline_stage` cells' stages, innermost last.
    stages: Vec<i64>,
    /// Open [`GraphBuilder::in_recompute`] regions: nodes added inside are marked
    /// `recompute: true`.
    recompute_depth: usize,
}

impl GraphBuilder {
    /// A builder for a graph named `name` (`Net` prints as `@Net`), seed 0, training mode.
    pub fn new(name: &str) -> Self {
        GraphBuilder {
            graph: Graph::new(name),
            scopes: Vec::new(),
            prefixes: Vec::new(),
            instances: HashSet::new(),
            counters: HashMap::new(),
            seed: 0,
            weights_created: 0,
            random_ops: 0,
            training: true,
            stages: Vec::new(),
            recompute_depth: 0,
        }
    }

    /// A builder that goes on from `graph` (its parameters and nodes kept, their instance
    /// names taken): to wrap an imported forward network with a loss
    /// ([`crate::model::with_loss`]).
    pub fn from_graph(graph: Graph) -> Self {
        let instances = graph.nodes.iter().map(|n| n.instance.clone()).collect();
        GraphBuilder {
            instances,
            ..GraphBuilder::new(&graph.name)
        }
        .with_graph(graph)
    }

    fn with_graph(mut self, graph: Graph) -> Self {
        self.graph = graph;
        self
    }

    /// Sets the seed from which every random initializer's and dropout's seed is derived
    /// (MindSpore's `set_seed`). Builder style: `GraphBuilder::new("Net").with_seed(7)`.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The builder's seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Sets training (true, the default) or inference mode; cells such as `BatchNorm2d` and
    /// `Dropout` build different graphs in each (MindSpore's `set_train`).
    pub fn set_training(&mut self, training: bool) {
        self.training = training;
    }

    /// Whether cells build their training-mode graph.
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// Runs `f` with every node it adds marked `recompute: true` (MindSpore's
    /// `cell.recompute()`): the `recompute` pass replays those nodes in the backward pass
    /// instead of keeping their results. The region ends whether `f` succeeds or fails.
    pub fn in_recompute<T>(
        &mut self,
        f: impl FnOnce(&mut GraphBuilder) -> Result<T, BuildError>,
    ) -> Result<T, BuildError> {
        self.recompute_depth += 1;
        let r = f(self);
        self.recompute_depth -= 1;
        r
    }

    /// Takes the `recompute` mark off the node producing `v` (a cell's output, which
    /// MindSpore's `cell.recompute()` keeps as the checkpoint the backward pass reads).
    /// A `TupleGetItem`'s source op is the output too.
    pub fn unmark_recompute(&mut self, v: Value) {
        let Value::Node(mut n) = v else {
            return;
        };
        while let Some(node) = self.graph.nodes.get_mut(n.index()) {
            node.attrs.remove("recompute");
            match (node.op, node.inputs.first()) {
                (OpKind::TupleGetItem, Some(Operand::Node(src))) => n = *src,
                _ => break,
            }
        }
    }

    /// The graph built so far.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    // ---- scopes and names -------------------------------------------------------------

    /// Enters a scope: nodes added until the matching [`GraphBuilder::pop_scope`] get
    /// `outer/s` as their scope.
    pub fn push_scope(&mut self, s: &str) {
        self.scopes.push(s.to_string());
    }

    /// Leaves the innermost scope (does nothing when none is open).
    pub fn pop_scope(&mut self) {
        self.scopes.pop();
    }

    /// The current scope string, the open scopes joined by `/` (empty when none).
    pub fn scope(&self) -> String {
        self.scopes.join("/")
    }

    /// Enters a parameter-name prefix: parameters created until the matching
    /// [`GraphBuilder::pop_name_prefix`] are named `outer.prefix.name`.
    pub fn push_name_prefix(&mut self, prefix: &str) {
        self.prefixes.push(prefix.to_string());
    }

    /// Leaves the innermost parameter-name prefix (does nothing when none is open).
    pub fn pop_name_prefix(&mut self) {
        self.prefixes.pop();
    }

    /// The full name a parameter called `name` would get here (`layer1.0.conv1.weight`).
    pub fn qualified_name(&self, name: &str) -> String {
        let mut parts: Vec<&str> = self
            .prefixes
            .iter()
            .map(String::as_str)
            .filter(|p| !p.is_empty())
            .collect();
        parts.push(name);
        parts.join(".")
    }

    /// Runs `f` inside a cell called `name` of class `class`: scope `name-class` and parameter
    /// prefix `name`, as MindSpore names a sub-cell stored in attribute `name`. Both are left
    /// again whether `f` succeeds or fails.
    pub fn in_cell<T>(
        &mut self,
        name: &str,
        class: &str,
        f: impl FnOnce(&mut GraphBuilder) -> Result<T, BuildError>,
    ) -> Result<T, BuildError> {
        self.push_scope(&format!("{name}-{class}"));
        self.push_name_prefix(name);
        let r = f(self);
        self.pop_name_prefix();
        self.pop_scope();
        r
    }

    /// Runs `f` as a cell on pipeline stage `stage` (MindSpore's `cell.pipeline_stage =
    /// stage`): every node it adds gets the attribute `pipeline_stage: stage` (an inner
    /// stage overrides an outer one). The stage is left again whether `f` succeeds or fails.
    pub fn pipeline_stage<T>(
        &mut self,
        stage: usize,
        f: impl FnOnce(&mut GraphBuilder) -> Result<T, BuildError>,
    ) -> Result<T, BuildError> {
        self.stages.push(stage as i64);
        let r = f(self);
        self.stages.pop();
        r
    }

    /// Claims an instance name: `base` itself when free, else `base2`, `base3`, ...
    fn claim_instance(&mut self, base: &str) -> String {
        let counter = self.counters.entry(base.to_string()).or_insert(1);
        loop {
            let candidate = if *counter == 1 {
                base.to_string()
            } else {
                format!("{base}{counter}")
            };
            *counter += 1;
            if !self.instances.contains(&candidate) {
                self.instances.insert(candidate.clone());
                return candidate;
            }
        }
    }

    // ---- parameters ---------------------------------------------------------------------

    fn check_param(&self, name: &str, shape: &[usize]) -> Result<(), BuildError> {
        if name.is_empty()
            || name
                .chars()
                .any(|c| c.is_whitespace() || "(),:%<>{}".contains(c))
        {
            return Err(BuildError::InvalidParam {
                name: name.to_string(),
                reason: "a parameter name must be non-empty, without spaces or any of (),:%<>{}"
                    .into(),
            });
        }
        if self.graph.param_by_name(name).is_some() {
            return Err(BuildError::DuplicateParam {
                name: name.to_string(),
            });
        }
        if shape.contains(&0) {
            return Err(BuildError::InvalidParam {
                name: name.to_string(),
                reason: format!("shape {shape:?} has a zero-sized dimension"),
            });
        }
        Ok(())
    }

    /// Adds a data input (fed every step). Its name is qualified by the open name prefixes.
    pub fn input(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
    ) -> Result<Value, BuildError> {
        let name = self.qualified_name(name);
        self.check_param(&name, shape)?;
        let id = self.graph.add_param(Param {
            name,
            ty: TensorType::new(dtype, shape.to_vec()),
            kind: ParamKind::Input,
        });
        Ok(Value::Param(id))
    }

    /// Adds a trainable weight (`requires_grad` true) named `prefix.name`.
    ///
    /// The seed of a random initializer (`Normal`, `Uniform`, `XavierUniform`, `HeNormal`) is
    /// replaced by one derived from the builder's seed and the weight's creation index (see
    /// [`GraphBuilder::derive_seed`]); use [`GraphBuilder::weight_exact`] to keep it.
    pub fn weight(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> Result<Value, BuildError> {
        self.weight_with(name, dtype, shape, init, true)
    }

    /// Adds a weight with `requires_grad` as given (false for moving statistics and other
    /// state that autodiff must not differentiate); seeds as [`GraphBuilder::weight`].
    pub fn weight_with(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
        requires_grad: bool,
    ) -> Result<Value, BuildError> {
        let qualified = self.qualified_name(name);
        self.check_param(&qualified, shape)?;
        self.weights_created += 1;
        let seed = self.derive_seed(self.weights_created);
        let init = match init {
            Init::Normal { sigma, mean, .. } => Init::Normal { sigma, mean, seed },
            Init::Uniform { scale, .. } => Init::Uniform { scale, seed },
            Init::XavierUniform { gain, .. } => Init::XavierUniform { gain, seed },
            Init::HeNormal { .. } => Init::HeNormal { seed },
            other => other,
        };
        self.add_weight(qualified, dtype, shape, init, requires_grad)
    }

    /// Adds a trainable weight whose initializer (seed included) is kept exactly as given.
    pub fn weight_exact(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
    ) -> Result<Value, BuildError> {
        let qualified = self.qualified_name(name);
        self.check_param(&qualified, shape)?;
        self.weights_created += 1;
        self.add_weight(qualified, dtype, shape, init, true)
    }

    fn add_weight(
        &mut self,
        name: String,
        dtype: DType,
        shape: &[usize],
        init: Init,
        requires_grad: bool,
    ) -> Result<Value, BuildError> {
        let id = self.graph.add_param(Param {
            name,
            ty: TensorType::new(dtype, shape.to_vec()),
            kind: ParamKind::Weight {
                init,
                requires_grad,
            },
        });
        Ok(Value::Param(id))
    }

    /// The seed of the `index`-th random object (1-based): `index` itself for builder seed 0
    /// (so the first weight of a default builder gets `seed=1`, as in `models/quickstart.ir`),
    /// otherwise `index` plus a 64-bit mix of the builder seed. Deterministic: the same program
    /// with the same seed builds the same graph.
    pub fn derive_seed(&self, index: u64) -> u64 {
        if self.seed == 0 {
            index
        } else {
            (mix64(self.seed) & 0x7FFF_FFFF_0000_0000).wrapping_add(index)
        }
    }

    /// A fresh pair of seeds for a random op (`Dropout`'s `seed0`, `seed1`), derived from the
    /// builder seed and a counter of random ops.
    pub fn next_op_seeds(&mut self) -> (i64, i64) {
        self.random_ops += 1;
        let s0 = (mix64(self.seed ^ 0x5EED) & 0x7FFF_FFFF) as i64;
        (s0, self.random_ops as i64)
    }

    // ---- nodes --------------------------------------------------------------------------

    /// Describes an operand for messages: `%3 (matmul)`, `%para1_x`, `(0, 1)`.
    pub fn describe(&self, operand: &Operand) -> String {
        match operand {
            Operand::Node(n) => match self.graph.nodes.get(n.index()) {
                Some(node) => format!("%{} ({})", n.index() + 1, node.instance),
                None => format!("%{} (unknown)", n.index() + 1),
            },
            Operand::Param(p) => match self.graph.params.get(p.index()) {
                Some(param) => format!("%para{}_{}", p.index() + 1, param.name),
                None => format!("%para{} (unknown)", p.index() + 1),
            },
            Operand::Const(c) => ConstDisplay(c).to_string(),
        }
    }

    /// Adds a node of `op` with the given operands and attributes, types it, and returns its
    /// value. The instance name is the op's MindSpore-style name (`matmul`, then `matmul2`,
    /// ...).
    pub fn op(
        &mut self,
        op: OpKind,
        inputs: &[Operand],
        attrs: Attrs,
    ) -> Result<Value, BuildError> {
        self.op_named(op, inputs, attrs, "", None)
    }

    /// As [`GraphBuilder::op`], with an instance name (empty: the default for the op) and an
    /// `in_strategy`. An instance name already in use gets a counter (`sub` -> `sub2`), so
    /// instance names stay unique in a graph. The strategy is checked against the tensor
    /// operands (constants have none): one entry per tensor operand, one split per dimension,
    /// each split at least 1 and dividing its dimension.
    pub fn op_named(
        &mut self,
        op: OpKind,
        inputs: &[Operand],
        attrs: Attrs,
        instance: &str,
        strategy: Option<Strategy>,
    ) -> Result<Value, BuildError> {
        self.op_full(op, inputs, attrs, instance, strategy, None)
    }

    /// As [`GraphBuilder::op_named`], also with an `out_strategy` (checked against the
    /// result's tensors).
    pub fn op_full(
        &mut self,
        op: OpKind,
        inputs: &[Operand],
        attrs: Attrs,
        instance: &str,
        in_strategy: Option<Strategy>,
        out_strategy: Option<Strategy>,
    ) -> Result<Value, BuildError> {
        let base = if instance.is_empty() {
            instance_base(op)
        } else {
            instance.to_string()
        };
        // The name the node will get; claimed only once the node is accepted.
        let instance = self.peek_instance(&base);
        for (index, operand) in inputs.iter().enumerate() {
            let exists = match operand {
                Operand::Node(n) => n.index() < self.graph.nodes.len(),
                Operand::Param(p) => p.index() < self.graph.params.len(),
                Operand::Const(_) => true,
            };
            if !exists {
                return Err(BuildError::UnknownValue {
                    instance,
                    op,
                    index,
                    value: self.describe(operand),
                });
            }
        }
        let mut node = Node::new(op, inputs.to_vec());
        node.attrs = attrs;
        if let Some(&k) = self.stages.last() {
            node.attrs.set("pipeline_stage", shardc_ir::Attr::Int(k));
        }
        node.instance = instance.clone();
        node.scope = self.scope();
        let ty = infer_node(&self.graph, &node).map_err(|source| BuildError::Infer {
            instance: instance.clone(),
            op,
            source: Box::new(source),
        })?;
        if let Some(s) = &in_strategy {
            self.check_in_strategy(&instance, op, inputs, s)?;
        }
        if let Some(s) = &out_strategy {
            check_out_strategy(&instance, op, &ty, s)?;
        }
        node.ty = ty;
        node.in_strategy = in_strategy;
        node.out_strategy = out_strategy;
        if self.recompute_depth > 0 && node.attrs.get("recompute").is_none() {
            node.attrs.set("recompute", shardc_ir::Attr::Bool(true));
        }
        let claimed = self.claim_instance(&base);
        debug_assert_eq!(claimed, instance);
        node.instance = claimed;
        Ok(Value::Node(self.graph.push_node(node)))
    }

    /// The name [`GraphBuilder::claim_instance`] would return, without claiming it.
    fn peek_instance(&self, base: &str) -> String {
        let mut counter = self.counters.get(base).copied().unwrap_or(1);
        loop {
            let candidate = if counter == 1 {
                base.to_string()
            } else {
                format!("{base}{counter}")
            };
            if !self.instances.contains(&candidate) {
                return candidate;
            }
            counter += 1;
        }
    }

    fn check_in_strategy(
        &self,
        instance: &str,
        op: OpKind,
        inputs: &[Operand],
        s: &Strategy,
    ) -> Result<(), BuildError> {
        let tensors: Vec<(String, Vec<usize>)> = inputs
            .iter()
            .filter(|o| o.as_const().is_none())
            .map(|o| {
                let shape = self
                    .graph
                    .operand_tensor_type(o)
                    .map(|t| t.shape.clone())
                    .unwrap_or_default();
                (self.describe(o), shape)
            })
            .collect();
        check_strategy(instance, op, "in_strategy", "tensor inputs", &tensors, s)
    }

    /// Sets the debug name of a node's value (`loss` in `%6(loss)`); parameters keep theirs.
    pub fn set_value_name(&mut self, v: Value, name: &str) {
        if let Value::Node(n) = v {
            if let Some(node) = self.graph.nodes.get_mut(n.index()) {
                node.name = name.to_string();
            }
        }
    }

    /// Adds a comment line printed under a node (`# ...`).
    pub fn add_comment(&mut self, v: Value, comment: &str) {
        if let Value::Node(n) = v {
            if let Some(node) = self.graph.nodes.get_mut(n.index()) {
                node.comments.push(comment.to_string());
            }
        }
    }

    /// The tensor type of a value; `None` for a tuple-valued node or an unknown value.
    pub fn ty(&self, v: &Value) -> Option<TensorType> {
        self.type_of(v).and_then(|t| t.as_tensor().cloned())
    }

    /// The full type of a value (tensor or tuple); `None` for an unknown value.
    pub fn type_of(&self, v: &Value) -> Option<Type> {
        match v {
            Value::Node(n) => self.graph.nodes.get(n.index()).map(|n| n.ty.clone()),
            Value::Param(p) => self
                .graph
                .params
                .get(p.index())
                .map(|p| Type::Tensor(p.ty.clone())),
        }
    }

    /// The shape of a tensor value, or an error naming `who` when it has none.
    pub fn shape_of(&self, v: Value, who: &str) -> Result<Vec<usize>, BuildError> {
        self.ty(&v)
            .map(|t| t.shape)
            .ok_or_else(|| BuildError::InvalidArgument {
                instance: who.to_string(),
                reason: format!("{} is not a single tensor", self.describe(&v.operand())),
            })
    }

    /// Ends construction: sets the returned values (the first is the loss) and verifies the
    /// graph.
    pub fn finish(mut self, outputs: &[Value]) -> Result<Graph, BuildError> {
        self.graph.outputs = outputs.iter().map(|v| v.operand()).collect();
        shardc_passes::verify::verify(&self.graph).map_err(|source| BuildError::Verify {
            graph: self.graph.name.clone(),
            source: Box::new(source),
        })?;
        Ok(self.graph)
    }

    /// Ends construction without verifying (for tests that feed bad graphs to the passes).
    pub fn finish_unverified(mut self, outputs: &[Value]) -> Graph {
        self.graph.outputs = outputs.iter().map(|v| v.operand()).collect();
        self.graph
    }
}

/// Checks a strategy against the shapes of the tensors it splits.
fn check_strategy(
    instance: &str,
    op: OpKind,
    which: &'static str,
    what: &'static str,
    tensors: &[(String, Vec<usize>)],
    s: &Strategy,
) -> Result<(), BuildError> {
    let fail = |reason: String| {
        Err(BuildError::Strategy {
            instance: instance.to_string(),
            op,
            which,
            strategy: Box::new(s.clone()),
            reason,
        })
    };
    if s.0.len() != tensors.len() {
        return fail(format!(
            "has {} entries, but the op has {} {what}",
            s.0.len(),
            tensors.len()
        ));
    }
    for (index, (dims, (value, shape))) in s.0.iter().zip(tensors).enumerate() {
        if dims.len() != shape.len() {
            return fail(format!(
                "entry {index} {dims:?} has {} dimensions, but {value} has shape {shape:?} (rank {})",
                dims.len(),
                shape.len()
            ));
        }
        for (dim, (&split, &size)) in dims.iter().zip(shape).enumerate() {
            if split < 1 {
                return fail(format!(
                    "entry {index} splits dimension {dim} of {value} into {split} parts, but a split count must be at least 1"
                ));
            }
            if size as u64 % split as u64 != 0 {
                return fail(format!(
                    "entry {index} splits dimension {dim} of {value} (size {size}) into {split} parts, which does not divide it"
                ));
            }
        }
    }
    Ok(())
}

fn check_out_strategy(
    instance: &str,
    op: OpKind,
    ty: &Type,
    s: &Strategy,
) -> Result<(), BuildError> {
    let tensors: Vec<(String, Vec<usize>)> = ty
        .tensors()
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("output {i}"), t.shape.clone()))
        .collect();
    check_strategy(instance, op, "out_strategy", "outputs", &tensors, s)
}

/// Prints a constant operand as the IR does: `(0, 1)`, `1.0`, `3`, `true`.
struct ConstDisplay<'a>(&'a Const);

impl fmt::Display for ConstDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Const::Int(i) => write!(f, "{i}"),
            Const::Float(x) => write!(f, "{x:?}"),
            Const::Bool(b) => write!(f, "{b}"),
            Const::Ints(v) => {
                f.write_str("(")?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str(")")
            }
        }
    }
}

fn ints(xs: &[i64]) -> Operand {
    Operand::Const(Const::Ints(xs.to_vec()))
}

fn bool_attr(key: &str, v: bool) -> Attrs {
    Attrs::new().with(key, Attr::Bool(v))
}

/// Typed shortcuts: one method per common op, default instance names, no strategy. For
/// strategies and explicit instance names use [`crate::ops`].
impl GraphBuilder {
    /// `MatMul(a, b)` with `transpose_a: false, transpose_b: false`.
    pub fn matmul(&mut self, a: Value, b: Value) -> Result<Value, BuildError> {
        self.matmul_t(a, b, false, false)
    }

    /// `MatMul(a, b)` with the given transposes.
    pub fn matmul_t(
        &mut self,
        a: Value,
        b: Value,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<Value, BuildError> {
        let attrs = Attrs::new()
            .with("transpose_a", Attr::Bool(transpose_a))
            .with("transpose_b", Attr::Bool(transpose_b));
        self.op(OpKind::MatMul, &[a.into(), b.into()], attrs)
    }

    /// `BatchMatMul(a, b)` with the given transposes.
    pub fn batch_matmul(
        &mut self,
        a: Value,
        b: Value,
        transpose_a: bool,
        transpose_b: bool,
    ) -> Result<Value, BuildError> {
        let attrs = Attrs::new()
            .with("transpose_a", Attr::Bool(transpose_a))
            .with("transpose_b", Attr::Bool(transpose_b));
        self.op(OpKind::BatchMatMul, &[a.into(), b.into()], attrs)
    }

    /// `BiasAdd(x, bias)`.
    pub fn bias_add(&mut self, x: Value, bias: Value) -> Result<Value, BuildError> {
        self.op(OpKind::BiasAdd, &[x.into(), bias.into()], Attrs::new())
    }

    /// `Add(a, b)`.
    pub fn add(&mut self, a: Value, b: Value) -> Result<Value, BuildError> {
        self.op(OpKind::Add, &[a.into(), b.into()], Attrs::new())
    }

    /// `Sub(a, b)`.
    pub fn sub(&mut self, a: Value, b: Value) -> Result<Value, BuildError> {
        self.op(OpKind::Sub, &[a.into(), b.into()], Attrs::new())
    }

    /// `Mul(a, b)`.
    pub fn mul(&mut self, a: Value, b: Value) -> Result<Value, BuildError> {
        self.op(OpKind::Mul, &[a.into(), b.into()], Attrs::new())
    }

    /// `Mul(x, c)` with a scalar constant.
    pub fn mul_scalar(&mut self, x: Value, c: f64) -> Result<Value, BuildError> {
        self.op(
            OpKind::Mul,
            &[x.into(), Const::Float(c).into()],
            Attrs::new(),
        )
    }

    /// `Add(x, c)` with a scalar constant.
    pub fn add_scalar(&mut self, x: Value, c: f64) -> Result<Value, BuildError> {
        self.op(
            OpKind::Add,
            &[x.into(), Const::Float(c).into()],
            Attrs::new(),
        )
    }

    /// `RealDiv(a, b)`.
    pub fn real_div(&mut self, a: Value, b: Value) -> Result<Value, BuildError> {
        self.op(OpKind::RealDiv, &[a.into(), b.into()], Attrs::new())
    }

    fn unary(&mut self, op: OpKind, x: Value) -> Result<Value, BuildError> {
        self.op(op, &[x.into()], Attrs::new())
    }

    /// `Neg(x)`.
    pub fn neg(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Neg, x)
    }

    /// `Square(x)`.
    pub fn square(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Square, x)
    }

    /// `Sqrt(x)`.
    pub fn sqrt(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Sqrt, x)
    }

    /// `Exp(x)`.
    pub fn exp(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Exp, x)
    }

    /// `Log(x)`.
    pub fn log(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Log, x)
    }

    /// `ReLU(x)`.
    pub fn relu(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::ReLU, x)
    }

    /// `GeLU(x)`.
    pub fn gelu(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::GeLU, x)
    }

    /// `SiLU(x)`: `x * sigmoid(x)`.
    pub fn silu(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::SiLU, x)
    }

    /// `Erf(x)`: the error function.
    pub fn erf(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Erf, x)
    }

    /// `Sigmoid(x)`.
    pub fn sigmoid(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Sigmoid, x)
    }

    /// `Tanh(x)`.
    pub fn tanh(&mut self, x: Value) -> Result<Value, BuildError> {
        self.unary(OpKind::Tanh, x)
    }

    /// `Softmax(x)` along `axis`.
    pub fn softmax(&mut self, x: Value, axis: i64) -> Result<Value, BuildError> {
        self.op(
            OpKind::Softmax,
            &[x.into()],
            Attrs::new().with("axis", Attr::Int(axis)),
        )
    }

    /// `LogSoftmax(x)` along `axis`.
    pub fn log_softmax(&mut self, x: Value, axis: i64) -> Result<Value, BuildError> {
        self.op(
            OpKind::LogSoftmax,
            &[x.into()],
            Attrs::new().with("axis", Attr::Int(axis)),
        )
    }

    /// `Cast(x)` to `dtype`.
    pub fn cast(&mut self, x: Value, dtype: DType) -> Result<Value, BuildError> {
        self.op(
            OpKind::Cast,
            &[x.into()],
            Attrs::new().with("dst_type", Attr::Str(dtype.name().to_string())),
        )
    }

    /// `ReduceSum(x, axes)`; empty `axes` reduces all.
    pub fn reduce_sum(
        &mut self,
        x: Value,
        axes: &[i64],
        keep_dims: bool,
    ) -> Result<Value, BuildError> {
        self.op(
            OpKind::ReduceSum,
            &[x.into(), ints(axes)],
            bool_attr("keep_dims", keep_dims),
        )
    }

    /// `ReduceMean(x, axes)`; empty `axes` reduces all.
    pub fn reduce_mean(
        &mut self,
        x: Value,
        axes: &[i64],
        keep_dims: bool,
    ) -> Result<Value, BuildError> {
        self.op(
            OpKind::ReduceMean,
            &[x.into(), ints(axes)],
            bool_attr("keep_dims", keep_dims),
        )
    }

    /// `ReduceMax(x, axes)`; empty `axes` reduces all.
    pub fn reduce_max(
        &mut self,
        x: Value,
        axes: &[i64],
        keep_dims: bool,
    ) -> Result<Value, BuildError> {
        self.op(
            OpKind::ReduceMax,
            &[x.into(), ints(axes)],
            bool_attr("keep_dims", keep_dims),
        )
    }

    /// `Reshape(x, shape)`; at most one `-1`.
    pub fn reshape(&mut self, x: Value, shape: &[i64]) -> Result<Value, BuildError> {
        self.op(OpKind::Reshape, &[x.into(), ints(shape)], Attrs::new())
    }

    /// `Transpose(x, perm)`.
    pub fn transpose(&mut self, x: Value, perm: &[i64]) -> Result<Value, BuildError> {
        self.op(OpKind::Transpose, &[x.into(), ints(perm)], Attrs::new())
    }

    /// `OneHot(indices, depth, on_value, off_value)` along the last axis.
    pub fn one_hot(
        &mut self,
        indices: Value,
        depth: i64,
        on_value: f64,
        off_value: f64,
    ) -> Result<Value, BuildError> {
        self.op(
            OpKind::OneHot,
            &[
                indices.into(),
                Const::Int(depth).into(),
                Const::Float(on_value).into(),
                Const::Float(off_value).into(),
            ],
            Attrs::new().with("axis", Attr::Int(-1)),
        )
    }

    /// `Gather(params, indices, axis)`.
    pub fn gather(
        &mut self,
        params: Value,
        indices: Value,
        axis: i64,
    ) -> Result<Value, BuildError> {
        self.op(
            OpKind::Gather,
            &[params.into(), indices.into(), Const::Int(axis).into()],
            Attrs::new(),
        )
    }

    /// `Concat(xs...)` along `axis`.
    pub fn concat(&mut self, xs: &[Value], axis: i64) -> Result<Value, BuildError> {
        let inputs: Vec<Operand> = xs.iter().map(|v| v.operand()).collect();
        self.op(
            OpKind::Concat,
            &inputs,
            Attrs::new().with("axis", Attr::Int(axis)),
        )
    }

    /// `TupleGetItem(t, index)`: element `index` of a tuple-valued node.
    pub fn tuple_get_item(&mut self, t: Value, index: i64) -> Result<Value, BuildError> {
        self.op(
            OpKind::TupleGetItem,
            &[t.into(), Const::Int(index).into()],
            Attrs::new(),
        )
    }

    /// `Assign(param, value)`: the parameter takes `value` at this point of the step.
    pub fn assign(&mut self, param: Value, value: Value) -> Result<Value, BuildError> {
        self.op(OpKind::Assign, &[param.into(), value.into()], Attrs::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_bases_follow_mindspore() {
        assert_eq!(instance_base(OpKind::MatMul), "matmul");
        assert_eq!(instance_base(OpKind::BatchMatMul), "batch_matmul");
        assert_eq!(instance_base(OpKind::ReLU), "relu");
        assert_eq!(instance_base(OpKind::GeLU), "gelu");
        assert_eq!(instance_base(OpKind::SiLU), "silu");
        assert_eq!(instance_base(OpKind::SiLUGrad), "silu_grad");
        assert_eq!(instance_base(OpKind::Erf), "erf");
        assert_eq!(instance_base(OpKind::ReduceMean), "reduce_mean");
        assert_eq!(instance_base(OpKind::BiasAdd), "bias_add");
        assert_eq!(instance_base(OpKind::Conv2D), "conv2d");
        assert_eq!(
            instance_base(OpKind::Conv2DBackpropInput),
            "conv2d_backprop_input"
        );
        assert_eq!(
            instance_base(OpKind::SparseSoftmaxCrossEntropyWithLogits),
            "sparse_softmax_cross_entropy_with_logits"
        );
        assert_eq!(instance_base(OpKind::AllToAll), "all_to_all");
        assert_eq!(instance_base(OpKind::SGD), "sgd");
    }

    #[test]
    fn derived_seeds_are_deterministic_and_distinct() {
        let a = GraphBuilder::new("a").with_seed(7);
        let b = GraphBuilder::new("b").with_seed(7);
        let c = GraphBuilder::new("c").with_seed(8);
        assert_eq!(a.derive_seed(3), b.derive_seed(3));
        assert_ne!(a.derive_seed(3), a.derive_seed(4));
        assert_ne!(a.derive_seed(3), c.derive_seed(3));
        assert_eq!(GraphBuilder::new("d").derive_seed(1), 1);
    }

    #[test]
    fn qualified_names_join_prefixes() {
        let mut b = GraphBuilder::new("n");
        b.push_name_prefix("layer1");
        b.push_name_prefix("0");
        assert_eq!(b.qualified_name("weight"), "layer1.0.weight");
        b.pop_name_prefix();
        b.pop_name_prefix();
        b.pop_name_prefix();
        assert_eq!(b.qualified_name("w"), "w");
    }
}
