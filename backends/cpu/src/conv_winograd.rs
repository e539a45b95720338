//! Winograd F(2×2, 3×3) for 3×3 convolutions with stride 1, dilation 1, one group and `same`
//! padding of one pixel on every side: the convolution and both of its gradients.
//!
//! The output is cut into 2×2 tiles; tile `t` reads the 4×4 input patch `d_t` (zero outside
//! the image). With `U = G g Gᵀ` (one 4×4 matrix per filter tap pair `(o, c)`) and
//! `V_t = Bᵀ d_t B`, a tile of the output is `Aᵀ [Σ_c U ⊙ V_t] A`: for each of the 16
//! positions `ξ` of the 4×4 matrices, one GEMM `M_ξ (O × T) = U_ξ (O × C) · V_ξ (C × T)` over
//! the `T` tiles of a block of images, 2.25 times fewer multiplications than im2col.
//!
//! The gradients run the chain rule through the same transforms: with `dM_t = A dY_t Aᵀ`,
//! the input gradient is `dV_ξ = U_ξᵀ · dM_ξ` followed by `B dV_t Bᵀ` added into the input's
//! (overlapping) patches, and the filter gradient is `dU_ξ = Σ_blocks dM_ξ · V_ξᵀ` followed by
//! `Gᵀ dU G`.
//!
//! Tiles of a block of `b` images are ordered `(tile row, image, tile column)`, so that one
//! tile row of every image of the block is one run of `b · tw` tiles. Every transform takes
//! all images of one channel at once and runs over whole runs (vector loops that stay long
//! on planes of a few tiles, ResNet's 8×8 and 4×4 stages); only moving pixels between the
//! planes and the tiles goes image by image. The GEMMs do not care about the order. The
//! output-side transforms write a channel's planes of all images together (channel-major),
//! and a copy puts them in the images' order, except for one-image blocks, whose planes
//! already are in that order.
//!
//! Layouts: a transform writes `[channel][ξ][tile]` (the GEMM operands `V_ξ`, `M_ξ` are
//! matrices with rows `16 · T` apart); a GEMM writes `[ξ][channel][tile]` (`M` of the forward
//! pass, `dV` of the input gradient), so that the 16 products own disjoint slices and run in
//! parallel, each on one thread; `U` and `dU` are `[ξ][o][c]`. Blocks of images depend on
//! the shapes only, the transforms of distinct planes are independent, and sums over blocks
//! run in block order, so results do not depend on the thread count.

use crate::matmul::{gemm_checked, Dst, Src};
use crate::real::Real;
use crate::util::{give_vec, take_vec, Ctx, KResult};
use rayon::prelude::*;
use shardc_ir::geometry::Conv2dGeometry;

/// Tiles a block of images aims for (the GEMMs' `T`).
const BLOCK_TILES: usize = 256;
/// Most elements of one block's transformed-input (or transformed-output) buffer.
const BLOCK_ELEMS: usize = 1 << 22;
/// Fewest input channels for which the Winograd path beats im2col (a GEMM contraction of a
/// handful of channels wastes the transforms).
const MIN_CHANNELS: usize = 8;

/// Whether the convolution `g` runs through Winograd F(2×2, 3×3).
pub(crate) fn applies(g: &Conv2dGeometry) -> bool {
    g.kh == 3
        && g.kw == 3
        && g.stride_h == 1
        && g.stride_w == 1
        && g.dil_h == 1
        && g.dil_w == 1
        && g.pad_top == 1
        && g.pad_left == 1
        && g.out_h == g.h
        && g.out_w == g.w
        && g.group == 1
        && g.c_in >= MIN_CHANNELS
        && g.c_out >= 1
        && g.h >= 1
        && g.w >= 1
        && g.n >= 1
}

/// Tile counts and block sizes of one convolution.
#[derive(Clone, Copy, Debug)]
struct Tiles {
    /// Tile rows per image.
    th: usize,
    /// Tile columns per image.
    tw: usize,
    /// Tiles per image.
    per_image: usize,
    /// Images per block.
    b: usize,
}

impl Tiles {
    fn new(g: &Conv2dGeometry) -> Self {
        let (th, tw) = (g.h.div_ceil(2), g.w.div_ceil(2));
        let per_image = th * tw;
        let by_tiles = BLOCK_TILES.div_ceil(per_image);
        let by_mem = BLOCK_ELEMS / (16 * g.c_in.max(g.c_out) * per_image).max(1);
        let b = by_tiles.min(by_mem).clamp(1, g.n);
        Tiles {
            th,
            tw,
            per_image,
            b,
        }
    }

