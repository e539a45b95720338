//! The optimizer update at the end of a training step: state parameters, one update op per
//! trained weight, `TupleGetItem` of its results and an `Assign` per updated parameter.

use super::emitter::{dtype_attr, Emitter};
use super::error::AutodiffError;
use shardc_ir::{
    Attr, Attrs, Const, DType, Graph, Init, OpKind, Operand, Param, ParamId, ParamKind, TensorType,
};

/// An optimizer, as MindSpore's `nn.Momentum`, `nn.SGD` and `nn.Adam`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// `ApplyMomentum`: `acc' = acc * momentum + grad`, `var' = var - lr * acc'` (Nesterov:
    /// `var' = var - lr * (grad + momentum * acc')`). State `moments.<w>` (zeros).
    Momentum {
        /// Learning rate.
        learning_rate: f64,
        /// Momentum.
        momentum: f64,
        /// Nesterov momentum.
        use_nesterov: bool,
    },
    /// MindSpore's `SGD` op, with state `accum.<w>` (zeros) and `stat.<w>` (ones: the first
    /// step takes the gradient itself as the momentum buffer).
    Sgd {
        /// Learning rate.
        learning_rate: f64,
        /// Momentum (0: plain SGD).
        momentum: f64,
        /// Dampening of the momentum.
        dampening: f64,
        /// L2 weight decay.
        weight_decay: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// `Adam`, with state `moment1.<w>`, `moment2.<w>` (zeros) and the shared scalars
    /// `beta1_power`, `beta2_power` (start at `beta1`, `beta2`; multiplied by them each step).
    Adam {
        /// Learning rate.
        learning_rate: f64,
        /// Decay of the first moment.
        beta1: f64,
        /// Decay of the second moment.
        beta2: f64,
        /// Added to the denominator.
        eps: f64,
    },
}

impl Optimizer {
    /// MindSpore's class name: `Momentum`, `SGD`, `Adam`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Momentum { .. } => "Momentum",
            Optimizer::Sgd { .. } => "SGD",
            Optimizer::Adam { .. } => "Adam",
        }
    }
}

/// A float hyper-parameter operand.
fn hp(v: f64) -> Operand {
    Operand::Const(Const::Float(v))
}

/// Adds a state parameter of type `ty` named `name` (an error when the name is taken).
fn add_state(
    g: &mut Graph,
    opt: &Optimizer,
    name: String,
    ty: TensorType,
    init: Init,
) -> Result<ParamId, AutodiffError> {
    if g.param_by_name(&name).is_some() {
        return Err(AutodiffError::Optimizer {
            optimizer: opt.name(),
            reason: format!(
                "its state parameter `{name}` would clash with an existing parameter of that name"
            ),
        });
    }
    Ok(g.add_param(Param {
        name,
        ty,
        kind: ParamKind::Weight {
            init,
            requires_grad: false,
        },
    }))
}

