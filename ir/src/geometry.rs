//! Convolution and pooling geometry: output sizes and padding from a node's attributes.
//!
//! The shape rules, autodiff and every backend's kernels use these functions, so they all
//! agree on where each window sits. Layout is NCHW (`data_format` other than `NCHW` is an
//! error). `pad_mode` is `valid`, `same` or `pad`, case-insensitive:
//!
//! - `valid`: no padding, `out = (in - ((k - 1) * dil + 1)) / stride + 1`;
//! - `same` (as TensorFlow and MindSpore): `out = ceil(in / stride)`,
//!   `total = max((out - 1) * stride + (k - 1) * dil + 1 - in, 0)`, `top = total / 2`,
//!   `bottom = total - top` (likewise left / right);
//! - `pad`: the `pad` attribute (an Int, or `(top, bottom, left, right)`), then as `valid`
//!   (a pool's padding is never inside a max or an average).
//!
//! `stride` and `dilation` (and the pools' `kernel_size` and `strides`) are an Int, a 2-tuple
//! `(h, w)` or a 4-tuple `(1, 1, h, w)`.

use crate::{Attr, Node, OpKind, ShapeDisplay};

/// A convolution or pooling node whose attributes or shapes give no valid geometry.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[error("{op} '{instance}': {reason}")]
pub struct GeometryError {
    /// The op.
    pub op: OpKind,
    /// The node's instance name (may be empty).
    pub instance: String,
    /// What is wrong.
    pub reason: String,
}

impl GeometryError {
    /// An error about `node`.
    pub fn new(node: &Node, reason: impl Into<String>) -> Self {
        GeometryError {
            op: node.op,
            instance: node.instance.clone(),
            reason: reason.into(),
        }
    }
}

/// A shape as MindSpore prints it: `(8, 16)`.
fn sh(s: &[usize]) -> ShapeDisplay<'_> {
    ShapeDisplay(s)
}

/// The geometry of one Conv2D (NCHW), also used by its two gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dGeometry {
    /// Batch size.
    pub n: usize,
    /// Input channels.
    pub c_in: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output channels.
    pub c_out: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Vertical stride.
    pub stride_h: usize,
    /// Horizontal stride.
    pub stride_w: usize,
    /// Vertical dilation.
    pub dil_h: usize,
    /// Horizontal dilation.
    pub dil_w: usize,
    /// Rows of zeros above.
    pub pad_top: usize,
    /// Rows of zeros below.
    pub pad_bottom: usize,
    /// Columns of zeros on the left.
    pub pad_left: usize,
    /// Columns of zeros on the right.
    pub pad_right: usize,
    /// Output height.
    pub out_h: usize,
    /// Output width.
    pub out_w: usize,
    /// Number of groups.
    pub group: usize,
}

impl Conv2dGeometry {
    /// The shape of the input, `(n, c_in, h, w)`.
    pub fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c_in, self.h, self.w]
    }

    /// The shape of the weight, `(c_out, c_in / group, kh, kw)`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.c_out, self.c_in / self.group.max(1), self.kh, self.kw]
    }

    /// The shape of the result, `(n, c_out, out_h, out_w)`.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.n, self.c_out, self.out_h, self.out_w]
    }
}

/// The geometry of one MaxPool / AvgPool (NCHW), also used by their gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dGeometry {
    /// Batch size.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// Input height.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Window height.
    pub kh: usize,
    /// Window width.
    pub kw: usize,
    /// Vertical stride.
    pub stride_h: usize,
    /// Horizontal stride.
    pub stride_w: usize,
    /// Rows of padding above.
    pub pad_top: usize,
    /// Rows of padding below.
    pub pad_bottom: usize,
    /// Columns of padding on the left.
    pub pad_left: usize,
    /// Columns of padding on the right.
    pub pad_right: usize,
    /// Output height.
    pub out_h: usize,
    /// Output width.
    pub out_w: usize,
}

impl Pool2dGeometry {
    /// The shape of the input, `(n, c, h, w)`.
    pub fn input_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }

    /// The shape of the result, `(n, c, out_h, out_w)`.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.out_h, self.out_w]
    }
}