    /// Tiles of a block of `b` images.
    fn cols(&self, b: usize) -> usize {
        b * self.per_image
    }
}

/// Runs `f(index, chunk, scratch)` over the `chunk`-element chunks of `data`, on rayon when
/// `parallel`.
fn for_planes<T: Real, F>(parallel: bool, data: &mut [T], chunk: usize, f: F)
where
    F: Fn(usize, &mut [T], &mut Vec<T>) + Sync + Send,
{
    if parallel {
        data.par_chunks_mut(chunk)
            .enumerate()
            .for_each_init(Vec::new, |s, (i, c)| f(i, c, s));
    } else {
        let mut s = Vec::new();
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c, &mut s);
        }
    }
}

/// Runs `f(ξ, dst_ξ)` for the 16 taps, each on its own `len`-element slice of `dst`: on
/// rayon when `parallel` (16 independent serial products keep both threads busy, where one
/// product split across threads at a time synchronises 16 times per block), else in order.
fn for_taps<T: Real, F>(parallel: bool, dst: &mut [T], len: usize, f: F) -> KResult
where
    F: Fn(usize, &mut [T]) -> KResult + Sync + Send,
{
    let taps = &mut dst[..16 * len];
    if parallel {
        taps.par_chunks_mut(len)
            .enumerate()
            .try_for_each(|(xi, d)| f(xi, d))
    } else {
        taps.chunks_mut(len)
            .enumerate()
            .try_for_each(|(xi, d)| f(xi, d))
    }
}

/// Filters the weight transforms handle at once (transposed to tap-major on the stack, so
/// that every step is a loop over filters).
const FILTER_CHUNK: usize = 64;

/// Filters per parallel part of the weight transforms.
const FILTER_PART: usize = 4 * FILTER_CHUNK;

/// `U = G g Gᵀ` of every filter `(o, c)` into `u` `[ξ][o][c]`, in parts of
/// [`FILTER_PART`] filters on rayon when `parallel`.
fn weight_transform<T: Real>(parallel: bool, g: &Conv2dGeometry, w: &[T], u: &mut [T]) {
    let oc = g.c_out * g.c_in;
    if oc == 0 {
        return;
    }
    // Part p's 16 rows: u[ξ * oc + p * FILTER_PART..][..len].
    let mut parts: Vec<Vec<&mut [T]>> = (0..oc.div_ceil(FILTER_PART))
        .map(|_| Vec::with_capacity(16))
        .collect();
    for row in u[..16 * oc].chunks_mut(oc) {
        for (p, piece) in row.chunks_mut(FILTER_PART).enumerate() {
            parts[p].push(piece);
        }
    }
    let run = |(p, rows): (usize, Vec<&mut [T]>)| {
        let n = rows[0].len();
        weight_transform_part(&w[p * FILTER_PART * 9..][..n * 9], rows);
    };
    if parallel && parts.len() > 1 {
        parts.into_par_iter().enumerate().for_each(run);
    } else {
        parts.into_iter().enumerate().for_each(run);
    }
}

/// `U = G g Gᵀ` of the filters `w` (`n × 9`) into the 16 rows `u[ξ]` (`n` each).
fn weight_transform_part<T: Real>(w: &[T], mut u: Vec<&mut [T]>) {
    let oc = u[0].len();
    let half = T::from_f64(0.5);
    let mut taps = [[T::ZERO; FILTER_CHUNK]; 9];
    // Rows of W = G g (4 × 3), row-major.
    let mut r = [[T::ZERO; FILTER_CHUNK]; 12];
    for i0 in (0..oc).step_by(FILTER_CHUNK) {
        let n = FILTER_CHUNK.min(oc - i0);
        for (j, f) in w[i0 * 9..(i0 + n) * 9].chunks_exact(9).enumerate() {
            for (tap, &v) in f.iter().enumerate() {
                taps[tap][j] = v;
            }
        }
        for b in 0..3 {
            for j in 0..n {
                let (g0, g1, g2) = (taps[b][j], taps[3 + b][j], taps[6 + b][j]);
                r[b][j] = g0;
                r[3 + b][j] = half * (g0 + g1 + g2);
                r[6 + b][j] = half * (g0 - g1 + g2);
                r[9 + b][j] = g2;
            }
        }
        for k in 0..4 {
            let (a, b, c) = (&r[3 * k][..n], &r[3 * k + 1][..n], &r[3 * k + 2][..n]);
            let [u0, u1, u2, u3] = four_mut(&mut u[4 * k..4 * k + 4], i0..i0 + n);
            u0.copy_from_slice(a);
            map3(u1, a, b, c, |a, b, c| half * (a + b + c));
            map3(u2, a, b, c, |a, b, c| half * (a - b + c));
            u3.copy_from_slice(c);
        }
    }
}

