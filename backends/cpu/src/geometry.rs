//! Convolution and pooling geometry: output sizes and padding from a node's attributes.
//!
//! These are the same rules as `shardc_passes::infer::geometry` (which was not available when
//! this crate was written, so they are implemented here): `pad_mode` is `valid`, `same` or
//! `pad` (case-insensitive);
//! - `valid`: no padding, `out = (in - ((k - 1) * dil + 1)) / stride + 1`;
//! - `same`: `out = ceil(in / stride)`, `total = max((out - 1) * stride + (k - 1) * dil + 1 - in, 0)`,
//!   `top = total / 2`, `bottom = total - top` (likewise left/right);
//! - `pad`: the `pad` attribute (Int, or `(top, bottom, left, right)`), then as `valid`.
//!
//! `stride` / `dilation` (and the pools' `kernel_size` / `strides`) are an Int, a 2-tuple
//! `(h, w)` or a 4-tuple `(1, 1, h, w)`.

use shardc_ir::{Attr, Node};

/// Why a node's convolution or pooling geometry is invalid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GeometryError(pub String);

impl From<String> for GeometryError {
    fn from(s: String) -> Self {
        GeometryError(s)
    }
}

/// The geometry of one Conv2D (NCHW).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// The geometry of one MaxPool / AvgPool (NCHW).
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

/// Reads an Int / 2-tuple / 4-tuple `(1, 1, h, w)` attribute as `(h, w)`.
fn pair(node: &Node, key: &str, default: usize) -> Result<(usize, usize), String> {
    let Some(attr) = node.attrs.get(key) else {
        return Ok((default, default));
    };
    let v = attr
        .as_ints()
        .ok_or_else(|| format!("attribute `{key}` must be an integer or a tuple, got {attr:?}"))?;
    let (h, w) = match v.as_slice() {
        [x] => (*x, *x),
        [h, w] => (*h, *w),
        [_, _, h, w] => (*h, *w),
        _ => {
            return Err(format!(
                "attribute `{key}` must have 1, 2 or 4 elements, got {v:?}"
            ))
        }
    };
    if h < 1 || w < 1 {
        return Err(format!("attribute `{key}` must be positive, got {v:?}"));
    }
    Ok((h as usize, w as usize))
}

/// The padding mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PadMode {
    Valid,
    Same,
    Pad,
}

fn pad_mode(node: &Node, allow_pad: bool) -> Result<PadMode, String> {
    let s = match node.attrs.get("pad_mode") {
        None => "valid".to_string(),
        Some(Attr::Str(s)) => s.to_ascii_lowercase(),
        Some(other) => {
            return Err(format!(
                "attribute `pad_mode` must be a word, got {other:?}"
            ))
        }
    };
    match s.as_str() {
        "valid" => Ok(PadMode::Valid),
        "same" => Ok(PadMode::Same),
        "pad" if allow_pad => Ok(PadMode::Pad),
        _ => Err(format!(
            "pad_mode `{s}` is not supported (expected valid, same{})",
            if allow_pad { " or pad" } else { "" }
        )),
    }
}

/// One spatial dimension: `(pad_before, pad_after, out)`.
fn dim(
    what: &str,
    mode: PadMode,
    input: usize,
    k: usize,
    stride: usize,
    dil: usize,
    explicit: (usize, usize),
) -> Result<(usize, usize, usize), String> {
    let eff = (k.max(1) - 1) * dil + 1;
    let (before, after) = match mode {
        PadMode::Valid => (0, 0),
        PadMode::Pad => explicit,
        PadMode::Same => {
            let out = input.div_ceil(stride);
            let total = ((out.max(1) - 1) * stride + eff).saturating_sub(input);
            (total / 2, total - total / 2)
        }
    };
    let padded = input + before + after;
    if padded < eff {
        return Err(format!(
            "the {what} window ({eff} with dilation) is larger than the padded input ({padded})"
        ));
    }
    Ok((before, after, (padded - eff) / stride + 1))
}

fn rank4(what: &str, shape: &[usize]) -> Result<[usize; 4], String> {
    <[usize; 4]>::try_from(shape)
        .map_err(|_| format!("{what} must have rank 4 (NCHW), got shape {shape:?}"))
}

fn check_format(node: &Node) -> Result<(), String> {
    match node.attrs.get("data_format").and_then(Attr::as_str) {
        None | Some("NCHW") => Ok(()),
        Some(f) => Err(format!("data_format `{f}` is not supported (only NCHW)")),
    }
}

