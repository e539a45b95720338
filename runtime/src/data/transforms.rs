//! MindSpore's `vision` and `transforms` operations on one row's tensor.
//!
//! Images are HWC (height, width, channels), as decoded by the sources; the spatial
//! transforms check that their input is rank 3 and say which transform and shape failed.

use super::DataError;
use crate::tensor::{Data, Tensor};
use half::{bf16, f16};
use rand::{Rng, RngCore};
use shardc_ir::DType;

/// One operation of a `map`. Every random choice comes from the generator handed to
/// [`Transform::apply`] (seeded per row by the pipeline).
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// `vision.RandomCrop(size, padding)`: pad with zeros by `padding` = (left, top, right,
    /// bottom) pixels (MindSpore's order), then crop a uniformly random `size` = (height,
    /// width) window. Error when the window is larger than the padded image.
    RandomCrop {
        /// (height, width) of the crop.
        size: (usize, usize),
        /// Zero padding (left, top, right, bottom) before cropping.
        padding: (usize, usize, usize, usize),
    },
    /// `vision.RandomHorizontalFlip(prob)`: mirror the width axis with probability `prob`.
    RandomHorizontalFlip {
        /// Probability of flipping, in [0, 1].
        prob: f64,
    },
    /// `vision.Resize(size)` with `Inter.LINEAR`: bilinear with half-pixel centres, edges
    /// clamped (as OpenCV's `INTER_LINEAR`), to `size` = (height, width).
    Resize {
        /// (height, width) of the result.
        size: (usize, usize),
    },
    /// `vision.Rescale(rescale, shift)`: `x * rescale + shift`, any shape; the result is
    /// Float32 (Float64 stays Float64).
    Rescale {
        /// The factor.
        rescale: f64,
        /// The offset added after scaling.
        shift: f64,
    },
    /// `vision.Normalize(mean, std)`: `(x - mean[c]) / std[c]` over the last (channel) axis of
    /// an HWC image (an HW image counts as one channel). The result is Float32 (Float64 stays
    /// Float64).
    Normalize {
        /// Mean per channel.
        mean: Vec<f64>,
        /// Standard deviation per channel (positive).
        std: Vec<f64>,
    },
    /// `vision.HWC2CHW()`: moves the channel axis first; rank 3 only.
    HWC2CHW,
    /// `transforms.TypeCast(dtype)`: converts the elements (floats to integers truncate toward
    /// zero and saturate).
    TypeCast(DType),
}

/// Constructors named like MindSpore's `mindspore.dataset.vision` / `transforms` classes.
#[allow(non_snake_case)]
pub mod vision {
    use super::Transform;
    use shardc_ir::DType;

    /// `vision.RandomCrop(size, padding)`; padding is (left, top, right, bottom).
    pub fn RandomCrop(size: (usize, usize), padding: (usize, usize, usize, usize)) -> Transform {
        Transform::RandomCrop { size, padding }
    }
    /// `vision.RandomHorizontalFlip(prob)` (MindSpore's default probability is 0.5).
    pub fn RandomHorizontalFlip(prob: f64) -> Transform {
        Transform::RandomHorizontalFlip { prob }
    }
    /// `vision.Resize((height, width))`, bilinear.
    pub fn Resize(size: (usize, usize)) -> Transform {
        Transform::Resize { size }
    }
    /// `vision.Rescale(rescale, shift)`.
    pub fn Rescale(rescale: f64, shift: f64) -> Transform {
        Transform::Rescale { rescale, shift }
    }
    /// `vision.Normalize(mean, std)` on HWC.
    pub fn Normalize(mean: &[f64], std: &[f64]) -> Transform {
        Transform::Normalize {
            mean: mean.to_vec(),
            std: std.to_vec(),
        }
    }
    /// `vision.HWC2CHW()`.
    pub fn HWC2CHW() -> Transform {
        Transform::HWC2CHW
    }
    /// `transforms.TypeCast(dtype)`.
    pub fn TypeCast(dtype: DType) -> Transform {
        Transform::TypeCast(dtype)
    }
}

/// Applies a generic element function to every variant of a buffer, keeping the variant.
macro_rules! each_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            Data::F32($v) => Data::F32($body),
            Data::F64($v) => Data::F64($body),
            Data::F16($v) => Data::F16($body),
            Data::BF16($v) => Data::BF16($body),
            Data::I32($v) => Data::I32($body),
            Data::I64($v) => Data::I64($body),
            Data::Bool($v) => Data::Bool($body),
        }
    };
}