/// `dg = Gᵀ dU G` of every filter `(o, c)` from `du` `[ξ][o][c]` into `dw` `(O, C, 3, 3)`, in
/// parts of [`FILTER_PART`] filters on rayon when `parallel`.
fn filter_output_transform<T: Real>(parallel: bool, g: &Conv2dGeometry, du: &[T], dw: &mut [T]) {
    let oc = g.c_out * g.c_in;
    let run =
        |(p, dst): (usize, &mut [T])| filter_output_transform_part(du, oc, p * FILTER_PART, dst);
    let dw = &mut dw[..oc * 9];
    if parallel && oc > FILTER_PART {
        dw.par_chunks_mut(FILTER_PART * 9).enumerate().for_each(run);
    } else {
        dw.chunks_mut(FILTER_PART * 9).enumerate().for_each(run);
    }
}

/// [`filter_output_transform`] of filters `f0..f0 + dw.len() / 9` of the `oc` in `du`.
fn filter_output_transform_part<T: Real>(du: &[T], oc: usize, f0: usize, dw: &mut [T]) {
    let half = T::from_f64(0.5);
    // Rows of R = Gᵀ dU (3 × 4), row-major.
    let mut r = [[T::ZERO; FILTER_CHUNK]; 12];
    let mut taps = [[T::ZERO; FILTER_CHUNK]; 9];
    let len = dw.len() / 9;
    for i0 in (0..len).step_by(FILTER_CHUNK) {
        let n = FILTER_CHUNK.min(len - i0);
        let u = |xi: usize| &du[xi * oc + f0 + i0..][..n];
        for l in 0..4 {
            let (u0, u1, u2, u3) = (u(l), u(4 + l), u(8 + l), u(12 + l));
            for j in 0..n {
                let (a, b, c, d) = (u0[j], u1[j], u2[j], u3[j]);
                r[l][j] = a + half * (b + c);
                r[4 + l][j] = half * (b - c);
                r[8 + l][j] = half * (b + c) + d;
            }
        }
        for a in 0..3 {
            for j in 0..n {
                let (r0, r1, r2, r3) = (
                    r[4 * a][j],
                    r[4 * a + 1][j],
                    r[4 * a + 2][j],
                    r[4 * a + 3][j],
                );
                taps[3 * a][j] = r0 + half * (r1 + r2);
                taps[3 * a + 1][j] = half * (r1 - r2);
                taps[3 * a + 2][j] = half * (r1 + r2) + r3;
            }
        }
        for (j, f) in dw[i0 * 9..(i0 + n) * 9].chunks_exact_mut(9).enumerate() {
            for (tap, v) in f.iter_mut().enumerate() {
                *v = taps[tap][j];
            }
        }
    }
}

/// Splits `s` (resized to `parts * len` elements) into `parts` slices of `len`.
fn split_scratch<T: Real, const PARTS: usize>(s: &mut Vec<T>, len: usize) -> [&mut [T]; PARTS] {
    s.clear();
    s.resize(PARTS * len, T::ZERO);
    let mut it = s.chunks_exact_mut(len.max(1));
    std::array::from_fn(|_| it.next().unwrap_or_default())
}

/// The 16 rows `dst[ξ * ld + base..][..n]` of a transformed block (shorter at its end).
fn rows_mut<T: Real>(dst: &mut [T], ld: usize, base: usize, n: usize) -> [&mut [T]; 16] {
    let mut it = dst.chunks_mut(ld);
    std::array::from_fn(|_| {
        let r = it.next().unwrap_or_default();
        let hi = r.len().min(base + n);
        &mut r[base.min(hi)..hi]
    })
}

/// The 16 rows `src[ξ * ld + base..][..n]` of a transformed block.
fn rows<T: Real>(src: &[T], ld: usize, base: usize, n: usize) -> [&[T]; 16] {
    let mut it = src.chunks(ld);
    std::array::from_fn(|_| {
        let r = it.next().unwrap_or_default();
        let hi = r.len().min(base + n);
        &r[base.min(hi)..hi]
    })
}

