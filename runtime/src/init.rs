//! Weight initializers: deterministic tensors from an [`Init`] and a type.
//!
//! Every random initializer draws from a `ChaCha8Rng` seeded with its own seed, in f64, in
//! row-major order, and converts the numbers to the tensor's dtype at the end: an f32 graph
//! and an f64 graph start from the same numbers up to rounding, and any rank can produce any
//! block of a global tensor ([`init_slice`]) identically.
//!
//! Fans follow MindSpore and PyTorch: for a 2-D shape `(a, b)` `fan_in = b` and
//! `fan_out = a`; for rank > 2 (a convolution's `(O, C, kh, kw)`) the receptive field
//! `prod(shape[2..])` multiplies both, `fan_in = shape[1] * receptive` and
//! `fan_out = shape[0] * receptive`; a rank-1 shape has `fan_in = fan_out = shape[0]`, a
//! scalar has both 1.

use crate::error::RuntimeError;
use crate::tensor::{Data, Tensor};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use shardc_ir::{DType, Init, TensorType};
use std::ops::Range;

/// `(fan_in, fan_out)` of a weight shape (see the module doc).
pub fn fans(shape: &[usize]) -> (usize, usize) {
    match shape.len() {
        0 => (1, 1),
        1 => (shape[0], shape[0]),
        2 => (shape[1], shape[0]),
        _ => {
            let receptive: usize = shape[2..].iter().product();
            (shape[1] * receptive, shape[0] * receptive)
        }
    }
}

/// The initializer as text, as MindSpore prints it: `normal(sigma=0.02, mean=0, seed=1)`.
pub fn describe(init: &Init) -> String {
    match init {
        Init::Normal { sigma, mean, seed } => {
            format!("normal(sigma={sigma}, mean={mean}, seed={seed})")
        }
        Init::Uniform { scale, seed } => format!("uniform(scale={scale}, seed={seed})"),
        Init::Zeros => "zeros".to_string(),
        Init::Ones => "ones".to_string(),
        Init::Constant { value } => format!("constant(value={value})"),
        Init::XavierUniform { gain, seed } => format!("xavier_uniform(gain={gain}, seed={seed})"),
        Init::HeNormal { seed } => format!("he_normal(seed={seed})"),
        Init::Block {
            of,
            global_shape,
            offset,
        } => format!("{} block {offset:?} of {global_shape:?}", describe(of)),
    }
}

fn init_err(init: &Init, ty: &TensorType, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::Init {
        target: format!("{ty} with {}", describe(init)),
        reason: reason.into(),
    }
}

/// The constant every element takes, for the non-random initializers.
fn constant_of(init: &Init) -> Option<f64> {
    match init {
        Init::Zeros => Some(0.0),
        Init::Ones => Some(1.0),
        Init::Constant { value } => Some(*value),
        _ => None,
    }
}