/// How a convolution or pool pads its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    /// No padding.
    Valid,
    /// Pad so that `out = ceil(in / stride)`.
    Same,
    /// Explicit padding from the `pad` attribute.
    Pad,
}

/// Reads an Int / 2-tuple / 4-tuple `(1, 1, h, w)` attribute as `(h, w)`, both >= 1.
fn pair(node: &Node, key: &str, default: Option<usize>) -> Result<(usize, usize), GeometryError> {
    let Some(attr) = node.attrs.get(key) else {
        return default
            .map(|d| (d, d))
            .ok_or_else(|| GeometryError::new(node, format!("attribute `{key}` is missing")));
    };
    let bad = || {
        GeometryError::new(
            node,
            format!(
                "attribute `{key}` must be an integer, (h, w) or (1, 1, h, w), got {}",
                attr
            ),
        )
    };
    let v = attr.as_ints().ok_or_else(bad)?;
    let (h, w) = match v.as_slice() {
        [x] => (*x, *x),
        [h, w] => (*h, *w),
        [1, 1, h, w] => (*h, *w),
        _ => return Err(bad()),
    };
    if h < 1 || w < 1 {
        return Err(GeometryError::new(
            node,
            format!("attribute `{key}` must be positive, got {}", attr),
        ));
    }
    Ok((h as usize, w as usize))
}

/// The `pad_mode` attribute of a node (default `valid`).
pub fn pad_mode(node: &Node) -> Result<PadMode, GeometryError> {
    let s = match node.attrs.get("pad_mode") {
        None => "valid".to_string(),
        Some(Attr::Str(s)) => s.to_ascii_lowercase(),
        Some(other) => {
            return Err(GeometryError::new(
                node,
                format!("attribute `pad_mode` must be a word, got {}", other),
            ))
        }
    };
    match s.as_str() {
        "valid" => Ok(PadMode::Valid),
        "same" => Ok(PadMode::Same),
        "pad" => Ok(PadMode::Pad),
        _ => Err(GeometryError::new(
            node,
            format!("pad_mode `{s}` is not supported (expected valid, same or pad)"),
        )),
    }
}

/// One spatial dimension of a convolution or pool: `(pad_before, pad_after, out)` for an
/// input of size `input`, a window of `kernel` with `stride` and `dilation` (both >= 1), in
/// `mode` (`explicit` is the `pad` mode's `(before, after)`). `None` when the (dilated)
/// window is larger than the padded input, or `kernel` or `stride` is 0.
pub fn output_size(
    mode: PadMode,
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    explicit: (usize, usize),
) -> Option<(usize, usize, usize)> {
    if kernel == 0 || stride == 0 {
        return None;
    }
    let eff = (kernel - 1).saturating_mul(dilation).saturating_add(1);
    let (before, after) = match mode {
        PadMode::Valid => (0, 0),
        PadMode::Pad => explicit,
        PadMode::Same => {
            let out = input.div_ceil(stride);
            let total = ((out.max(1) - 1) * stride)
                .saturating_add(eff)
                .saturating_sub(input);
            (total / 2, total - total / 2)
        }
    };
    let padded = input.saturating_add(before).saturating_add(after);
    (padded >= eff).then(|| (before, after, (padded - eff) / stride + 1))
}

/// [`output_size`] with an error naming the node.
#[allow(clippy::too_many_arguments)]
fn dim(
    node: &Node,
    what: &str,
    mode: PadMode,
    input: usize,
    k: usize,
    stride: usize,
    dil: usize,
    explicit: (usize, usize),
) -> Result<(usize, usize, usize), GeometryError> {
    output_size(mode, input, k, stride, dil, explicit).ok_or_else(|| {
        let eff = (k.max(1) - 1).saturating_mul(dil).saturating_add(1);
        let padded = input.saturating_add(explicit.0).saturating_add(explicit.1);
        let padded = if mode == PadMode::Pad { padded } else { input };
        GeometryError::new(
            node,
            format!(
                "the {what} window ({eff} with dilation) is larger than the padded input ({padded})"
            ),
        )
    })
}