/// `o[j] = f(a[j], b[j])` over the common length.
#[inline(always)]
fn map2<T: Real>(o: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((o, &a), &b) in o.iter_mut().zip(a).zip(b) {
        *o = f(a, b);
    }
}

/// `o[j] = f(a[j], b[j], c[j])` over the common length.
#[inline(always)]
fn map3<T: Real>(o: &mut [T], a: &[T], b: &[T], c: &[T], f: impl Fn(T, T, T) -> T) {
    for (((o, &a), &b), &c) in o.iter_mut().zip(a).zip(b).zip(c) {
        *o = f(a, b, c);
    }
}

/// `range` of each of the four slices `rows`.
fn four_mut<'s, T>(rows: &'s mut [&mut [T]], range: std::ops::Range<usize>) -> [&'s mut [T]; 4] {
    let mut it = rows.iter_mut();
    std::array::from_fn(|_| it.next().map_or(&mut [][..], |r| &mut r[range.clone()]))
}

/// `V_t = Bᵀ d_t B` of every tile of the same channel of `b` images (`planes` holds image
/// `img`'s plane `(h, w)` at `img * plane_stride`): element `ξ` of tile `(ti, img, tj)` goes
/// to `dst[ξ * ld + (ti * b + img) * tw + tj]`, so that a tile row of all `b` images is one
/// run (long vector loops even for planes of a few tiles). `s` is scratch.
#[allow(clippy::too_many_arguments)]
fn input_transform<T: Real>(
    g: &Conv2dGeometry,
    t: &Tiles,
    b: usize,
    planes: &[T],
    plane_stride: usize,
    dst: &mut [T],
    ld: usize,
    s: &mut Vec<T>,
) {
    let (h, w, tw) = (g.h, g.w, t.tw);
    let run = b * tw;
    // col[4 r + k]: column combination k of input row r of the tile row, for every image.
    s.clear();
    s.resize(16 * run + 2 * tw + 2, T::ZERO);
    let (cols, prow) = s.split_at_mut(16 * run);
    let mut it = cols.chunks_exact_mut(run.max(1));
    let mut col: [&mut [T]; 16] = std::array::from_fn(|_| it.next().unwrap_or_default());
    let out = rows_mut(dst, ld, 0, t.th * run);
    for ti in 0..t.th {
        for img in 0..b {
            let plane = &planes[img * plane_stride..][..h * w];
            for r in 0..4 {
                let ih = (2 * ti + r) as isize - 1;
                let o = img * tw;
                if ih < 0 || ih as usize >= h {
                    for k in 0..4 {
                        col[4 * r + k][o..o + tw].fill(T::ZERO);
                    }
                    continue;
                }
                // Padded row: column q of the image at q + 1, zeros around.
                prow[0] = T::ZERO;
                prow[1..=w].copy_from_slice(&plane[ih as usize * w..][..w]);
                prow[w + 1..].fill(T::ZERO);
                let [k0, k1, k2, k3] = four_mut(&mut col[4 * r..4 * r + 4], o..o + tw);
                // With a, b, c, d the padded columns 2j .. 2j+3: a - c, b + c, c - b, b - d.
                for (j, q) in prow.windows(4).step_by(2).take(tw).enumerate() {
                    let (a, b, c, d) = (q[0], q[1], q[2], q[3]);
                    k0[j] = a - c;
                    k1[j] = b + c;
                    k2[j] = c - b;
                    k3[j] = b - d;
                }
            }
        }
        // Rows of Bᵀ (.): r0 - r2, r1 + r2, r2 - r1, r1 - r3, over the whole run.
        let at = ti * run;
        for k in 0..4 {
            let (r0, r1, r2, r3) = (&*col[k], &*col[4 + k], &*col[8 + k], &*col[12 + k]);
            map2(&mut out[k][at..at + run], r0, r2, |a, b| a - b);
            map2(&mut out[4 + k][at..at + run], r1, r2, |a, b| a + b);
            map2(&mut out[8 + k][at..at + run], r2, r1, |a, b| a - b);
            map2(&mut out[12 + k][at..at + run], r1, r3, |a, b| a - b);
        }
    }
}