/// Checks that `init` can produce a tensor of type `ty`.
fn check(init: &Init, ty: &TensorType) -> Result<(), RuntimeError> {
    let finite = |name: &str, v: f64| {
        if v.is_finite() {
            Ok(())
        } else {
            Err(init_err(
                init,
                ty,
                format!("{name} is {v}; it must be finite"),
            ))
        }
    };
    let non_negative = |name: &str, v: f64| {
        finite(name, v)?;
        if v < 0.0 {
            Err(init_err(
                init,
                ty,
                format!("{name} is {v}; it must be >= 0"),
            ))
        } else {
            Ok(())
        }
    };
    match init {
        Init::Normal { sigma, mean, .. } => {
            non_negative("sigma", *sigma)?;
            finite("mean", *mean)?;
        }
        Init::Uniform { scale, .. } => non_negative("scale", *scale)?,
        Init::XavierUniform { gain, .. } => finite("gain", *gain)?,
        Init::Constant { value } => {
            if ty.dtype.is_float() {
                // Non-finite constants are legitimate floats (e.g. -inf masks).
            } else if ty.dtype == DType::Bool {
                if *value != 0.0 && *value != 1.0 {
                    return Err(init_err(
                        init,
                        ty,
                        format!("a Bool tensor takes 0 or 1, not {value}"),
                    ));
                }
            } else {
                let (lo, hi) = match ty.dtype {
                    DType::Int32 => (i32::MIN as f64, i32::MAX as f64),
                    _ => (i64::MIN as f64, i64::MAX as f64),
                };
                if value.fract() != 0.0 || !value.is_finite() || *value < lo || *value > hi {
                    return Err(init_err(
                        init,
                        ty,
                        format!("{value} is not an integer in the range of {}", ty.dtype),
                    ));
                }
            }
        }
        Init::Zeros | Init::Ones | Init::HeNormal { .. } => {}
        Init::Block { .. } => {
            return Err(init_err(
                init,
                ty,
                "a block initializer cannot be nested in another block",
            ))
        }
    }
    if constant_of(init).is_none() && !ty.dtype.is_float() {
        return Err(init_err(
            init,
            ty,
            format!("a random initializer needs a float dtype, not {}", ty.dtype),
        ));
    }
    Ok(())
}

/// Generates the whole tensor's values in f64, row-major.
fn generate(init: &Init, ty: &TensorType) -> Vec<f64> {
    let n = ty.num_elements();
    if let Some(c) = constant_of(init) {
        return vec![c; n];
    }
    let (fan_in, fan_out) = fans(&ty.shape);
    let normal = |seed: u64, mean: f64, sigma: f64| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let z: f64 = StandardNormal.sample(&mut rng);
                mean + sigma * z
            })
            .collect::<Vec<f64>>()
    };
    let uniform = |seed: u64, bound: f64| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| bound * (2.0 * rng.random::<f64>() - 1.0))
            .collect::<Vec<f64>>()
    };
    match init {
        Init::Normal { sigma, mean, seed } => normal(*seed, *mean, *sigma),
        Init::Uniform { scale, seed } => uniform(*seed, *scale),
        Init::XavierUniform { gain, seed } => {
            // n > 0 implies both fans are > 0.
            let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
            uniform(*seed, bound)
        }
        Init::HeNormal { seed } => normal(*seed, 0.0, (2.0 / fan_in.max(1) as f64).sqrt()),
        // `check` admits neither (constants returned above, blocks rejected).
        Init::Zeros | Init::Ones | Init::Constant { .. } | Init::Block { .. } => Vec::new(),
    }
}

/// Converts f64 values to a tensor of `dtype` and `shape`.
fn to_tensor(values: Vec<f64>, dtype: DType, shape: Vec<usize>) -> Tensor {
    let data = match dtype {
        DType::Float32 => Data::F32(values.iter().map(|&v| v as f32).collect()),
        DType::Float64 => Data::F64(values),
        DType::Float16 => Data::F16(values.iter().map(|&v| f16::from_f64(v)).collect()),
        DType::BFloat16 => Data::BF16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
        DType::Int32 => Data::I32(values.iter().map(|&v| v as i32).collect()),
        DType::Int64 => Data::I64(values.iter().map(|&v| v as i64).collect()),
        DType::Bool => Data::Bool(values.iter().map(|&v| v != 0.0).collect()),
    };
    Tensor { shape, data }
}

