//! The floating-point element types the compute kernels are generic over.

use shardc_ir::DType;
use shardc_runtime::Data;
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// A float element type a kernel computes in: `f32` or `f64`.
///
/// Kept deliberately small: the arithmetic the kernels use, the conversions to and from
/// `f64`, and access to the matching [`Data`] variant.
pub trait Real:
    Copy
    + Send
    + Sync
    + Debug
    + Default
    + PartialOrd
    + PartialEq
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + Elem
{
    /// `0`.
    const ZERO: Self;
    /// `1`.
    const ONE: Self;
    /// Negative infinity.
    const NEG_INFINITY: Self;
    /// The IR element type.
    const DTYPE: DType;

    /// `e^self`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Hyperbolic tangent for approximations that contain it (the tanh GeLU): in f32 a
    /// rational function that vectorises (within 4.3e-7 of the exact value, libm's `tanhf`
    /// 1.0e-7; 15x faster without AVX), in f64 exact (the gradient checks' type).
    fn tanh_fast(self) -> Self;
    /// The error function (libm's `erf` / `erff`, within an ulp or two).
    fn erf(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// Whether the value is NaN.
    fn is_nan(self) -> bool;
}

macro_rules! impl_real {
    ($t:ty, $dtype:ident, $tanh_fast:path, $erf:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const DTYPE: DType = DType::$dtype;

            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn tanh_fast(self) -> Self {
                $tanh_fast(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
        }
    };
}

impl_real!(f32, Float32, tanh_rational, libm::erff);
impl_real!(f64, Float64, f64::tanh, libm::erf);

/// `tanh(x)` in f32 as an odd degree-13 over even degree-6 rational function of `x`
/// clamped to ±7.998 (where tanh rounds to ±1 in f32), evaluated by Horner's rule: no
/// branch and no libm call, so loops over it vectorise. Largest error against the exact
/// value on a 1e-5 grid over [-12, 12]: 4.3e-7 (about 7 ulp near 1).
#[inline(always)]
fn tanh_rational(x: f32) -> f32 {
    const CLAMP: f32 = 7.998_811_7;
    const ALPHA: [f32; 7] = [
        -2.760_768_5e-16,
        2.000_188e-13,
        -8.604_672e-11,
        5.122_297e-8,
        1.485_722_4e-5,
        6.372_619_3e-4,
        4.893_524_6e-3,
    ];
    const BETA: [f32; 4] = [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3];
    let x = x.clamp(-CLAMP, CLAMP);
    let x2 = x * x;
    let p = ALPHA.iter().fold(0.0, |acc, &a| acc * x2 + a) * x;
    let q = BETA.iter().fold(0.0, |acc, &b| acc * x2 + b);
    p / q
}

#[cfg(test)]
mod tests {
    use super::tanh_rational;

    #[test]
    fn rational_tanh_is_within_its_stated_error() {
        let mut worst = 0.0f64;
        for i in -1_200_000..=1_200_000 {
            let x = i as f32 * 1e-5;
            let err = (f64::from(tanh_rational(x)) - f64::from(x).tanh()).abs();
            worst = worst.max(err);
        }
        assert!(worst <= 4.5e-7, "largest error {worst:e}");
        assert_eq!(tanh_rational(0.0), 0.0);
        assert_eq!(tanh_rational(100.0), tanh_rational(8.0));
        assert!(tanh_rational(-3.0) == -tanh_rational(3.0));
        assert!(tanh_rational(f32::NAN).is_nan());
    }
}

/// Any element type a tensor can hold: access to the matching [`Data`] variant.
pub trait Elem: Copy + Send + Sync + Debug + PartialEq + 'static {
    /// The IR element type.
    const ELEM_DTYPE: DType;
    /// The zero (false) value.
    fn zero() -> Self;
    /// The one (true) value.
    fn one() -> Self;
    /// The value as f64 (`true` is 1).
    fn to_f64(self) -> f64;
    /// The nearest value to `v` (floats round; integers truncate toward zero and saturate;
    /// Bool is `v != 0`).
    fn from_f64(v: f64) -> Self;
    /// The value as i64 (floats truncate toward zero and saturate).
    fn to_i64(self) -> i64;
    /// The value of `v` (integers wrap as Rust's `as` does; Bool is `v != 0`).
    fn from_i64(v: i64) -> Self;
    /// Whether this is an integer or Bool type (casts between those go through i64).
    const IS_INTEGRAL: bool;
    /// The elements of `data`, when it holds this type.
    fn slice(data: &Data) -> Option<&[Self]>;
    /// The elements of `data`, mutably, when it holds this type.
    fn slice_mut(data: &mut Data) -> Option<&mut [Self]>;
}

macro_rules! impl_elem {
    ($t:ty, $dtype:ident, $variant:ident, $zero:expr, $one:expr, $integral:expr,
     |$a:ident| $to_f64:expr, |$b:ident| $from_f64:expr, |$c:ident| $to_i64:expr, |$d:ident| $from_i64:expr) => {
        impl Elem for $t {
            const IS_INTEGRAL: bool = $integral;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let $a = self;
                $to_f64
            }
            #[inline(always)]
            fn from_f64($b: f64) -> Self {
                $from_f64
            }
            #[inline(always)]
            fn to_i64(self) -> i64 {
                let $c = self;
                $to_i64
            }
            #[inline(always)]
            fn from_i64($d: i64) -> Self {
                $from_i64
            }
            const ELEM_DTYPE: DType = DType::$dtype;
            #[inline(always)]
            fn zero() -> Self {
                $zero
            }
            #[inline(always)]
            fn one() -> Self {
                $one
            }
            fn slice(data: &Data) -> Option<&[Self]> {
                match data {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(data: &mut Data) -> Option<&mut [Self]> {
                match data {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}

impl_elem!(
    f32,
    Float32,
    F32,
    0.0,
    1.0,
    false,
    |x| x as f64,
    |v| v as f32,
    |x| x as i64,
    |v| v as f32
);
impl_elem!(
    f64,
    Float64,
    F64,
    0.0,
    1.0,
    false,
    |x| x,
    |v| v,
    |x| x as i64,
    |v| v as f64
);
impl_elem!(
    half::f16,
    Float16,
    F16,
    half::f16::ZERO,
    half::f16::ONE,
    false,
    |x| x.to_f64(),
    |v| half::f16::from_f64(v),
    |x| x.to_f64() as i64,
    |v| half::f16::from_f64(v as f64)
);
impl_elem!(
    half::bf16,
    BFloat16,
    BF16,
    half::bf16::ZERO,
    half::bf16::ONE,
    false,
    |x| x.to_f64(),
    |v| half::bf16::from_f64(v),
    |x| x.to_f64() as i64,
    |v| half::bf16::from_f64(v as f64)
);
impl_elem!(
    i32,
    Int32,
    I32,
    0,
    1,
    true,
    |x| x as f64,
    |v| v as i32,
    |x| x as i64,
    |v| v as i32
);
impl_elem!(
    i64,
    Int64,
    I64,
    0,
    1,
    true,
    |x| x as f64,
    |v| v as i64,
    |x| x,
    |v| v
);
impl_elem!(
    bool,
    Bool,
    Bool,
    false,
    true,
    true,
    |x| x as u8 as f64,
    |v| v != 0.0,
    |x| x as i64,
    |v| v != 0
);

/// The larger of two values; NaN wins (so a NaN in a max-reduction shows in the result).
#[inline(always)]
pub fn max_nan<T: Real>(acc: T, v: T) -> T {
    if v > acc || v.is_nan() {
        v
    } else {
        acc
    }
}