/// `dM_t = A dY_t Aᵀ` of every tile of the same channel of `b` output-gradient planes
/// (`planes` holds image `img`'s at `img * plane_stride`; zero outside the image), in the
/// tile order of [`input_transform`]. `s` is scratch.
#[allow(clippy::too_many_arguments)]
fn output_grad_transform<T: Real>(
    g: &Conv2dGeometry,
    t: &Tiles,
    b: usize,
    planes: &[T],
    plane_stride: usize,
    dst: &mut [T],
    ld: usize,
    s: &mut Vec<T>,
) {
    let (h, w, tw) = (g.h, g.w, t.tw);
    let run = b * tw;
    s.clear();
    s.resize(8 * run + 2 * tw, T::ZERO);
    let (cols, prow) = s.split_at_mut(8 * run);
    let mut it = cols.chunks_exact_mut(run.max(1));
    let mut col: [&mut [T]; 8] = std::array::from_fn(|_| it.next().unwrap_or_default());
    let out = rows_mut(dst, ld, 0, t.th * run);
    for ti in 0..t.th {
        for img in 0..b {
            let plane = &planes[img * plane_stride..][..h * w];
            for r in 0..2 {
                let ih = 2 * ti + r;
                let o = img * tw;
                if ih >= h {
                    for k in 0..4 {
                        col[4 * r + k][o..o + tw].fill(T::ZERO);
                    }
                    continue;
                }
                prow[..w].copy_from_slice(&plane[ih * w..][..w]);
                prow[w..].fill(T::ZERO);
                let [k0, k1, k2, k3] = four_mut(&mut col[4 * r..4 * r + 4], o..o + tw);
                // Columns of (.) Aᵀ, with a, b the columns 2j, 2j + 1: a, a + b, a - b, -b.
                for (j, q) in prow.chunks_exact(2).take(tw).enumerate() {
                    let (a, b) = (q[0], q[1]);
                    k0[j] = a;
                    k1[j] = a + b;
                    k2[j] = a - b;
                    k3[j] = -b;
                }
            }
        }
        // Rows of A (.): g0, g0 + g1, g0 - g1, -g1, over the whole run.
        let at = ti * run;
        for k in 0..4 {
            let (g0, g1) = (&*col[k], &*col[4 + k]);
            out[k][at..at + run].copy_from_slice(g0);
            map2(&mut out[4 + k][at..at + run], g0, g1, |a, b| a + b);
            map2(&mut out[8 + k][at..at + run], g0, g1, |a, b| a - b);
            map2(&mut out[12 + k][at..at + run], g0, g1, |_, b| -b);
        }
    }
}

/// `Y_t = Aᵀ M_t A` of every tile of one output channel of `b` images, from
/// `src[ξ * ld + t]` in the tile order of [`input_transform`], into the channel's `b` output
/// planes `(h, w)`, one after another in `out`. Everything but the final placement of the
/// pixels runs over the whole tile row of all images at once. `s` is scratch.
fn output_transform<T: Real>(
    g: &Conv2dGeometry,
    t: &Tiles,
    b: usize,
    src: &[T],
    ld: usize,
    out: &mut [T],
    s: &mut Vec<T>,
) {
    let (h, w, tw) = (g.h, g.w, t.tw);
    let run = b * tw;
    let [s00, s01, s02, s03, s10, s11, s12, s13, y00, y01, y10, y11] =
        split_scratch::<T, 12>(s, run);
    let all = rows(src, ld, 0, t.th * run);
    for ti in 0..t.th {
        let m = all.map(|r| &r[ti * run..][..run]);
        // Rows of Aᵀ M: m0 + m1 + m2 and m1 - m2 - m3, for each column l.
        for (l, (a, b)) in [
            (&mut *s00, &mut *s10),
            (&mut *s01, &mut *s11),
            (&mut *s02, &mut *s12),
            (&mut *s03, &mut *s13),
        ]
        .into_iter()
        .enumerate()
        {
            map3(a, m[l], m[4 + l], m[8 + l], |x, y, z| x + y + z);
            map3(b, m[4 + l], m[8 + l], m[12 + l], |x, y, z| x - y - z);
        }
        map3(y00, s00, s01, s02, |a, b, c| a + b + c);
        map3(y01, s01, s02, s03, |a, b, c| a - b - c);
        map3(y10, s10, s11, s12, |a, b, c| a + b + c);
        map3(y11, s11, s12, s13, |a, b, c| a - b - c);
        let r0 = 2 * ti;
        for (img, plane) in out.chunks_exact_mut(h * w).take(b).enumerate() {
            let at = img * tw;
            for (r, (e, o)) in [(r0, (&*y00, &*y01)), (r0 + 1, (&*y10, &*y11))] {
                if r >= h {
                    continue;
                }
                let (e, o) = (&e[at..at + tw], &o[at..at + tw]);
                let row = &mut plane[r * w..][..w];
                let full = w / 2;
                for ((pair, &e), &o) in row.chunks_exact_mut(2).zip(&e[..full]).zip(&o[..full]) {
                    pair[0] = e;
                    pair[1] = o;
                }
                if w % 2 == 1 {
                    row[w - 1] = e[full];
                }
            }
        }
    }
}