/// The geometry of a Conv2D-like node (`Conv2D`, `Conv2DBackpropInput`,
/// `Conv2DBackpropFilter`) with input shape `x_shape` and weight shape `w_shape`.
pub fn conv2d_geometry(
    node: &Node,
    x_shape: &[usize],
    w_shape: &[usize],
) -> Result<Conv2dGeometry, String> {
    check_format(node)?;
    let [n, c_in, h, w] = rank4("the input", x_shape)?;
    let [c_out, c_per_group, kh, kw] = rank4("the weight", w_shape)?;
    let group = node.attrs.int_or("group", 1);
    if group < 1 {
        return Err(format!("group must be positive, got {group}"));
    }
    let group = group as usize;
    if c_per_group * group != c_in {
        return Err(format!(
            "input channels {c_in} != weight channels {c_per_group} x group {group}"
        ));
    }
    if c_out % group != 0 {
        return Err(format!(
            "output channels {c_out} are not divisible by group {group}"
        ));
    }
    if let Some(oc) = node.attrs.get("out_channel").and_then(Attr::as_int) {
        if oc as usize != c_out {
            return Err(format!(
                "out_channel {oc} != the weight's {c_out} output channels"
            ));
        }
    }
    let (stride_h, stride_w) = pair(node, "stride", 1)?;
    let (dil_h, dil_w) = pair(node, "dilation", 1)?;
    let mode = pad_mode(node, true)?;
    let pads = match node.attrs.get("pad") {
        None => [0usize; 4],
        Some(a) => {
            let v = a.as_ints().ok_or_else(|| {
                format!("attribute `pad` must be an integer or a 4-tuple, got {a:?}")
            })?;
            let v: Vec<i64> = match v.as_slice() {
                [p] => vec![*p; 4],
                [_, _, _, _] => v,
                _ => {
                    return Err(format!(
                        "attribute `pad` must have 1 or 4 elements, got {v:?}"
                    ))
                }
            };
            if v.iter().any(|&p| p < 0) {
                return Err(format!("attribute `pad` must not be negative, got {v:?}"));
            }
            [v[0] as usize, v[1] as usize, v[2] as usize, v[3] as usize]
        }
    };
    if mode != PadMode::Pad && pads.iter().any(|&p| p != 0) {
        return Err(format!("a non-zero `pad` {pads:?} needs pad_mode `pad`"));
    }
    let (pad_top, pad_bottom, out_h) =
        dim("vertical", mode, h, kh, stride_h, dil_h, (pads[0], pads[1]))?;
    let (pad_left, pad_right, out_w) = dim(
        "horizontal",
        mode,
        w,
        kw,
        stride_w,
        dil_w,
        (pads[2], pads[3]),
    )?;
    Ok(Conv2dGeometry {
        n,
        c_in,
        h,
        w,
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

/// The geometry of a MaxPool / AvgPool node (and their gradients) with input `x_shape`.
pub fn pool2d_geometry(node: &Node, x_shape: &[usize]) -> Result<Pool2dGeometry, GeometryError> {
    pool2d_geometry_inner(node, x_shape).map_err(GeometryError)
}

fn pool2d_geometry_inner(node: &Node, x_shape: &[usize]) -> Result<Pool2dGeometry, String> {
    check_format(node)?;
    let [n, c, h, w] = rank4("the input", x_shape)?;
    if node.attrs.get("kernel_size").is_none() {
        return Err("attribute `kernel_size` is missing".into());
    }
    let (kh, kw) = pair(node, "kernel_size", 1)?;
    let (stride_h, stride_w) = pair(node, "strides", 1)?;
    let mode = pad_mode(node, false)?;
    let (pad_top, pad_bottom, out_h) = dim("vertical", mode, h, kh, stride_h, 1, (0, 0))?;
    let (pad_left, pad_right, out_w) = dim("horizontal", mode, w, kw, stride_w, 1, (0, 0))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::OpKind;

    fn conv(attrs: &[(&str, Attr)]) -> Node {
        let mut n = Node::new(OpKind::Conv2D, vec![]);
        for (k, v) in attrs {
            n.attrs.set(*k, v.clone());
        }
        n
    }

    #[test]
    fn valid_same_pad() {
        let n = conv(&[]);
        let g = conv2d_geometry(&n, &[2, 3, 7, 9], &[4, 3, 3, 3]).unwrap();
        assert_eq!((g.out_h, g.out_w), (5, 7));
        let n = conv(&[
            ("pad_mode", Attr::Str("same".into())),
            ("stride", Attr::Int(2)),
        ]);
        let g = conv2d_geometry(&n, &[1, 3, 7, 8], &[4, 3, 3, 3]).unwrap();
        // out = ceil(7/2) = 4: total = 3*2 + 3 - 7 = 2; out_w = 4: total = 6 + 3 - 8 = 1.
        assert_eq!((g.out_h, g.pad_top, g.pad_bottom), (4, 1, 1));
        assert_eq!((g.out_w, g.pad_left, g.pad_right), (4, 0, 1));
        let n = conv(&[
            ("pad_mode", Attr::Str("pad".into())),
            ("pad", Attr::ints(&[1, 2, 0, 1])),
            ("stride", Attr::ints(&[1, 1, 2, 1])),
            ("dilation", Attr::ints(&[1, 2])),
        ]);
        let g = conv2d_geometry(&n, &[1, 3, 7, 8], &[4, 3, 3, 3]).unwrap();
        // h: (7 + 3 - 3) / 2 + 1 = 4; w: (8 + 1 - 5) / 1 + 1 = 5.
        assert_eq!((g.out_h, g.out_w), (4, 5));
        assert!(conv2d_geometry(&conv(&[]), &[1, 3, 2, 2], &[4, 3, 3, 3]).is_err());
        assert!(conv2d_geometry(&conv(&[]), &[1, 4, 5, 5], &[4, 3, 3, 3]).is_err());
    }
}