/// Appends the optimizer update of every `(weight, gradient)` to `g`: the update ops, then an
/// `Assign` of every weight's and every state's new value (states are added as parameters,
/// named after their weight as MindSpore names them). The gradients may be any operands of `g`
/// of their weight's type: backward nodes, or data inputs (an optimizer applied to gradients
/// computed elsewhere, as in MindSpore's `optimizer(grads)`).
pub fn append_update(
    g: Graph,
    grads: &[(ParamId, Operand)],
    opt: &Optimizer,
) -> Result<Graph, AutodiffError> {
    let mut em = Emitter::new(g, crate::infer::infer_node);
    let scope = format!("Default/optimizer-{}", opt.name());

    // Adam's shared beta powers, in the element type of the first trained weight.
    let mut powers: Option<(ParamId, ParamId, DType)> = None;
    if let (Optimizer::Adam { beta1, beta2, .. }, Some((w, _))) = (opt, grads.first()) {
        let dtype = em.g.param(*w).ty.dtype;
        let ty = TensorType::scalar(dtype);
        let b1 = add_state(
            &mut em.g,
            opt,
            "beta1_power".into(),
            ty.clone(),
            Init::Constant { value: *beta1 },
        )?;
        let b2 = add_state(
            &mut em.g,
            opt,
            "beta2_power".into(),
            ty,
            Init::Constant { value: *beta2 },
        )?;
        powers = Some((b1, b2, dtype));
    }

    for (w, grad) in grads {
        let wp = em.g.param(*w).clone();
        if !wp.ty.dtype.is_float() {
            return Err(AutodiffError::Optimizer {
                optimizer: opt.name(),
                reason: format!("the weight `{}` has the non-float type {}", wp.name, wp.ty),
            });
        }
        let wname = wp.name.clone();
        let var = Operand::Param(*w);
        let (op, inputs, attrs, state): (OpKind, Vec<Operand>, Attrs, Vec<ParamId>) = match *opt {
            Optimizer::Momentum {
                learning_rate,
                momentum,
                use_nesterov,
            } => {
                let acc = add_state(
                    &mut em.g,
                    opt,
                    format!("moments.{wname}"),
                    wp.ty.clone(),
                    Init::Zeros,
                )?;
                (
                    OpKind::ApplyMomentum,
                    vec![
                        var,
                        Operand::Param(acc),
                        hp(learning_rate),
                        grad.clone(),
                        hp(momentum),
                    ],
                    Attrs::new().with("use_nesterov", Attr::Bool(use_nesterov)),
                    vec![acc],
                )
            }
            Optimizer::Sgd {
                learning_rate,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            } if momentum == 0.0 && dampening == 0.0 && weight_decay == 0.0 && !nesterov => (
                // Plain SGD needs no state: MindSpore's SGD op would keep and rewrite an
                // `accum` and a `stat` per weight for nothing.
                OpKind::ApplyGradientDescent,
                vec![var, hp(learning_rate), grad.clone()],
                Attrs::new(),
                Vec::new(),
            ),
            Optimizer::Sgd {
                learning_rate,
                momentum,
                dampening,
                weight_decay,
                nesterov,
            } => {
                let accum = add_state(
                    &mut em.g,
                    opt,
                    format!("accum.{wname}"),
                    wp.ty.clone(),
                    Init::Zeros,
                )?;
                let stat = add_state(
                    &mut em.g,
                    opt,
                    format!("stat.{wname}"),
                    wp.ty.clone(),
                    Init::Ones,
                )?;
                (
                    OpKind::SGD,
                    vec![
                        var,
                        grad.clone(),
                        hp(learning_rate),
                        Operand::Param(accum),
                        hp(momentum),
                        Operand::Param(stat),
                    ],
                    Attrs::new()
                        .with("dampening", Attr::Float(dampening))
                        .with("weight_decay", Attr::Float(weight_decay))
                        .with("nesterov", Attr::Bool(nesterov)),
                    vec![accum, stat],
                )
            }
            Optimizer::Adam {
                learning_rate,
                beta1,
                beta2,
                eps,
            } => {
                let m = add_state(
                    &mut em.g,
                    opt,
                    format!("moment1.{wname}"),
                    wp.ty.clone(),
                    Init::Zeros,
                )?;
                let v = add_state(
                    &mut em.g,
                    opt,
                    format!("moment2.{wname}"),
                    wp.ty.clone(),
                    Init::Zeros,
                )?;
                let Some((b1p, b2p, pdtype)) = powers else {
                    return Err(AutodiffError::Optimizer {
                        optimizer: opt.name(),
                        reason: "internal error: the beta powers are missing".into(),
                    });
                };
                em.set_plain_context(&scope, &format!("adam_{wname}"), OpKind::Adam);
                let (mut p1, mut p2) = (Operand::Param(b1p), Operand::Param(b2p));
                if pdtype != wp.ty.dtype {
                    // A weight of another float type reads the powers cast to its type.
                    let to = Attrs::new().with("dst_type", dtype_attr(wp.ty.dtype));
                    p1 = em.emit(OpKind::Cast, vec![p1], to.clone(), "_beta1_power")?;
                    p2 = em.emit(OpKind::Cast, vec![p2], to, "_beta2_power")?;
                }
                (
                    OpKind::Adam,
                    vec![
                        var,
                        Operand::Param(m),
                        Operand::Param(v),
                        p1,
                        p2,
                        hp(learning_rate),
                        hp(beta1),
                        hp(beta2),
                        hp(eps),
                        grad.clone(),
                    ],
                    Attrs::new().with("use_nesterov", Attr::Bool(false)),
                    vec![m, v],
                )
            }
        };
        let base = match op {
            OpKind::ApplyMomentum => "apply_momentum",
            OpKind::SGD => "sgd",
            OpKind::ApplyGradientDescent => "apply_gradient_descent",
            _ => "adam",
        };
        em.set_plain_context(&scope, &format!("{base}_{wname}"), op);
        let update = em.emit_node(op, inputs, attrs, "")?;
        let targets: Vec<ParamId> = std::iter::once(*w).chain(state).collect();
        let mut values = Vec::with_capacity(targets.len());
        if op == OpKind::ApplyGradientDescent {
            values.push(Operand::Node(update));
        } else {
            for k in 0..targets.len() {
                values.push(em.item(update, k, &format!("_{k}"))?);
            }
        }
        for (p, value) in targets.into_iter().zip(values) {
            let pname = em.g.param(p).name.clone();
            em.set_plain_context(&scope, &format!("assign_{pname}"), OpKind::Assign);
            em.emit(
                OpKind::Assign,
                vec![Operand::Param(p), value],
                Attrs::new(),
                "",
            )?;
        }
    }

    // beta_power' = beta_power * beta, after every read of the powers.
    if let (Some((b1p, b2p, _)), Optimizer::Adam { beta1, beta2, .. }) = (powers, opt) {
        for (p, beta, name) in [(b1p, *beta1, "beta1_power"), (b2p, *beta2, "beta2_power")] {
            em.set_plain_context(&scope, &format!("update_{name}"), OpKind::Mul);
            let next = em.emit(
                OpKind::Mul,
                vec![Operand::Param(p), hp(beta)],
                Attrs::new(),
                "",
            )?;
            em.set_plain_context(&scope, &format!("assign_{name}"), OpKind::Assign);
            em.emit(
                OpKind::Assign,
                vec![Operand::Param(p), next],
                Attrs::new(),
                "",
            )?;
        }
    }
    Ok(em.g)
}