/// The tensor of type `ty` that `init` produces. Deterministic: the same initializer and type
/// always give the same tensor.
///
/// Errors: a random initializer on an integer or Bool dtype, a negative or non-finite
/// `sigma`/`scale`, a constant that does not fit an integer or Bool dtype.
///
/// An [`Init::Block`] produces its block of the whole tensor (see [`init_slice`]); its offset
/// plus `ty`'s shape must lie within the whole tensor's shape.
pub fn init_tensor(init: &Init, ty: &TensorType) -> Result<Tensor, RuntimeError> {
    if let Init::Block {
        of,
        global_shape,
        offset,
    } = init
    {
        if offset.len() != ty.rank() || global_shape.len() != ty.rank() {
            return Err(init_err(
                init,
                ty,
                format!(
                    "a block of a rank-{} tensor needs {} offsets and dimensions",
                    ty.rank(),
                    ty.rank()
                ),
            ));
        }
        let ranges: Vec<Range<usize>> = offset
            .iter()
            .zip(&ty.shape)
            .map(|(&o, &n)| o..o.saturating_add(n))
            .collect();
        let global = TensorType::new(ty.dtype, global_shape.clone());
        return init_slice(of, &global, &ranges);
    }
    check(init, ty)?;
    Ok(to_tensor(generate(init, ty), ty.dtype, ty.shape.clone()))
}

/// The block `ranges` (one `lo..hi` per dimension) of the tensor that `init` produces for the
/// global type `global`: exactly the elements of [`init_tensor`]`(init, global)` in that
/// block, with shape `hi - lo` per dimension. This is how a rank initialises its slice of a
/// sharded weight so that the slices assemble to the single-device weight.
pub fn init_slice(
    init: &Init,
    global: &TensorType,
    ranges: &[Range<usize>],
) -> Result<Tensor, RuntimeError> {
    check(init, global)?;
    if ranges.len() != global.rank() {
        return Err(init_err(
            init,
            global,
            format!(
                "a block of a rank-{} tensor needs {} ranges, got {}",
                global.rank(),
                global.rank(),
                ranges.len()
            ),
        ));
    }
    for (d, (r, &size)) in ranges.iter().zip(&global.shape).enumerate() {
        if r.start > r.end || r.end > size {
            return Err(init_err(
                init,
                global,
                format!(
                    "range {}..{} of dimension {d} is not within 0..{size}",
                    r.start, r.end
                ),
            ));
        }
    }
    let shape: Vec<usize> = ranges.iter().map(|r| r.end - r.start).collect();
    let n: usize = shape.iter().product();
    if let Some(c) = constant_of(init) {
        return Ok(to_tensor(vec![c; n], global.dtype, shape));
    }
    let all = generate(init, global);
    let mut block = Vec::with_capacity(n);
    if n > 0 {
        // Row-major strides of the global tensor.
        let rank = global.rank();
        let mut strides = vec![1usize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * global.shape[d + 1];
        }
        // Walk the block's index space; copy innermost runs at once.
        let mut idx: Vec<usize> = ranges.iter().map(|r| r.start).collect();
        let inner = if rank == 0 {
            0..1
        } else {
            ranges[rank - 1].clone()
        };
        'outer: loop {
            let base: usize = idx
                .iter()
                .zip(&strides)
                .take(rank.saturating_sub(1))
                .map(|(i, s)| i * s)
                .sum();
            block.extend_from_slice(&all[base + inner.start..base + inner.end]);
            // Advance the outer indices (all but the last).
            let mut d = rank.saturating_sub(1);
            loop {
                if d == 0 {
                    break 'outer;
                }
                d -= 1;
                idx[d] += 1;
                if idx[d] < ranges[d].end {
                    break;
                }
                idx[d] = ranges[d].start;
            }
        }
    }
    Ok(to_tensor(block, global.dtype, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fans_follow_pytorch() {
        assert_eq!(fans(&[8, 4]), (4, 8));
        assert_eq!(fans(&[16, 3, 5, 5]), (75, 400));
        assert_eq!(fans(&[10]), (10, 10));
        assert_eq!(fans(&[]), (1, 1));
    }

    #[test]
    fn scalar_slice() {
        let init = Init::Normal {
            sigma: 1.0,
            mean: 0.0,
            seed: 3,
        };
        let ty = TensorType::scalar(DType::Float64);
        let full = init_tensor(&init, &ty).unwrap();
        assert_eq!(init_slice(&init, &ty, &[]).unwrap(), full);
    }
}