impl Transform {
    /// MindSpore's name of the operation.
    pub fn name(&self) -> &'static str {
        match self {
            Transform::RandomCrop { .. } => "RandomCrop",
            Transform::RandomHorizontalFlip { .. } => "RandomHorizontalFlip",
            Transform::Resize { .. } => "Resize",
            Transform::Rescale { .. } => "Rescale",
            Transform::Normalize { .. } => "Normalize",
            Transform::HWC2CHW => "HWC2CHW",
            Transform::TypeCast(_) => "TypeCast",
        }
    }

    fn err(&self, reason: String) -> DataError {
        DataError::Transform {
            transform: self.name().to_string(),
            reason,
        }
    }

    /// Checks the parameters (positive sizes, a probability in [0, 1], finite factors, one
    /// positive std per mean).
    pub fn validate(&self) -> Result<(), DataError> {
        match self {
            Transform::RandomCrop { size, .. } | Transform::Resize { size } => {
                if size.0 == 0 || size.1 == 0 {
                    return Err(
                        self.err(format!("size {size:?} must be positive in both dimensions"))
                    );
                }
            }
            Transform::RandomHorizontalFlip { prob } => {
                if !(0.0..=1.0).contains(prob) {
                    return Err(self.err(format!("prob {prob} is outside [0, 1]")));
                }
            }
            Transform::Rescale { rescale, shift } => {
                if !rescale.is_finite() || !shift.is_finite() {
                    return Err(self.err(format!(
                        "rescale {rescale} and shift {shift} must be finite"
                    )));
                }
            }
            Transform::Normalize { mean, std } => {
                if mean.is_empty() || mean.len() != std.len() {
                    return Err(self.err(format!(
                        "mean has {} values and std {}; they need one per channel, at least one",
                        mean.len(),
                        std.len()
                    )));
                }
                if let Some(s) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
                    return Err(self.err(format!("std {s} must be positive and finite")));
                }
                if let Some(m) = mean.iter().find(|m| !m.is_finite()) {
                    return Err(self.err(format!("mean {m} must be finite")));
                }
            }
            Transform::HWC2CHW | Transform::TypeCast(_) => {}
        }
        Ok(())
    }

    fn hwc(&self, t: &Tensor) -> Result<(usize, usize, usize), DataError> {
        match t.shape[..] {
            [h, w, c] => Ok((h, w, c)),
            _ => Err(self.err(format!(
                "expects a rank-3 HWC image, got shape {:?} (rank {})",
                t.shape,
                t.shape.len()
            ))),
        }
    }

    /// Applies the operation to one tensor, drawing any random choice from `rng`.
    pub fn apply(&self, input: Tensor, rng: &mut dyn RngCore) -> Result<Tensor, DataError> {
        self.validate()?;
        match self {
            Transform::RandomCrop { size, padding } => {
                let (h, w, c) = self.hwc(&input)?;
                let (left, top, right, bottom) = *padding;
                let (ph, pw) = (h + top + bottom, w + left + right);
                if size.0 > ph || size.1 > pw {
                    return Err(self.err(format!(
                        "crop size {size:?} is larger than the padded image {ph}x{pw} (image \
                         shape {:?}, padding (left, top, right, bottom) {padding:?})",
                        input.shape
                    )));
                }
                let y0 = rng.random_range(0..=ph - size.0);
                let x0 = rng.random_range(0..=pw - size.1);
                let (oh, ow) = *size;
                let data = each_data!(&input.data, v => {
                    let mut out = vec![Default::default(); oh * ow * c];
                    for y in 0..oh {
                        let sy = (y0 + y).wrapping_sub(top);
                        if sy >= h {
                            continue;
                        }
                        for x in 0..ow {
                            let sx = (x0 + x).wrapping_sub(left);
                            if sx >= w {
                                continue;
                            }
                            let s = (sy * w + sx) * c;
                            let d = (y * ow + x) * c;
                            out[d..d + c].copy_from_slice(&v[s..s + c]);
                        }
                    }
                    out
                });
                Ok(Tensor {
                    shape: vec![oh, ow, c],
                    data,
                })
            }
            Transform::RandomHorizontalFlip { prob } => {
                let (h, w, c) = self.hwc(&input)?;
                if rng.random::<f64>() >= *prob {
                    return Ok(input);
                }
                let data = each_data!(&input.data, v => {
                    let mut out = v.clone();
                    for y in 0..h {
                        for x in 0..w {
                            let s = (y * w + (w - 1 - x)) * c;
                            let d = (y * w + x) * c;
                            out[d..d + c].copy_from_slice(&v[s..s + c]);
                        }
                    }
                    out
                });
                Ok(Tensor {
                    shape: input.shape,
                    data,
                })
            }
            Transform::Resize { size } => {
                let (h, w, c) = self.hwc(&input)?;
                if h == 0 || w == 0 || c == 0 {
                    return Err(self.err(format!("cannot resize an empty image {:?}", input.shape)));
                }
                let (oh, ow) = *size;
                let ys = linear_taps(h, oh);
                let xs = linear_taps(w, ow);
                let data = match float_data(input.data) {
                    Data::F64(v) => Data::F64(resize_bilinear(&v, w, c, &ys, &xs)),
                    Data::F32(v) => Data::F32(resize_bilinear(&v, w, c, &ys, &xs)),
                    _ => unreachable!("float_data returns F32 or F64"),
                };
                Ok(Tensor {
                    shape: vec![oh, ow, c],
                    data,
                })
            }
            Transform::Rescale { rescale, shift } => {
                let data = match float_data(input.data) {
                    Data::F64(mut v) => {
                        v.iter_mut().for_each(|x| *x = *x * rescale + shift);
                        Data::F64(v)
                    }
                    Data::F32(mut v) => {
                        let (r, s) = (*rescale as f32, *shift as f32);
                        v.iter_mut().for_each(|x| *x = *x * r + s);
                        Data::F32(v)
                    }
                    _ => unreachable!("float_data returns F32 or F64"),
                };
                Ok(Tensor {
                    shape: input.shape,
                    data,
                })
            }
            Transform::Normalize { mean, std } => {
                let c = match input.shape[..] {
                    [_, _, c] => c,
                    [_, _] => 1,
                    _ => {
                        return Err(self.err(format!(
                            "expects an HWC (or HW) image, got shape {:?} (rank {})",
                            input.shape,
                            input.shape.len()
                        )))
                    }
                };
                if c != mean.len() {
                    return Err(self.err(format!(
                        "image shape {:?} has {c} channels (last axis) but mean/std have {}",
                        input.shape,
                        mean.len()
                    )));
                }
                let data = match float_data(input.data) {
                    Data::F64(mut v) => {
                        for px in v.chunks_exact_mut(c) {
                            for ((x, m), s) in px.iter_mut().zip(mean).zip(std) {
                                *x = (*x - m) / s;
                            }
                        }
                        Data::F64(v)
                    }
                    Data::F32(mut v) => {
                        // Per-channel constants repeated over 16 pixels, so the loop is flat.
                        let reps = 16;
                        let m: Vec<f32> = (0..reps * c).map(|i| mean[i % c] as f32).collect();
                        let inv: Vec<f32> =
                            (0..reps * c).map(|i| (1.0 / std[i % c]) as f32).collect();
                        for block in v.chunks_mut(reps * c) {
                            for ((x, m), s) in block.iter_mut().zip(&m).zip(&inv) {
                                *x = (*x - m) * s;
                            }
                        }
                        Data::F32(v)
                    }
                    _ => unreachable!("float_data returns F32 or F64"),
                };
                Ok(Tensor {
                    shape: input.shape,
                    data,
                })
            }
            Transform::HWC2CHW => {
                let (h, w, c) = self.hwc(&input)?;
                let data = each_data!(&input.data, v => {
                    let mut out = Vec::with_capacity(v.len());
                    if c == 3 {
                        // The common case in one pass per plane over contiguous pixels.
                        for ch in 0..3 {
                            out.extend(v.chunks_exact(3).map(|px| px[ch]));
                        }
                    } else {
                        for ch in 0..c {
                            out.extend(v.iter().skip(ch).step_by(c).copied());
                        }
                    }
                    out
                });
                Ok(Tensor {
                    shape: vec![c, h, w],
                    data,
                })
            }
            Transform::TypeCast(dtype) => Ok(Tensor {
                data: cast(input.data, *dtype),
                shape: input.shape,
            }),
        }
    }
}

