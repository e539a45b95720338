//! Optimizers, as MindSpore's `nn.Momentum`, `nn.SGD` and `nn.Adam`. Each turns into the
//! [`Optimizer`] spec that autodiff builds the update from (`ApplyMomentum`, `SGD`, `Adam`).

use shardc_passes::autodiff::Optimizer;

/// Anything that describes an optimizer for [`crate::model::train_graph`].
pub trait OptimizerSpec {
    /// The spec autodiff builds the update from.
    fn to_spec(&self) -> Optimizer;
}

impl OptimizerSpec for Optimizer {
    fn to_spec(&self) -> Optimizer {
        *self
    }
}

/// `nn.Momentum(params, learning_rate, momentum, use_nesterov=False)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Momentum {
    /// Learning rate.
    pub learning_rate: f64,
    /// Momentum.
    pub momentum: f64,
    /// Nesterov momentum.
    pub use_nesterov: bool,
}

impl Momentum {
    /// Momentum SGD with learning rate `lr` and momentum `momentum`.
    pub fn new(lr: f64, momentum: f64) -> Self {
        Momentum {
            learning_rate: lr,
            momentum,
            use_nesterov: false,
        }
    }

    /// Sets Nesterov momentum.
    pub fn use_nesterov(mut self, on: bool) -> Self {
        self.use_nesterov = on;
        self
    }

    /// The spec.
    pub fn to_spec(&self) -> Optimizer {
        Optimizer::Momentum {
            learning_rate: self.learning_rate,
            momentum: self.momentum,
            use_nesterov: self.use_nesterov,
        }
    }
}

impl OptimizerSpec for Momentum {
    fn to_spec(&self) -> Optimizer {
        Momentum::to_spec(self)
    }
}

/// `nn.SGD(params, learning_rate, momentum=0.0, dampening=0.0, weight_decay=0.0,
/// nesterov=False)`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(clippy::upper_case_acronyms)]
pub struct SGD {
    /// Learning rate.
    pub learning_rate: f64,
    /// Momentum.
    pub momentum: f64,
    /// Dampening of the momentum.
    pub dampening: f64,
    /// L2 weight decay.
    pub weight_decay: f64,
    /// Nesterov momentum.
    pub nesterov: bool,
}

impl SGD {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f64) -> Self {
        SGD {
            learning_rate: lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }

    /// Sets the momentum.
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }

    /// Sets the dampening.
    pub fn dampening(mut self, d: f64) -> Self {
        self.dampening = d;
        self
    }

    /// Sets the weight decay.
    pub fn weight_decay(mut self, w: f64) -> Self {
        self.weight_decay = w;
        self
    }

    /// Sets Nesterov momentum.
    pub fn nesterov(mut self, on: bool) -> Self {
        self.nesterov = on;
        self
    }

    /// The spec.
    pub fn to_spec(&self) -> Optimizer {
        Optimizer::Sgd {
            learning_rate: self.learning_rate,
            momentum: self.momentum,
            dampening: self.dampening,
            weight_decay: self.weight_decay,
            nesterov: self.nesterov,
        }
    }
}

impl OptimizerSpec for SGD {
    fn to_spec(&self) -> Optimizer {
        SGD::to_spec(self)
    }
}

/// `nn.Adam(params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    /// Learning rate.
    pub learning_rate: f64,
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the denominator.
    pub eps: f64,
}

impl Adam {
    /// Adam with learning rate `lr` and MindSpore's defaults for the rest.
    pub fn new(lr: f64) -> Self {
        Adam {
            learning_rate: lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// Sets beta1.
    pub fn beta1(mut self, b: f64) -> Self {
        self.beta1 = b;
        self
    }

    /// Sets beta2.
    pub fn beta2(mut self, b: f64) -> Self {
        self.beta2 = b;
        self
    }

    /// Sets eps.
    pub fn eps(mut self, e: f64) -> Self {
        self.eps = e;
        self
    }

    /// The spec.
    pub fn to_spec(&self) -> Optimizer {
        Optimizer::Adam {
            learning_rate: self.learning_rate,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
        }
    }
}

impl OptimizerSpec for Adam {
    fn to_spec(&self) -> Optimizer {
        Adam::to_spec(self)
    }
}

/// Checks the numbers of an optimizer spec as MindSpore does: finite, non-negative learning
/// rate, momentum, dampening and weight decay; Nesterov SGD with positive momentum and no
/// dampening; Adam's betas in `[0, 1)` and a positive eps. Returns the first problem.
pub fn validate(opt: &Optimizer) -> Result<(), String> {
    fn finite_nonneg(name: &str, v: f64) -> Result<(), String> {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(format!("{name} must be finite and non-negative, got {v}"))
        }
    }
    match *opt {
        Optimizer::Momentum {
            learning_rate,
            momentum,
            ..
        } => {
            finite_nonneg("learning_rate", learning_rate)?;
            finite_nonneg("momentum", momentum)
        }
        Optimizer::Sgd {
            learning_rate,
            momentum,
            dampening,
            weight_decay,
            nesterov,
        } => {
            finite_nonneg("learning_rate", learning_rate)?;
            finite_nonneg("momentum", momentum)?;
            finite_nonneg("dampening", dampening)?;
            finite_nonneg("weight_decay", weight_decay)?;
            if nesterov && (momentum <= 0.0 || dampening != 0.0) {
                return Err("nesterov needs a positive momentum and zero dampening".into());
            }
            Ok(())
        }
        Optimizer::Adam {
            learning_rate,
            beta1,
            beta2,
            eps,
        } => {
            finite_nonneg("learning_rate", learning_rate)?;
            for (name, beta) in [("beta1", beta1), ("beta2", beta2)] {
                if !(0.0..1.0).contains(&beta) {
                    return Err(format!("{name} must be in [0, 1), got {beta}"));
                }
            }
            if !(eps.is_finite() && eps > 0.0) {
                return Err(format!("eps must be finite and positive, got {eps}"));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_carry_the_numbers() {
        assert_eq!(
            Momentum::new(0.2, 0.1).to_spec(),
            Optimizer::Momentum {
                learning_rate: 0.2,
                momentum: 0.1,
                use_nesterov: false
            }
        );
        assert_eq!(
            SGD::new(0.1).momentum(0.9).to_spec(),
            Optimizer::Sgd {
                learning_rate: 0.1,
                momentum: 0.9,
                dampening: 0.0,
                weight_decay: 0.0,
                nesterov: false
            }
        );
        assert_eq!(
            Adam::new(1e-3).to_spec(),
            Optimizer::Adam {
                learning_rate: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8
            }
        );
    }

    #[test]
    fn validation_rejects_bad_numbers() {
        assert!(validate(&Momentum::new(0.1, 0.9).to_spec()).is_ok());
        assert!(validate(&Momentum::new(-0.1, 0.9).to_spec()).is_err());
        assert!(validate(&Momentum::new(f64::NAN, 0.9).to_spec()).is_err());
        assert!(validate(&SGD::new(0.1).nesterov(true).to_spec()).is_err());
        assert!(validate(&Adam::new(0.1).beta1(1.0).to_spec()).is_err());
        assert!(validate(&Adam::new(0.1).eps(0.0).to_spec()).is_err());
    }
}