/// The output `(height, width)` of a Conv2D-like node with input shape `x` and weight shape
/// `w`: [`conv2d_geometry`]'s `(out_h, out_w)`.
pub fn conv2d_output_hw(
    node: &Node,
    x: &[usize],
    w: &[usize],
) -> Result<(usize, usize), GeometryError> {
    conv2d_geometry(node, x, w).map(|g| (g.out_h, g.out_w))
}

fn rank4(node: &Node, what: &str, shape: &[usize]) -> Result<[usize; 4], GeometryError> {
    <[usize; 4]>::try_from(shape).map_err(|_| {
        GeometryError::new(
            node,
            format!("{what} must have rank 4 (NCHW), got shape {}", sh(shape)),
        )
    })
}

fn check_format(node: &Node) -> Result<(), GeometryError> {
    match node.attrs.get("data_format") {
        None => Ok(()),
        Some(Attr::Str(f)) if f == "NCHW" => Ok(()),
        Some(other) => Err(GeometryError::new(
            node,
            format!("data_format `{}` is not supported (only NCHW)", other),
        )),
    }
}

/// The explicit `pad` attribute as `[top, bottom, left, right]` (an Int pads all four sides).
/// Both spatial dimensions of a convolution or pool (input, kernel, stride and dilation as
/// `(vertical, horizontal)`): `[(top, bottom, out_h), (left, right, out_w)]`.
fn spatial(
    node: &Node,
    input: (usize, usize),
    kernel: (usize, usize),
    stride: (usize, usize),
    dilation: (usize, usize),
) -> Result<[(usize, usize, usize); 2], GeometryError> {
    let (mode, pads) = padding(node)?;
    Ok([
        dim(
            node,
            "vertical",
            mode,
            input.0,
            kernel.0,
            stride.0,
            dilation.0,
            (pads[0], pads[1]),
        )?,
        dim(
            node,
            "horizontal",
            mode,
            input.1,
            kernel.1,
            stride.1,
            dilation.1,
            (pads[2], pads[3]),
        )?,
    ])
}

/// `pad_mode` and the explicit `pad` `(top, bottom, left, right)`, which must be zero unless
/// the mode is `pad`.
fn padding(node: &Node) -> Result<(PadMode, [usize; 4]), GeometryError> {
    let mode = pad_mode(node)?;
    let pads = explicit_pad(node)?;
    if mode != PadMode::Pad && pads.iter().any(|&p| p != 0) {
        return Err(GeometryError::new(
            node,
            format!(
                "a non-zero `pad` ({}, {}, {}, {}) needs pad_mode `pad`",
                pads[0], pads[1], pads[2], pads[3]
            ),
        ));
    }
    Ok((mode, pads))
}

fn explicit_pad(node: &Node) -> Result<[usize; 4], GeometryError> {
    let Some(a) = node.attrs.get("pad") else {
        return Ok([0; 4]);
    };
    let bad = || {
        GeometryError::new(
            node,
            format!(
                "attribute `pad` must be an integer >= 0 or (top, bottom, left, right), got {}",
                a
            ),
        )
    };
    let v = a.as_ints().ok_or_else(bad)?;
    let v: Vec<i64> = match v.as_slice() {
        [p] => vec![*p; 4],
        [_, _, _, _] => v,
        _ => return Err(bad()),
    };
    let mut out = [0usize; 4];
    for (o, &p) in out.iter_mut().zip(&v) {
        *o = usize::try_from(p).map_err(|_| bad())?;
    }
    Ok(out)
}

