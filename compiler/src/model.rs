//! Putting a network together, as MindSpore's `Model(net, loss_fn, optimizer)`:
//! [`build_network`] is `WithLossCell(net, loss)` as one forward graph, and [`train_graph`] is
//! `TrainOneStepCell`: forward, backward and the optimizer update as one graph; [`with_loss`]
//! wraps an imported forward network with a loss.

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::loss::LossFn;
use crate::nn::Cell;
use crate::optim::OptimizerSpec;
use crate::pipeline::CompileError;
use shardc_ir::{DType, Graph};

/// The forward graph of `net` followed by `loss`, with MindSpore's scopes: the net's nodes
/// under `Default/network-WithLossCell/_backbone-<Net>`, the loss's under
/// `Default/network-WithLossCell/_loss_fn-<Loss>`. `inputs` are the data input then the label
/// (name, dtype, shape), which become the graph's first two parameters. The graph returns the
/// loss. Seeds derive from builder seed 0; see [`build_network_with`] for another builder.
pub fn build_network(
    name: &str,
    net: &dyn Cell,
    loss: &dyn LossFn,
    inputs: &[(&str, DType, &[usize])],
) -> Result<Graph, BuildError> {
    build_network_with(GraphBuilder::new(name), net, loss, inputs)
}

/// As [`build_network`], in a builder prepared by the caller (seed, training mode).
pub fn build_network_with(
    mut b: GraphBuilder,
    net: &dyn Cell,
    loss: &dyn LossFn,
    inputs: &[(&str, DType, &[usize])],
) -> Result<Graph, BuildError> {
    let [(data_name, data_dtype, data_shape), (label_name, label_dtype, label_shape)] = inputs
    else {
        return Err(BuildError::InvalidArgument {
            instance: b.graph().name.clone(),
            reason: format!(
                "build_network takes exactly two inputs (data, then label), got {}",
                inputs.len()
            ),
        });
    };
    let x = b.input(data_name, *data_dtype, data_shape)?;
    let label = b.input(label_name, *label_dtype, label_shape)?;
    b.push_scope("Default");
    b.push_scope("network-WithLossCell");
    b.push_scope(&format!("_backbone-{}", net.class_name()));
    let logits = net.construct(&mut b, x)?;
    b.pop_scope();
    b.pop_scope();
    b.pop_scope();
    finish_with_loss(b, loss, logits, label)
}

/// `loss` of `logits` against `label` added under
/// `Default/network-WithLossCell/_loss_fn-<Loss>`, the graph finished returning it.
fn finish_with_loss(
    mut b: GraphBuilder,
    loss: &dyn LossFn,
    logits: Value,
    label: Value,
) -> Result<Graph, BuildError> {
    b.push_scope("Default");
    b.push_scope("network-WithLossCell");
    b.push_scope(&format!("_loss_fn-{}", loss.class_name()));
    let l = loss.construct(&mut b, logits, label)?;
    b.pop_scope();
    b.pop_scope();
    b.pop_scope();
    b.finish(&[l])
}

/// `forward` (a forward network: its first output the logits) wrapped with `loss` as
/// MindSpore's `WithLossCell` does: a data input `label` of the given type joins the
/// parameters, the loss of the first output against it is the graph's one output (scope
/// `Default/network-WithLossCell/_loss_fn-<Loss>`). A forward graph whose first output is
/// already a scalar (a loss) is an error saying so.
pub fn with_loss(
    forward: Graph,
    loss: &dyn LossFn,
    (label_name, label_dtype, label_shape): (&str, DType, &[usize]),
) -> Result<Graph, BuildError> {
    let name = forward.name.clone();
    let Some(first) = forward.outputs.first().cloned() else {
        return Err(BuildError::InvalidArgument {
            instance: name,
            reason: "the network has no output to take a loss of".into(),
        });
    };
    let logits = match first {
        shardc_ir::Operand::Node(n) => Value::Node(n),
        shardc_ir::Operand::Param(p) => Value::Param(p),
        shardc_ir::Operand::Const(_) => {
            return Err(BuildError::InvalidArgument {
                instance: name,
                reason: "the network's first output is a constant".into(),
            })
        }
    };
    if let Some(t) = forward.operand_tensor_type(&first) {
        if t.shape.iter().product::<usize>() == 1 {
            return Err(BuildError::InvalidArgument {
                instance: name,
                reason: format!(
                    "the network's first output is already a scalar {t} (it ends in a loss): use it as it is, without a loss"
                ),
            });
        }
    }
    let mut b = GraphBuilder::from_graph(forward);
    let label = b.input(label_name, label_dtype, label_shape)?;
    finish_with_loss(b, loss, logits, label)
}

/// The training step of a forward graph (its first output is the loss): gradients of every
/// trainable weight and the optimizer's update, verified.
pub fn train_graph(forward: &Graph, opt: &dyn OptimizerSpec) -> Result<Graph, CompileError> {
    crate::pipeline::training_step(forward, &opt.to_spec())
}