/// `o[j] += f(a[j], b[j], c[j])` over the common length.
#[inline(always)]
fn acc3<T: Real>(o: &mut [T], a: &[T], b: &[T], c: &[T], f: impl Fn(T, T, T) -> T) {
    for (((o, &a), &b), &c) in o.iter_mut().zip(a).zip(b).zip(c) {
        *o += f(a, b, c);
    }
}

/// `B dV_t Bᵀ` of every tile of one input channel of `b` images, from `src[ξ * ld + t]` in
/// the tile order of [`input_transform`], summed over the overlapping patches into the
/// channel's `b` input-gradient planes `(h, w)`, one after another in `out` (overwritten).
/// The rows of `B dV` are combined over the whole tile row of all images at once; the columns
/// are combined while summing into each image's patches. `s` is scratch.
fn input_grad_transform<T: Real>(
    g: &Conv2dGeometry,
    t: &Tiles,
    b: usize,
    src: &[T],
    ld: usize,
    out: &mut [T],
    s: &mut Vec<T>,
) {
    let (h, w, tw) = (g.h, g.w, t.tw);
    let run = b * tw;
    let n2 = tw + 1;
    let ph = 2 * t.th + 2;
    let pad = ph * n2;
    // Per image, its padded plane (row p, column q holds input (p - 1, q - 1)) as even and
    // odd columns: even[p][j] is column 2j, odd[p][j] column 2j + 1.
    s.clear();
    s.resize(2 * b * pad + 16 * run, T::ZERO);
    let (even, rest) = s.split_at_mut(b * pad);
    let (odd, rest) = rest.split_at_mut(b * pad);
    let mut it = rest.chunks_exact_mut(run.max(1));
    let e: [&mut [T]; 16] = std::array::from_fn(|_| it.next().unwrap_or_default());
    let all = rows(src, ld, 0, t.th * run);
    for ti in 0..t.th {
        let m = all.map(|r| &r[ti * run..][..run]);
        // Rows of B dV: v0, v1 - v2 + v3, v1 + v2 - v0, -v3 (kept positive: signs below).
        for l in 0..4 {
            let (v0, v1, v2, v3) = (m[l], m[4 + l], m[8 + l], m[12 + l]);
            e[l].copy_from_slice(v0);
            map3(e[4 + l], v1, v2, v3, |b, c, d| b - c + d);
            map3(e[8 + l], v1, v2, v0, |b, c, a| b + c - a);
            e[12 + l].copy_from_slice(v3);
        }
        for i in 0..4 {
            let neg = i == 3;
            let p = 2 * ti + i;
            for img in 0..b {
                let at = img * tw;
                let [r0, r1, r2, r3] = [0, 1, 2, 3].map(|k| &e[4 * i + k][at..at + tw]);
                let ev = &mut even[img * pad + p * n2..][..n2];
                let od = &mut odd[img * pad + p * n2..][..n2];
                // Columns: dd0 = r0, dd1 = r1 - r2 + r3, dd2 = r1 + r2 - r0, dd3 = -r3 (all
                // negated for row 3), added at padded columns 2j, 2j + 1, 2j + 2, 2j + 3.
                if neg {
                    acc3(&mut ev[..tw], r0, r0, r0, |a, _, _| -a);
                    acc3(&mut od[..tw], r1, r2, r3, |b, c, d| c - b - d);
                    acc3(&mut ev[1..], r1, r2, r0, |b, c, a| a - b - c);
                    acc3(&mut od[1..], r3, r3, r3, |d, _, _| d);
                } else {
                    acc3(&mut ev[..tw], r0, r0, r0, |a, _, _| a);
                    acc3(&mut od[..tw], r1, r2, r3, |b, c, d| b - c + d);
                    acc3(&mut ev[1..], r1, r2, r0, |b, c, a| b + c - a);
                    acc3(&mut od[1..], r3, r3, r3, |d, _, _| -d);
                }
            }
        }
    }
    // Input column 2j is padded column 2j + 1 (odd[j]); input column 2j + 1 is even[j + 1].
    for (img, plane) in out.chunks_exact_mut(h * w).take(b).enumerate() {
        for (ih, row) in plane.chunks_exact_mut(w).enumerate() {
            let ev = &even[img * pad + (ih + 1) * n2..][..n2];
            let od = &odd[img * pad + (ih + 1) * n2..][..n2];
            let full = w / 2;
            for ((pair, &o), &e) in row.chunks_exact_mut(2).zip(&od[..full]).zip(&ev[1..]) {
                pair[0] = o;
                pair[1] = e;
            }
            if w % 2 == 1 {
                row[w - 1] = od[full];
            }
        }
    }
}