/// The geometry of a Conv2D-like node (`Conv2D`, `Conv2DBackpropInput`,
/// `Conv2DBackpropFilter`) with input shape `x` `(N, C, H, W)` and weight shape `w`
/// `(O, C / group, kh, kw)`.
///
/// Checks `data_format`, `group` (divides both channel counts), `out_channel` and
/// `kernel_size` (when present, against the weight), `stride`, `dilation`, `pad_mode` and
/// `pad` (non-zero only with `pad_mode: pad`), and that the window fits the padded input.
pub fn conv2d_geometry(
    node: &Node,
    x: &[usize],
    w: &[usize],
) -> Result<Conv2dGeometry, GeometryError> {
    check_format(node)?;
    let [n, c_in, h, wd] = rank4(node, "the input", x)?;
    let [c_out, c_per_group, kh, kw] = rank4(node, "the weight", w)?;
    let err = |m: String| GeometryError::new(node, m);
    if kh == 0 || kw == 0 {
        return Err(err(format!("the weight {} has an empty kernel", sh(w))));
    }
    let group = match node.attrs.get("group") {
        None => 1,
        Some(a) => a
            .as_int()
            .ok_or_else(|| err(format!("attribute `group` must be an integer, got {}", a)))?,
    };
    if group < 1 {
        return Err(err(format!(
            "attribute `group` must be positive, got {group}"
        )));
    }
    let group = group as usize;
    if c_per_group.checked_mul(group) != Some(c_in) {
        return Err(err(format!(
            "the input {} has {c_in} channels but the weight {} expects {c_per_group} x group {group} = {}",
            sh(x),
            sh(w),
            c_per_group as u128 * group as u128
        )));
    }
    if c_out % group != 0 {
        return Err(err(format!(
            "the weight's {c_out} output channels are not divisible by group {group}"
        )));
    }
    if let Some(a) = node.attrs.get("out_channel") {
        let oc = a.as_int().ok_or_else(|| {
            err(format!(
                "attribute `out_channel` must be an integer, got {}",
                a
            ))
        })?;
        if oc != c_out as i64 {
            return Err(err(format!(
                "attribute `out_channel` {oc} does not match the weight {} ({c_out} output channels)",
                sh(w)
            )));
        }
    }
    if node.attrs.get("kernel_size").is_some() {
        let (ah, aw) = pair(node, "kernel_size", None)?;
        if (ah, aw) != (kh, kw) {
            return Err(err(format!(
                "attribute `kernel_size` ({ah}, {aw}) does not match the weight {} (kernel {kh} x {kw})",
                sh(w)
            )));
        }
    }
    let (stride_h, stride_w) = pair(node, "stride", Some(1))?;
    let (dil_h, dil_w) = pair(node, "dilation", Some(1))?;
    let [(pad_top, pad_bottom, out_h), (pad_left, pad_right, out_w)] = spatial(
        node,
        (h, wd),
        (kh, kw),
        (stride_h, stride_w),
        (dil_h, dil_w),
    )?;
    Ok(Conv2dGeometry {
        n,
        c_in,
        h,
        w: wd,
        c_out,
        kh,
        kw,
        stride_h,
        stride_w,
        dil_h,
        dil_w,
        pad_top,
        pad_bottom,
        pad_left,
        pad_right,
        out_h,
        out_w,
        group,
    })
}

/// The geometry of a MaxPool / AvgPool node (and their gradients) with input shape `x`
/// `(N, C, H, W)`. `kernel_size` is required; `strides` defaults to 1; `pad_mode` is `valid`
/// (default), `same`, or `pad` with an explicit `pad` (which the partition writes for the
/// window of a rank's block of rows or columns). Padding is outside every window: a max never
/// sees it, an average does not count it.
pub fn pool2d_geometry(node: &Node, x: &[usize]) -> Result<Pool2dGeometry, GeometryError> {
    check_format(node)?;
    let [n, c, h, w] = rank4(node, "the input", x)?;
    let (kh, kw) = pair(node, "kernel_size", None)?;
    let (stride_h, stride_w) = pair(node, "strides", Some(1))?;
    let [(pad_top, pad_bottom, out_h), (pad_left, pad_right, out_w)] =
        spatial(node, (h, w), (kh, kw), (stride_h, stride_w), (1, 1))?;
    Ok(Pool2dGeometry {
        n,
        c,
        h,
        w,
        kh,
        kw,
        stride_h,
        stride_w,
        pad_top,
        pad_bottom,
        pad_left,
        pad_right,
        out_h,
        out_w,
    })
}

/// StridedSlice's mask attributes; shardc supports each only at 0.
pub const SLICE_MASKS: [&str; 5] = [
    "begin_mask",
    "end_mask",
    "ellipsis_mask",
    "new_axis_mask",
    "shrink_axis_mask",
];

