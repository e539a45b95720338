//! Initializers by their MindSpore names. Seeds are left 0: [`crate::builder::GraphBuilder::weight`]
//! replaces them with seeds derived from the builder's seed.

use shardc_ir::Init;

/// `normal(sigma)`, mean 0 (MindSpore's `"normal"` uses sigma 0.01).
pub fn normal(sigma: f64) -> Init {
    Init::Normal {
        sigma,
        mean: 0.0,
        seed: 0,
    }
}

/// Uniform on `[-scale, scale]`.
pub fn uniform(scale: f64) -> Init {
    Init::Uniform { scale, seed: 0 }
}

/// `zeros`.
pub fn zeros() -> Init {
    Init::Zeros
}

/// `ones`.
pub fn ones() -> Init {
    Init::Ones
}

/// Every element `value`.
pub fn constant(value: f64) -> Init {
    Init::Constant { value }
}

/// `xavier_uniform` with gain 1.
pub fn xavier_uniform() -> Init {
    Init::XavierUniform { gain: 1.0, seed: 0 }
}

/// `he_normal` (fan-in mode, ReLU gain).
pub fn he_normal() -> Init {
    Init::HeNormal { seed: 0 }
}

/// MindSpore's default weight initializer of `nn.Dense` and `nn.Conv2d`,
/// `HeUniform(negative_slope=sqrt(5))`: uniform with bound
/// `sqrt(2 / (1 + 5)) * sqrt(3 / fan_in) = 1 / sqrt(fan_in)`. Also the default bias
/// initializer (`Uniform(1 / sqrt(fan_in))`). The same numbers as PyTorch's defaults.
pub fn he_uniform_default(fan_in: usize) -> Init {
    uniform(1.0 / (fan_in.max(1) as f64).sqrt())
}