/// Runs `f(channel, planes, scratch)` for every channel of a block of `b` images, `planes`
/// being that channel's `b` planes of `hw` one after another, and leaves the planes in `dst`
/// in image order (`[image][channel][plane]`): through a channel-major buffer and one copy,
/// except for one-image blocks, whose planes already are in that order.
fn per_channel_planes<T: Real, F>(
    parallel: bool,
    dst: &mut [T],
    (b, channels, hw): (usize, usize, usize),
    f: F,
) where
    F: Fn(usize, &mut [T], &mut Vec<T>) + Sync + Send,
{
    if b == 1 {
        for_planes(parallel, dst, hw, f);
        return;
    }
    let len = channels * b * hw;
    let mut by_channel = take_vec::<T>(len);
    for_planes(parallel, &mut by_channel[..len], b * hw, f);
    let src = &by_channel[..];
    for_planes(parallel, dst, channels * hw, |img, d, _| {
        for (c, plane) in d.chunks_exact_mut(hw).enumerate() {
            plane.copy_from_slice(&src[(c * b + img) * hw..][..hw]);
        }
    });
    give_vec(by_channel);
}

/// `Conv2D(x, w)` into `y`, for a convolution [`applies`] accepts.
pub(crate) fn forward<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    x: &[T],
    w: &[T],
    y: &mut [T],
) -> KResult {
    let t = Tiles::new(g);
    let (c_n, o_n, hw) = (g.c_in, g.c_out, g.h * g.w);
    let work = g.n * o_n * c_n * t.per_image * 16;
    let parallel = ctx.par.parallel(work);
    let cols_max = t.cols(t.b);
    let mut u = take_vec::<T>(16 * o_n * c_n);
    let mut v = take_vec::<T>(16 * c_n * cols_max);
    let mut m = take_vec::<T>(16 * o_n * cols_max);
    weight_transform(parallel, g, w, &mut u);
    let result = (|| {
        for (bi, yb) in y.chunks_mut(t.b * o_n * hw).enumerate() {
            let n0 = bi * t.b;
            let b = yb.len() / (o_n * hw);
            let cols = t.cols(b);
            let xb = &x[n0 * c_n * hw..][..b * c_n * hw];
            for_planes(
                parallel,
                &mut v[..16 * c_n * cols],
                16 * cols,
                |c, dst, s| input_transform(g, &t, b, &xb[c * hw..], c_n * hw, dst, cols, s),
            );
            let (u, v) = (&u[..], &v[..]);
            for_taps(parallel, &mut m, o_n * cols, |xi, dst| {
                gemm_checked(
                    ctx,
                    (o_n, cols, c_n),
                    Dst {
                        data: dst,
                        rs: cols,
                        cs: 1,
                        accumulate: false,
                    },
                    Src {
                        data: &u[xi * o_n * c_n..][..o_n * c_n],
                        rs: c_n,
                        cs: 1,
                    },
                    Src {
                        data: &v[xi * cols..],
                        rs: 16 * cols,
                        cs: 1,
                    },
                    gemm::Parallelism::None,
                )
            })?;
            let mm = &m[..];
            let ld = o_n * cols;
            per_channel_planes(parallel, yb, (b, o_n, hw), |o, out, s| {
                output_transform(g, &t, b, &mm[o * cols..], ld, out, s)
            });
        }
        Ok(())
    })();
    give_vec(u);
    give_vec(v);
    give_vec(m);
    result
}

