//! Loss functions, as MindSpore's `nn` losses. [`crate::model::build_network`] calls a loss
//! inside scope `Default/network-WithLossCell/_loss_fn-<ClassName>`.

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::ops;

/// A loss: builds a scalar (or, with reduction `none`, per-sample) loss from logits and labels.
pub trait LossFn {
    /// The class name used in the scope (`MSELoss` in `_loss_fn-MSELoss`).
    fn class_name(&self) -> &str;

    /// Adds the loss of `logits` against `label` to `b`.
    fn construct(
        &self,
        b: &mut GraphBuilder,
        logits: Value,
        label: Value,
    ) -> Result<Value, BuildError>;
}

/// How a loss reduces its per-element values: MindSpore's `reduction`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// The mean over all elements.
    Mean,
    /// The sum over all elements.
    Sum,
    /// No reduction.
    None,
}

impl Reduction {
    /// `"mean"`, `"sum"` or `"none"`.
    pub fn from_name(name: &str) -> Option<Reduction> {
        match name {
            "mean" => Some(Reduction::Mean),
            "sum" => Some(Reduction::Sum),
            "none" => Some(Reduction::None),
            _ => None,
        }
    }

    /// Applies the reduction over every axis of `x` (MindSpore's `get_loss`).
    fn apply(self, b: &mut GraphBuilder, x: Value, who: &str) -> Result<Value, BuildError> {
        let rank = b.shape_of(x, who)?.len() as i64;
        let axes: Vec<i64> = (0..rank).collect();
        match self {
            Reduction::Mean => b.reduce_mean(x, &axes, false),
            Reduction::Sum => b.reduce_sum(x, &axes, false),
            Reduction::None => Ok(x),
        }
    }
}

fn parse_reduction(name: &str, who: &str) -> Result<Reduction, BuildError> {
    Reduction::from_name(name).ok_or_else(|| BuildError::InvalidArgument {
        instance: who.to_string(),
        reason: format!("reduction must be \"mean\", \"sum\" or \"none\", got \"{name}\""),
    })
}

/// `nn.MSELoss(reduction="mean")`: `Sub`, `Square`, then `ReduceMean` over all axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MSELoss {
    reduction: String,
}

impl MSELoss {
    /// The mean squared error.
    pub fn new() -> Self {
        MSELoss {
            reduction: "mean".into(),
        }
    }

    /// `mean`, `sum` or `none` (checked when the loss is built).
    pub fn reduction(mut self, reduction: &str) -> Self {
        self.reduction = reduction.to_string();
        self
    }
}

impl Default for MSELoss {
    fn default() -> Self {
        Self::new()
    }
}

impl LossFn for MSELoss {
    fn class_name(&self) -> &str {
        "MSELoss"
    }

    fn construct(
        &self,
        b: &mut GraphBuilder,
        logits: Value,
        label: Value,
    ) -> Result<Value, BuildError> {
        let reduction = parse_reduction(&self.reduction, "MSELoss")?;
        let diff = b.sub(logits, label)?;
        b.set_value_name(diff, "diff");
        let sq = b.square(diff)?;
        b.set_value_name(sq, "sq");
        let loss = reduction.apply(b, sq, "MSELoss")?;
        b.set_value_name(loss, "loss");
        Ok(loss)
    }
}

/// `nn.SoftmaxCrossEntropyWithLogits(sparse, reduction)`.
///
/// - sparse with `mean`: one `SparseSoftmaxCrossEntropyWithLogits` op (labels `(N)` integers);
/// - sparse otherwise: `OneHot` of the labels, then the dense form;
/// - dense: `SoftmaxCrossEntropyWithLogits`, its item 0 (per-sample loss), then the reduction
///   (`ReduceMean` / `ReduceSum` over all axes, or none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftmaxCrossEntropyWithLogits {
    sparse: bool,
    reduction: String,
}

impl SoftmaxCrossEntropyWithLogits {
    /// `sparse`: labels are class indices; `reduction`: `mean`, `sum` or `none` (checked when
    /// the loss is built).
    pub fn new(sparse: bool, reduction: &str) -> Self {
        SoftmaxCrossEntropyWithLogits {
            sparse,
            reduction: reduction.to_string(),
        }
    }
}

impl LossFn for SoftmaxCrossEntropyWithLogits {
    fn class_name(&self) -> &str {
        "SoftmaxCrossEntropyWithLogits"
    }