/// Where a `StridedSlice` of `shape` with the constants `begin`, `end` and `steps` reads: per
/// dim `(first index, step, count)`, in Python's semantics (negative bounds count from the
/// end, bounds are clamped, dims past the constants are taken whole). Every backend's kernel
/// and `StridedSliceGrad` read the same elements through it.
///
/// Errors (the reason): constants of unequal lengths or longer than the rank, a step that is
/// not positive.
pub fn slice_spec(
    shape: &[usize],
    begin: &[i64],
    end: &[i64],
    steps: &[i64],
) -> Result<Vec<(usize, usize, usize)>, String> {
    if begin.len() != end.len() || end.len() != steps.len() || begin.len() > shape.len() {
        return Err(format!(
            "begin {begin:?}, end {end:?} and strides {steps:?} must have equal lengths of at most the rank {}",
            shape.len()
        ));
    }
    let mut spec = Vec::with_capacity(shape.len());
    for (d, &n) in shape.iter().enumerate() {
        if d >= begin.len() {
            spec.push((0, 1, n));
            continue;
        }
        let st = steps[d];
        if st <= 0 {
            return Err(format!("stride {st} of dim {d} is not positive"));
        }
        let ni = n as i64;
        let clamp = |v: i64| (if v < 0 { v + ni } else { v }).clamp(0, ni);
        let (b, e) = (clamp(begin[d]), clamp(end[d]));
        let count = if e > b { (e - b - 1) / st + 1 } else { 0 };
        spec.push((b as usize, st as usize, count as usize));
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: OpKind, attrs: &[(&str, Attr)]) -> Node {
        let mut n = Node::new(op, vec![]);
        for (k, v) in attrs {
            n.attrs.set(*k, v.clone());
        }
        n
    }

    #[test]
    fn conv_valid_same_pad() {
        let n = node(OpKind::Conv2D, &[]);
        let g = conv2d_geometry(&n, &[2, 3, 7, 9], &[4, 3, 3, 3]).unwrap();
        assert_eq!((g.out_h, g.out_w), (5, 7));
        assert_eq!(g.output_shape(), [2, 4, 5, 7]);
        let n = node(
            OpKind::Conv2D,
            &[
                ("pad_mode", Attr::Str("same".into())),
                ("stride", Attr::Int(2)),
            ],
        );
        let g = conv2d_geometry(&n, &[1, 3, 7, 8], &[4, 3, 3, 3]).unwrap();
        // out = ceil(7/2) = 4: total = 3*2 + 3 - 7 = 2; width: total = 6 + 3 - 8 = 1.
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (4, 1, 1));
        assert_eq!((g.out_w, g.pad_left, g.pad_right), (4, 0, 1));
        let n = node(
            OpKind::Conv2D,
            &[
                ("pad_mode", Attr::Str("pad".into())),
                ("pad", Attr::ints(&[1, 2, 0, 1])),
                ("stride", Attr::ints(&[1, 1, 2, 1])),
                ("dilation", Attr::ints(&[1, 2])),
            ],
        );
        let g = conv2d_geometry(&n, &[1, 3, 7, 8], &[4, 3, 3, 3]).unwrap();
        // h: (7 + 3 - 3) / 2 + 1 = 4; w: (8 + 1 - 5) / 1 + 1 = 5.
        assert_eq!((g.out_h, g.out_w), (4, 5));
        assert_eq!((g.stride_h, g.stride_w, g.dil_h, g.dil_w), (2, 1, 1, 2));
    }

    #[test]
    fn conv_same_with_dilation_and_group() {
        let n = node(
            OpKind::Conv2D,
            &[
                ("pad_mode", Attr::Str("SAME".into())),
                ("dilation", Attr::Int(2)),
                ("group", Attr::Int(2)),
            ],
        );
        let g = conv2d_geometry(&n, &[1, 4, 6, 6], &[6, 2, 3, 3]).unwrap();
        // eff = 5; out = 6; total = 5 + 5 - 6 = 4 -> 2 / 2.
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (6, 2, 2));
        assert_eq!(g.group, 2);
        assert_eq!(g.weight_shape(), [6, 2, 3, 3]);
    }

    #[test]
    fn conv_errors() {
        let n = node(OpKind::Conv2D, &[]);
        let e = conv2d_geometry(&n, &[1, 3, 2, 2], &[4, 3, 3, 3]).unwrap_err();
        assert!(e.reason.contains("larger than the padded input"), "{e}");
        let e = conv2d_geometry(&n, &[1, 4, 5, 5], &[4, 3, 3, 3]).unwrap_err();
        assert!(e.reason.contains("has 4 channels"), "{e}");
        let n = node(OpKind::Conv2D, &[("pad", Attr::Int(1))]);
        let e = conv2d_geometry(&n, &[1, 3, 5, 5], &[4, 3, 3, 3]).unwrap_err();
        assert!(e.reason.contains("needs pad_mode `pad`"), "{e}");
        let n = node(OpKind::Conv2D, &[("stride", Attr::ints(&[2, 2, 2]))]);
        assert!(conv2d_geometry(&n, &[1, 3, 5, 5], &[4, 3, 3, 3]).is_err());
        let n = node(OpKind::Conv2D, &[("kernel_size", Attr::Int(5))]);
        let e = conv2d_geometry(&n, &[1, 3, 5, 5], &[4, 3, 3, 3]).unwrap_err();
        assert!(e.reason.contains("kernel_size"), "{e}");
        let n = node(OpKind::Conv2D, &[("data_format", Attr::Str("NHWC".into()))]);
        assert!(conv2d_geometry(&n, &[1, 3, 5, 5], &[4, 3, 3, 3]).is_err());
    }

    #[test]
    fn pool_geometry() {
        let n = node(
            OpKind::MaxPool,
            &[("kernel_size", Attr::Int(2)), ("strides", Attr::Int(2))],
        );
        let g = pool2d_geometry(&n, &[2, 3, 7, 8]).unwrap();
        assert_eq!(g.output_shape(), [2, 3, 3, 4]);
        let n = node(
            OpKind::AvgPool,
            &[
                ("kernel_size", Attr::ints(&[1, 1, 3, 3])),
                ("strides", Attr::ints(&[1, 1, 2, 2])),
                ("pad_mode", Attr::Str("same".into())),
            ],
        );
        let g = pool2d_geometry(&n, &[1, 1, 7, 8]).unwrap();
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (4, 1, 1));
        assert_eq!((g.out_w, g.pad_left, g.pad_right), (4, 0, 1));
        let n = node(OpKind::MaxPool, &[]);
        let e = pool2d_geometry(&n, &[1, 1, 4, 4]).unwrap_err();
        assert!(e.reason.contains("`kernel_size` is missing"), "{e}");
        // Explicit padding (a rank's window of rows): outside every window.
        let n = node(
            OpKind::MaxPool,
            &[
                ("kernel_size", Attr::Int(2)),
                ("strides", Attr::Int(2)),
                ("pad_mode", Attr::Str("pad".into())),
                ("pad", Attr::ints(&[0, 1, 1, 0])),
            ],
        );
        let g = pool2d_geometry(&n, &[1, 1, 3, 3]).unwrap();
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (2, 0, 1));
        assert_eq!((g.out_w, g.pad_left, g.pad_right), (2, 1, 0));
        // A `pad` needs pad_mode `pad`.
        let n = node(
            OpKind::MaxPool,
            &[
                ("kernel_size", Attr::Int(2)),
                ("pad_mode", Attr::Str("same".into())),
                ("pad", Attr::ints(&[1, 1, 1, 1])),
            ],
        );
        let e = pool2d_geometry(&n, &[1, 1, 4, 4]).unwrap_err();
        assert!(e.reason.contains("needs pad_mode `pad`"), "{e}");
    }

    #[test]
    fn slice_counts_elements_without_overflow() {
        // Python's len(range(b, e, st)) per dim, also for steps near i64::MAX.
        let spec = slice_spec(&[10, 7, 5], &[1, -3, 0], &[10, 7, 5], &[3, i64::MAX, 2]).unwrap();
        assert_eq!(spec, vec![(1, 3, 3), (4, i64::MAX as usize, 1), (0, 2, 3)]);
        assert_eq!(slice_spec(&[4], &[3], &[1], &[1]).unwrap(), vec![(3, 1, 0)]);
    }
}