/// `Conv2DBackpropInput(dy, w)` into `dx`, for a convolution [`applies`] accepts.
pub(crate) fn backprop_input<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    dy: &[T],
    w: &[T],
    dx: &mut [T],
) -> KResult {
    let t = Tiles::new(g);
    let (c_n, o_n, hw) = (g.c_in, g.c_out, g.h * g.w);
    let work = g.n * o_n * c_n * t.per_image * 16;
    let parallel = ctx.par.parallel(work);
    let cols_max = t.cols(t.b);
    let mut u = take_vec::<T>(16 * o_n * c_n);
    let mut v = take_vec::<T>(16 * c_n * cols_max);
    let mut m = take_vec::<T>(16 * o_n * cols_max);
    weight_transform(parallel, g, w, &mut u);
    let result = (|| {
        for (bi, dxb) in dx.chunks_mut(t.b * c_n * hw).enumerate() {
            let n0 = bi * t.b;
            let b = dxb.len() / (c_n * hw);
            let cols = t.cols(b);
            let dyb = &dy[n0 * o_n * hw..][..b * o_n * hw];
            for_planes(
                parallel,
                &mut m[..16 * o_n * cols],
                16 * cols,
                |o, dst, s| output_grad_transform(g, &t, b, &dyb[o * hw..], o_n * hw, dst, cols, s),
            );
            let (u, m) = (&u[..], &m[..]);
            for_taps(parallel, &mut v, c_n * cols, |xi, dst| {
                gemm_checked(
                    ctx,
                    (c_n, cols, o_n),
                    Dst {
                        data: dst,
                        rs: cols,
                        cs: 1,
                        accumulate: false,
                    },
                    Src {
                        data: &u[xi * o_n * c_n..][..o_n * c_n],
                        rs: 1,
                        cs: c_n,
                    },
                    Src {
                        data: &m[xi * cols..],
                        rs: 16 * cols,
                        cs: 1,
                    },
                    gemm::Parallelism::None,
                )
            })?;
            let vv = &v[..];
            let ld = c_n * cols;
            per_channel_planes(parallel, dxb, (b, c_n, hw), |c, out, s| {
                input_grad_transform(g, &t, b, &vv[c * cols..], ld, out, s)
            });
        }
        Ok(())
    })();
    give_vec(u);
    give_vec(v);
    give_vec(m);
    result
}

/// `Conv2DBackpropFilter(dy, x)` into `dw`, for a convolution [`applies`] accepts.
pub(crate) fn backprop_filter<T: Real>(
    ctx: &Ctx<'_>,
    g: &Conv2dGeometry,
    dy: &[T],
    x: &[T],
    dw: &mut [T],
) -> KResult {
    let t = Tiles::new(g);
    let (c_n, o_n, hw) = (g.c_in, g.c_out, g.h * g.w);
    let work = g.n * o_n * c_n * t.per_image * 16;
    let parallel = ctx.par.parallel(work);
    let cols_max = t.cols(t.b);
    let mut du = take_vec::<T>(16 * o_n * c_n);
    let mut v = take_vec::<T>(16 * c_n * cols_max);
    let mut m = take_vec::<T>(16 * o_n * cols_max);
    let result = (|| {
        let mut n0 = 0;
        while n0 < g.n {
            let b = t.b.min(g.n - n0);
            let cols = t.cols(b);
            let xb = &x[n0 * c_n * hw..][..b * c_n * hw];
            let dyb = &dy[n0 * o_n * hw..][..b * o_n * hw];
            for_planes(
                parallel,
                &mut v[..16 * c_n * cols],
                16 * cols,
                |c, dst, s| input_transform(g, &t, b, &xb[c * hw..], c_n * hw, dst, cols, s),
            );
            for_planes(
                parallel,
                &mut m[..16 * o_n * cols],
                16 * cols,
                |o, dst, s| output_grad_transform(g, &t, b, &dyb[o * hw..], o_n * hw, dst, cols, s),
            );
            let (m, v) = (&m[..], &v[..]);
            for_taps(parallel, &mut du, o_n * c_n, |xi, dst| {
                gemm_checked(
                    ctx,
                    (o_n, c_n, cols),
                    Dst {
                        data: dst,
                        rs: c_n,
                        cs: 1,
                        accumulate: n0 > 0,
                    },
                    Src {
                        data: &m[xi * cols..],
                        rs: 16 * cols,
                        cs: 1,
                    },
                    Src {
                        data: &v[xi * cols..],
                        rs: 1,
                        cs: 16 * cols,
                    },
                    gemm::Parallelism::None,
                )
            })?;
            n0 += b;
        }
        filter_output_transform(parallel, g, &du, dw);
        Ok(())
    })();
    give_vec(du);
    give_vec(v);
    give_vec(m);
    result
}