    fn construct(
        &self,
        b: &mut GraphBuilder,
        logits: Value,
        label: Value,
    ) -> Result<Value, BuildError> {
        const WHO: &str = "SoftmaxCrossEntropyWithLogits";
        let reduction = parse_reduction(&self.reduction, WHO)?;
        let shape = b.shape_of(logits, WHO)?;
        if shape.len() != 2 {
            return Err(BuildError::InvalidArgument {
                instance: WHO.into(),
                reason: format!("logits must be (N, C), got shape {shape:?}"),
            });
        }
        let mut label = label;
        if self.sparse {
            if reduction == Reduction::Mean {
                let loss = ops::SparseSoftmaxCrossEntropyWithLogits::new()
                    .instance("sparse_softmax_cross_entropy")
                    .call(b, logits, label)?;
                b.set_value_name(loss, "loss");
                return Ok(loss);
            }
            label = ops::OneHot::new().call(b, label, shape[1] as i64, 1.0, 0.0)?;
        }
        let t = ops::SoftmaxCrossEntropyWithLogits::new()
            .instance("softmax_cross_entropy")
            .call(b, logits, label)?;
        let per_sample = b.tuple_get_item(t, 0)?;
        let loss = reduction.apply(b, per_sample, WHO)?;
        b.set_value_name(loss, "loss");
        Ok(loss)
    }
}

/// The tutorials' `SoftmaxCrossEntropyExpand(sparse)`: softmax cross-entropy written from
/// elementary ops, so that the parallel passes can split every step (from
/// `distributed_training_gpu`):
///
/// ```text
/// logit_max = ReduceMax(keep_dims)(logit, -1)
/// exp = Exp(Sub(logit, logit_max))
/// exp_sum = ReduceSum(keep_dims)(exp, -1)
/// softmax_result = RealDiv(exp, exp_sum)
/// if sparse: label = OneHot(label, C, 1.0, 0.0)
/// softmax_result_log = Log(softmax_result)
/// loss = ReduceSum(Mul(softmax_result_log, label), -1)
/// loss = Mul(-1.0, loss)
/// loss = ReduceMean(loss, -1)
/// ```
///
/// Instance names are the tutorial's attribute names (`max`, `sub`, `exp`, `sum`, `div`,
/// `onehot`, `log`, `mul`, `sum_cross_entropy`, `mul2`, `mean`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SoftmaxCrossEntropyExpand {
    /// Labels are class indices (one-hot encoded first).
    pub sparse: bool,
}

impl SoftmaxCrossEntropyExpand {
    /// The loss; `sparse` as in the tutorial.
    pub fn new(sparse: bool) -> Self {
        SoftmaxCrossEntropyExpand { sparse }
    }
}

impl LossFn for SoftmaxCrossEntropyExpand {
    fn class_name(&self) -> &str {
        "SoftmaxCrossEntropyExpand"
    }

    fn construct(
        &self,
        b: &mut GraphBuilder,
        logit: Value,
        label: Value,
    ) -> Result<Value, BuildError> {
        const WHO: &str = "SoftmaxCrossEntropyExpand";
        let shape = b.shape_of(logit, WHO)?;
        if shape.len() != 2 {
            return Err(BuildError::InvalidArgument {
                instance: WHO.into(),
                reason: format!("logits must be (N, C), got shape {shape:?}"),
            });
        }
        let logit_max = ops::ReduceMax::new()
            .keep_dims(true)
            .instance("max")
            .call_axis(b, logit, -1)?;
        let shifted = ops::Sub::new().instance("sub").call(b, logit, logit_max)?;
        let exp = ops::Exp::new().instance("exp").call(b, shifted)?;
        let exp_sum = ops::ReduceSum::new()
            .keep_dims(true)
            .instance("sum")
            .call_axis(b, exp, -1)?;
        let softmax_result = ops::RealDiv::new().instance("div").call(b, exp, exp_sum)?;
        let label = if self.sparse {
            let onehot =
                ops::OneHot::new()
                    .instance("onehot")
                    .call(b, label, shape[1] as i64, 1.0, 0.0)?;
            // OneHot gives Float32; an f64 network needs its labels in f64.
            match b.ty(&logit).map(|t| t.dtype) {
                Some(dt) if dt != shardc_ir::DType::Float32 => b.cast(onehot, dt)?,
                _ => onehot,
            }
        } else {
            label
        };
        let softmax_result_log = ops::Log::new().instance("log").call(b, softmax_result)?;
        let prod = ops::Mul::new()
            .instance("mul")
            .call(b, softmax_result_log, label)?;
        let loss = ops::ReduceSum::new()
            .keep_dims(false)
            .instance("sum_cross_entropy")
            .call_axis(b, prod, -1)?;
        let loss = ops::Mul::new().instance("mul2").call(b, -1.0, loss)?;
        let loss = ops::ReduceMean::new()
            .keep_dims(false)
            .instance("mean")
            .call_axis(b, loss, -1)?;
        b.set_value_name(loss, "loss");
        Ok(loss)
    }
}