/// The buffer as floats: Float64 stays, everything else becomes Float32.
fn float_data(d: Data) -> Data {
    match d {
        Data::F32(_) | Data::F64(_) => d,
        other => cast(other, DType::Float32),
    }
}

/// Converts a buffer to `dtype`.
fn cast(d: Data, dtype: DType) -> Data {
    if d.dtype() == dtype {
        return d;
    }
    match (&d, dtype) {
        (Data::I32(v), DType::Int64) => return Data::I64(v.iter().map(|&x| x as i64).collect()),
        (Data::I64(v), DType::Int32) => {
            return Data::I32(
                v.iter()
                    .map(|&x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
                    .collect(),
            )
        }
        _ => {}
    }
    let n = d.len();
    let vals = (0..n).map(|i| d.get_f64(i));
    match dtype {
        DType::Float32 => Data::F32(vals.map(|x| x as f32).collect()),
        DType::Float64 => Data::F64(vals.collect()),
        DType::Float16 => Data::F16(vals.map(f16::from_f64).collect()),
        DType::BFloat16 => Data::BF16(vals.map(bf16::from_f64).collect()),
        DType::Int32 => Data::I32(vals.map(|x| x as i32).collect()),
        DType::Int64 => Data::I64(vals.map(|x| x as i64).collect()),
        DType::Bool => Data::Bool(vals.map(|x| x != 0.0).collect()),
    }
}

/// For every output coordinate: the two source coordinates and the weight of the second
/// (OpenCV `INTER_LINEAR`: half-pixel centres, clamped at the borders).
fn linear_taps(src: usize, dst: usize) -> Vec<(usize, usize, f64)> {
    let scale = src as f64 / dst as f64;
    (0..dst)
        .map(|d| {
            let f = (d as f64 + 0.5) * scale - 0.5;
            let s = f.floor();
            let mut frac = f - s;
            let mut s = s as isize;
            if s < 0 {
                s = 0;
                frac = 0.0;
            }
            let s = s as usize;
            if s + 1 >= src {
                (src - 1, src - 1, 0.0)
            } else {
                (s, s + 1, frac)
            }
        })
        .collect()
}

/// The float element of a resize: linear interpolation in its own precision.
trait Lerp: Copy + Default {
    fn weight(w: f64) -> Self;
    fn lerp(a: Self, b: Self, w: Self) -> Self;
}
impl Lerp for f32 {
    fn weight(w: f64) -> f32 {
        w as f32
    }
    #[inline]
    fn lerp(a: f32, b: f32, w: f32) -> f32 {
        a + (b - a) * w
    }
}
impl Lerp for f64 {
    fn weight(w: f64) -> f64 {
        w
    }
    #[inline]
    fn lerp(a: f64, b: f64, w: f64) -> f64 {
        a + (b - a) * w
    }
}

/// Separable bilinear resize of an HWC image of width `w` and `c` channels: for every output
/// row, the two source rows are blended vertically, then every output pixel horizontally
/// (the same value as blending horizontally first, up to rounding).
fn resize_bilinear<T: Lerp>(
    v: &[T],
    w: usize,
    c: usize,
    ys: &[(usize, usize, f64)],
    xs: &[(usize, usize, f64)],
) -> Vec<T> {
    let row_len = w * c;
    // One tap per output element of a row: the two source elements and the weight.
    let taps: Vec<(usize, usize, T)> = xs
        .iter()
        .flat_map(|&(x0, x1, wx)| (0..c).map(move |k| (x0 * c + k, x1 * c + k, T::weight(wx))))
        .collect();
    let mut out = vec![T::default(); ys.len() * taps.len()];
    let mut blended = vec![T::default(); row_len];
    for (orow, &(y0, y1, wy)) in out.chunks_exact_mut(taps.len()).zip(ys) {
        let (r0, r1) = (
            &v[y0 * row_len..(y0 + 1) * row_len],
            &v[y1 * row_len..(y1 + 1) * row_len],
        );
        let wy = T::weight(wy);
        for ((b, &a0), &a1) in blended.iter_mut().zip(r0).zip(r1) {
            *b = T::lerp(a0, a1, wy);
        }
        for (o, &(i0, i1, wx)) in orow.iter_mut().zip(&taps) {
            *o = T::lerp(blended[i0], blended[i1], wx);
        }
    }
    out
}
