//! GEMM (through the `gemm` crate) and the MatMul / BatchMatMul kernels.

use crate::real::Real;
use crate::util::{give_vec, take_vec, Ctx, KResult, Par};
use rayon::prelude::*;
use shardc_runtime::{Arg, Tensor};

/// A read-only operand of [`sgemm`] / [`dgemm`]: a matrix stored row-major in `data` with
/// leading dimension `ld` (the distance between the starts of two stored rows), used as is
/// or transposed.
///
/// For `C = op(A) op(B)` with `op(A)` of shape `m × k`: when `transpose` is false, `A` is
/// stored as `m` rows of `k` (so `ld >= k`); when it is true, `A` is stored as `k` rows of
/// `m` (`ld >= m`) and used transposed, without any copy.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    /// The stored elements.
    pub data: &'a [T],
    /// Distance between consecutive stored rows, in elements.
    pub ld: usize,
    /// Whether the stored matrix is the transpose of the operand.
    pub transpose: bool,
}

impl<'a, T> MatRef<'a, T> {
    /// An operand used as stored (row-major, leading dimension `ld`).
    pub fn new(data: &'a [T], ld: usize) -> Self {
        MatRef {
            data,
            ld,
            transpose: false,
        }
    }

    /// An operand used transposed (stored row-major with leading dimension `ld`).
    pub fn transposed(data: &'a [T], ld: usize) -> Self {
        MatRef {
            data,
            ld,
            transpose: true,
        }
    }

    /// Row and column strides of the operand `op(X)` of shape `rows × cols`, after checking
    /// that it fits in `data`.
    fn strides(
        &self,
        name: &'static str,
        rows: usize,
        cols: usize,
    ) -> Result<(usize, usize), GemmError> {
        let (stored_rows, stored_cols) = if self.transpose {
            (cols, rows)
        } else {
            (rows, cols)
        };
        if self.ld < stored_cols {
            return Err(GemmError::LeadingDim {
                operand: name,
                ld: self.ld,
                cols: stored_cols,
            });
        }
        let needed = if stored_rows == 0 || stored_cols == 0 {
            0
        } else {
            (stored_rows - 1) * self.ld + stored_cols
        };
        if needed > self.data.len() {
            return Err(GemmError::TooShort {
                operand: name,
                needed,
                len: self.data.len(),
            });
        }
        Ok(if self.transpose {
            (1, self.ld)
        } else {
            (self.ld, 1)
        })
    }
}

/// Why a GEMM call was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GemmError {
    /// A buffer is shorter than its matrix.
    #[error("gemm operand {operand}: {needed} elements needed, the buffer has {len}")]
    TooShort {
        /// `a`, `b` or `c`.
        operand: &'static str,
        /// Elements the matrix spans.
        needed: usize,
        /// Elements in the buffer.
        len: usize,
    },
    /// A leading dimension shorter than a stored row.
    #[error(
        "gemm operand {operand}: leading dimension {ld} is less than the {cols} columns stored"
    )]
    LeadingDim {
        /// `a` or `b`.
        operand: &'static str,
        /// The leading dimension given.
        ld: usize,
        /// The stored row length.
        cols: usize,
    },
}

/// Single-precision GEMM: `c = op(a) · op(b)`, with `op(a)` of shape `m × k`, `op(b)` of
/// shape `k × n`, and `c` an `m × n` row-major buffer (leading dimension `n`, exactly
/// `m * n` elements used, overwritten).
///
/// `threads`: 1 runs serially on the calling thread; `t > 1` splits the product into `t`
/// tasks on the current rayon pool (the global pool, or the pool whose `install` the call is
/// made in); 0 uses as many tasks as the current pool has threads. Small products run
/// serially whatever `threads` says. Results do not depend on `threads`.
///
/// Uses the `gemm` crate's kernels (AVX-512 with its `x86-v4` feature).
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    c: &mut [f32],
    threads: usize,
) -> Result<(), GemmError> {
    gemm_mat(m, n, k, a, b, c, threads)
}

/// Double-precision GEMM, as [`sgemm`].
pub fn dgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, f64>,
    b: MatRef<'_, f64>,
    c: &mut [f64],
    threads: usize,
) -> Result<(), GemmError> {
    gemm_mat(m, n, k, a, b, c, threads)
}

fn gemm_mat<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_, T>,
    b: MatRef<'_, T>,
    c: &mut [T],
    threads: usize,
) -> Result<(), GemmError> {
    let (a_rs, a_cs) = a.strides("a", m, k)?;
    let (b_rs, b_cs) = b.strides("b", k, n)?;
    if c.len() < m * n {
        return Err(GemmError::TooShort {
            operand: "c",
            needed: m * n,
            len: c.len(),
        });
    }
    let par = match threads {
        1 => gemm::Parallelism::None,
        0 => gemm::Parallelism::Rayon(rayon::current_num_threads()),
        t => gemm::Parallelism::Rayon(t),
    };
    gemm_strided(
        m,
        n,
        k,
        Dst {
            data: &mut c[..m * n],
            rs: n,
            cs: 1,
            accumulate: false,
        },
        Src {
            data: a.data,
            rs: a_rs,
            cs: a_cs,
        },
        Src {
            data: b.data,
            rs: b_rs,
            cs: b_cs,
        },
        par,
    )
    .map_err(|e| e.0)
}

/// A strided read-only matrix inside a buffer (element `(i, j)` at `i * rs + j * cs`).
#[derive(Clone, Copy)]
pub(crate) struct Src<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// A strided destination matrix; `accumulate` adds the product to what is there.
pub(crate) struct Dst<'a, T> {
    pub data: &'a mut [T],
    pub rs: usize,
    pub cs: usize,
    pub accumulate: bool,
}

/// A bounds failure of [`gemm_strided`].
#[derive(Debug)]
pub(crate) struct StridedError(pub GemmError);

fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `dst (m × n) (+)= a (m × k) · b (k × n)` for arbitrary non-negative strides, after
/// checking every operand against its buffer (the gemm crate works on raw pointers).
pub(crate) fn gemm_strided<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: Dst<'_, T>,
    a: Src<'_, T>,
    b: Src<'_, T>,
    par: gemm::Parallelism,
) -> Result<(), StridedError> {
    let check = |name, need: usize, len: usize| {
        if need > len {
            Err(StridedError(GemmError::TooShort {
                operand: name,
                needed: need,
                len,
            }))
        } else {
            Ok(())
        }
    };
    check("c", span(m, n, dst.rs, dst.cs), dst.data.len())?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !dst.accumulate {
            for i in 0..m {
                for j in 0..n {
                    dst.data[i * dst.rs + j * dst.cs] = T::ZERO;
                }
            }
        }
        return Ok(());
    }
    check("a", span(m, k, a.rs, a.cs), a.data.len())?;
    check("b", span(k, n, b.rs, b.cs), b.data.len())?;
    // Rewritten only with rows of `dst` that do not overlap (`rs >= n`): the rewrites cut
    // `dst` into row bands.
    if dst.cs == 1
        && dst.rs >= n
        && b.rs == 1
        && b.cs > 1
        && n > 1
        && m > 1
        && m * n * k >= REWRITE_MIN_WORK
    {
        return gemm_column_major_rhs(m, n, k, dst, a, b, par);
    }
    // SAFETY: every element the product reads or writes lies inside the checked spans of the
    // three slices; `dst` is borrowed mutably, so it cannot alias `a` or `b`. `T` is f32 or
    // f64 (the only `Real` types), which the gemm crate supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            dst.cs as isize,
            dst.rs as isize,
            dst.accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// Fewest rows of a band when [`gemm_column_major_rhs`] splits a product of few rows
/// across threads.
const ROW_BAND_MIN: usize = 8;

/// Rows from which [`gemm_column_major_rhs`] leaves the split across threads to the crate
/// (row bands measured slower on the im2col filter gradients of ResNet-18, m = 128 to 512).
const ROW_BAND_MAX_ROWS: usize = 128;

/// Multiply-adds from which [`gemm_column_major_rhs`] rewrites a product (below, its copies
/// cost more than they save: m = 32, n = 10, k = 512 ran 8 µs as it is, 13 µs rewritten).
const REWRITE_MIN_WORK: usize = 1 << 18;

/// [`gemm_strided`] for a column-major right operand (`b.rs == 1`: `MatMul` with
/// `transpose_b`), a row-major destination whose rows do not overlap and more than one row,
/// after the bounds checks.
///
/// The gemm crate is slow on this layout: about 4x slower than on a row-major `b` at
/// m = 32, n = k = 512 (25 against 105 GFLOP/s), 15x at m = 8, and a second thread does not
/// help. Two rewrites reach its fast layouts; the one that moves fewer elements is taken:
/// - copy `b` to row-major (`k · n` moves), or
/// - compute `c` column-major in scratch from a column-major `a` (`m · k` moves, none when
///   `a` is stored transposed) and `b` as it is, then copy `c` into `dst` (`m · n` moves):
///   the cheaper one when `m` is small, as for the activation gradient of a dense layer.
///
/// No sum is reordered by either: results equal the crate's on the original layout up to
/// its own blocking, for every thread count.
fn gemm_column_major_rhs<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: Dst<'_, T>,
    a: Src<'_, T>,
    b: Src<'_, T>,
    par: gemm::Parallelism,
) -> Result<(), StridedError> {
    let a_moves = if a.rs == 1 { 0 } else { m * k };
    if k * n <= a_moves + m * n {
        let mut packed = take_vec::<T>(k * n);
        transpose_rows(par, b.data, (k, n), b.cs, &mut packed[..k * n], n, false);
        let result = gemm_strided(
            m,
            n,
            k,
            dst,
            a,
            Src {
                data: &packed[..k * n],
                rs: n,
                cs: 1,
            },
            par,
        );
        give_vec(packed);
        return result;
    }
    if let gemm::Parallelism::Rayon(threads) = par {
        if threads > 1 && (2 * ROW_BAND_MIN..ROW_BAND_MAX_ROWS).contains(&m) {
            // Few rows: the crate's own split of this product scales poorly (1.5x on two
            // threads) and the copies would run serially; bands of rows, each rewritten and
            // multiplied serially, scale with the threads.
            let band = m.div_ceil(threads).div_ceil(8) * 8;
            let Dst {
                data,
                rs,
                cs,
                accumulate,
            } = dst;
            return data
                .par_chunks_mut(band * rs)
                .take(m.div_ceil(band))
                .enumerate()
                .try_for_each(|(bi, d)| {
                    let i0 = bi * band;
                    // Rewritten directly: a band may fall below REWRITE_MIN_WORK, where
                    // `gemm_strided` would hand it to the crate's slow path.
                    gemm_column_major_rhs(
                        band.min(m - i0),
                        n,
                        k,
                        Dst {
                            data: d,
                            rs,
                            cs,
                            accumulate,
                        },
                        Src {
                            data: &a.data[i0 * a.rs..],
                            rs: a.rs,
                            cs: a.cs,
                        },
                        b,
                        gemm::Parallelism::None,
                    )
                });
        }
    }
    let mut a_packed = Vec::new();
    let a_cm = if a.rs == 1 {
        a
    } else {
        a_packed = take_vec::<T>(m * k);
        if a.cs == 1 {
            transpose_rows(par, a.data, (k, m), a.rs, &mut a_packed[..m * k], m, false);
        } else {
            for p in 0..k {
                for i in 0..m {
                    a_packed[p * m + i] = a.data[i * a.rs + p * a.cs];
                }
            }
        }
        Src {
            data: &a_packed[..m * k],
            rs: 1,
            cs: m,
        }
    };
    let mut c = take_vec::<T>(m * n);
    let result = gemm_strided(
        m,
        n,
        k,
        Dst {
            data: &mut c[..m * n],
            rs: 1,
            cs: m,
            accumulate: false,
        },
        a_cm,
        b,
        par,
    );
    if result.is_ok() {
        let Dst {
            data,
            rs,
            cs,
            accumulate,
        } = dst;
        if cs == 1 {
            transpose_rows(par, &c[..m * n], (m, n), m, data, rs, accumulate);
        } else {
            for j in 0..n {
                for i in 0..m {
                    let (d, v) = (&mut data[i * rs + j * cs], c[j * m + i]);
                    if accumulate {
                        *d += v
                    } else {
                        *d = v
                    }
                }
            }
        }
    }
    give_vec(c);
    give_vec(a_packed);
    result
}

/// [`transpose_into`], on bands of rows in parallel when `par` allows several threads and
/// the copy is large enough to be worth it (a serial copy would cap the speed-up of the
/// parallel product that follows it).
fn transpose_rows<T: Real>(
    par: gemm::Parallelism,
    src: &[T],
    (rows, cols): (usize, usize),
    src_ld: usize,
    dst: &mut [T],
    dst_ld: usize,
    accumulate: bool,
) {
    const BAND: usize = 64;
    let parallel = matches!(par, gemm::Parallelism::Rayon(t) if t != 1)
        && rows > BAND
        && rows * cols >= 1 << 15;
    if !parallel {
        transpose_into(src, (rows, cols), src_ld, dst, dst_ld, accumulate);
        return;
    }
    dst.par_chunks_mut(BAND * dst_ld)
        .take(rows.div_ceil(BAND))
        .enumerate()
        .for_each(|(band, d)| {
            let i0 = band * BAND;
            let h = BAND.min(rows - i0);
            transpose_into(&src[i0..], (h, cols), src_ld, d, dst_ld, accumulate);
        });
}

/// Writes `rows × cols` elements into the row-major `dst` (row stride `dst_ld`) from `src`,
/// whose element `(i, j)` is at `i + j * src_ld` (a column-major matrix), adding them to
/// `dst` when `accumulate`. An f32 copy on a CPU with AVX transposes its whole 8 × 8 tiles
/// in registers ([`transpose_tiles_f32`]: 128 × 128 took 2.5-2.8 us, 128 × 512 11 us and
/// 512 × 512 54 us, against 5.8, 24 and 99 us through a tile array); the rest goes through
/// [`transpose_scalar`].
fn transpose_into<T: Real>(
    src: &[T],
    (rows, cols): (usize, usize),
    src_ld: usize,
    dst: &mut [T],
    dst_ld: usize,
    accumulate: bool,
) {
    const TILE: usize = 8;
    let (full_rows, full_cols) = (rows / TILE * TILE, cols / TILE * TILE);
    if accumulate || !transpose_tiles_f32(src, (full_rows, full_cols), src_ld, dst, dst_ld) {
        transpose_scalar(src, (rows, cols), src_ld, dst, dst_ld, accumulate);
        return;
    }
    // The strips the tiles left: the last rows (every column), then the last columns.
    if full_rows < rows {
        transpose_scalar(
            &src[full_rows..],
            (rows - full_rows, cols),
            src_ld,
            &mut dst[full_rows * dst_ld..],
            dst_ld,
            false,
        );
    }
    if full_cols < cols {
        transpose_scalar(
            &src[full_cols * src_ld..],
            (full_rows, cols - full_cols),
            src_ld,
            &mut dst[full_cols..],
            dst_ld,
            false,
        );
    }
}

/// [`transpose_into`] through 8 × 8 tiles copied via a local array, so that both sides are
/// read and written a cache line at a time (a direct strided loop runs 3x slower on large
/// matrices).
fn transpose_scalar<T: Real>(
    src: &[T],
    (rows, cols): (usize, usize),
    src_ld: usize,
    dst: &mut [T],
    dst_ld: usize,
    accumulate: bool,
) {
    const TILE: usize = 8;
    let mut tile = [[T::default(); TILE]; TILE];
    for j0 in (0..cols).step_by(TILE) {
        let w = TILE.min(cols - j0);
        for i0 in (0..rows).step_by(TILE) {
            let h = TILE.min(rows - i0);
            for (jj, column) in tile.iter_mut().enumerate().take(w) {
                let at = (j0 + jj) * src_ld + i0;
                column[..h].copy_from_slice(&src[at..at + h]);
            }
            for ii in 0..h {
                let row = &mut dst[(i0 + ii) * dst_ld + j0..(i0 + ii) * dst_ld + j0 + w];
                for (jj, d) in row.iter_mut().enumerate() {
                    if accumulate {
                        *d += tile[jj][ii];
                    } else {
                        *d = tile[jj][ii];
                    }
                }
            }
        }
    }
}

/// Copies the transpose of a column-major `rows × cols` f32 block (both multiples of 8) into
/// the row-major `dst`, 8 × 8 tiles at a time in AVX registers. `false` (nothing written)
/// when `T` is not f32 or the CPU has no AVX.
fn transpose_tiles_f32<T: Real>(
    src: &[T],
    (rows, cols): (usize, usize),
    src_ld: usize,
    dst: &mut [T],
    dst_ld: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if T::DTYPE != shardc_ir::DType::Float32 || !std::arch::is_x86_feature_detected!("avx") {
            return false;
        }
        // SAFETY: `Real` is implemented for f32 and f64 only, and its DTYPE says which: `T`
        // is f32, so the slices are f32 slices of the same length.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(src.as_ptr().cast::<f32>(), src.len()),
                std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<f32>(), dst.len()),
            )
        };
        // A strip of 8 rows of `dst` at a time, left to right: going down a column of
        // tiles instead wrote rows a power of two apart, which share a few cache sets and
        // evicted each other (a 128 x 512 copy ran 24 us that way, 11 us this way).
        for i0 in (0..rows).step_by(8) {
            for j0 in (0..cols).step_by(8) {
                let columns: [&[f32]; 8] = std::array::from_fn(|jj| {
                    let at = (j0 + jj) * src_ld + i0;
                    &src[at..at + 8]
                });
                let mut out = [[0f32; 8]; 8];
                // SAFETY: AVX is present (checked above); every load reads one of the
                // 8-element slices above and every store writes one row of `out`.
                unsafe { transpose_8x8_avx(&columns, &mut out) };
                for (ii, row) in out.iter().enumerate() {
                    let at = (i0 + ii) * dst_ld + j0;
                    dst[at..at + 8].copy_from_slice(row);
                }
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (src, rows, cols, src_ld, dst, dst_ld);
        false
    }
}

/// `out[i][j] = columns[j][i]` for an 8 × 8 f32 tile: unpack pairs, shuffle quads, swap
/// 128-bit halves (the classic AVX 8 × 8 transpose).
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_8x8_avx(columns: &[&[f32]; 8], out: &mut [[f32; 8]; 8]) {
    use std::arch::x86_64::*;
    let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(columns[j].as_ptr()));
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let rows = [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ];
    for (o, v) in out.iter_mut().zip(rows) {
        _mm256_storeu_ps(o.as_mut_ptr(), v);
    }
}

/// Runs [`gemm_strided`], turning a bounds failure into a kernel error.
pub(crate) fn gemm_checked<T: Real>(
    ctx: &Ctx<'_>,
    (m, n, k): (usize, usize, usize),
    dst: Dst<'_, T>,
    a: Src<'_, T>,
    b: Src<'_, T>,
    par: gemm::Parallelism,
) -> KResult {
    gemm_strided(m, n, k, dst, a, b, par).map_err(|e| ctx.err(format!("internal gemm: {}", e.0)))
}

/// The operand `op(X)` of a matmul: rows, cols, and strides, from a stored matrix of shape
/// `(r, c)` (row-major, contiguous) and the transpose flag.
fn operand_view(r: usize, c: usize, transpose: bool) -> (usize, usize, usize, usize) {
    if transpose {
        (c, r, 1, c)
    } else {
        (r, c, c, 1)
    }
}

/// `MatMul(a, b)` with `transpose_a` / `transpose_b`.
pub(crate) fn matmul<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sa, a) = ctx.data::<T>(inputs, 0)?;
    let (sb, b) = ctx.data::<T>(inputs, 1)?;
    let ta = ctx.node.attrs.bool_or("transpose_a", false);
    let tb = ctx.node.attrs.bool_or("transpose_b", false);
    ctx.ensure(sa.len() == 2 && sb.len() == 2, || {
        format!("MatMul needs rank-2 operands, got shapes {sa:?} and {sb:?}")
    })?;
    let (m, k, a_rs, a_cs) = operand_view(sa[0], sa[1], ta);
    let (k2, n, b_rs, b_cs) = operand_view(sb[0], sb[1], tb);
    ctx.ensure(k == k2, || {
        format!(
            "inner dimensions differ: a {sa:?} (transpose_a {ta}) and b {sb:?} (transpose_b {tb})"
        )
    })?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &[m, n])?;
    let c = ctx.out::<T>(outputs, 0)?;
    let par = if ctx.par.parallel(m * n * k) {
        ctx.par.gemm()
    } else {
        gemm::Parallelism::None
    };
    gemm_checked(
        ctx,
        (m, n, k),
        Dst {
            data: c,
            rs: n,
            cs: 1,
            accumulate: false,
        },
        Src {
            data: a,
            rs: a_rs,
            cs: a_cs,
        },
        Src {
            data: b,
            rs: b_rs,
            cs: b_cs,
        },
        par,
    )
}

/// Offsets of every batch of a broadcast operand, for the result's batch dims.
pub(crate) fn batch_offsets(
    ctx: &Ctx<'_>,
    what: &str,
    batch: &[usize],
    out_batch: &[usize],
    matrix: usize,
) -> KResult<Vec<usize>> {
    ctx.ensure(batch.len() <= out_batch.len(), || {
        format!("{what} has batch dims {batch:?}, more than the result's {out_batch:?}")
    })?;
    let lead = out_batch.len() - batch.len();
    // Stride of each result batch dim in the operand (0 where broadcast).
    let mut strides = vec![0usize; out_batch.len()];
    let mut s = matrix;
    for i in (0..batch.len()).rev() {
        let o = out_batch[lead + i];
        if batch[i] == o {
            strides[lead + i] = s;
        } else if batch[i] != 1 {
            return Err(ctx.err(format!(
                "{what}: batch dims {batch:?} do not broadcast to {out_batch:?}"
            )));
        }
        s *= batch[i];
    }
    let total: usize = out_batch.iter().product();
    let mut offs = Vec::with_capacity(total);
    let mut idx = vec![0usize; out_batch.len()];
    for _ in 0..total {
        offs.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < out_batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(offs)
}

/// `BatchMatMul(a, b)`: leading dims broadcast; parallel over batches.
pub(crate) fn batch_matmul<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sa, a) = ctx.data::<T>(inputs, 0)?;
    let (sb, b) = ctx.data::<T>(inputs, 1)?;
    let ta = ctx.node.attrs.bool_or("transpose_a", false);
    let tb = ctx.node.attrs.bool_or("transpose_b", false);
    ctx.ensure(sa.len() >= 2 && sb.len() >= 2, || {
        format!("BatchMatMul needs operands of rank >= 2, got shapes {sa:?} and {sb:?}")
    })?;
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, a_rs, a_cs) = operand_view(sa[ra - 2], sa[ra - 1], ta);
    let (k2, n, b_rs, b_cs) = operand_view(sb[rb - 2], sb[rb - 1], tb);
    ctx.ensure(k == k2, || {
        format!(
            "inner dimensions differ: a {sa:?} (transpose_a {ta}) and b {sb:?} (transpose_b {tb})"
        )
    })?;
    let out_shape = ctx.out_shape(outputs, 0)?;
    let ro = out_shape.len();
    ctx.ensure(
        ro >= 2 && out_shape[ro - 2] == m && out_shape[ro - 1] == n,
        || format!("result shape {out_shape:?} does not end in ({m}, {n})"),
    )?;
    let out_batch = &out_shape[..ro - 2];
    let a_offs = batch_offsets(ctx, "a", &sa[..ra - 2], out_batch, m * k)?;
    let b_offs = batch_offsets(ctx, "b", &sb[..rb - 2], out_batch, k * n)?;
    let c = ctx.out::<T>(outputs, 0)?;
    let batches = a_offs.len();
    let mn = m * n;
    if mn == 0 {
        return Ok(());
    }
    let run_one = |bi: usize, dst: &mut [T], par: gemm::Parallelism| {
        gemm_checked(
            ctx,
            (m, n, k),
            Dst {
                data: dst,
                rs: n,
                cs: 1,
                accumulate: false,
            },
            Src {
                data: &a[a_offs[bi]..],
                rs: a_rs,
                cs: a_cs,
            },
            Src {
                data: &b[b_offs[bi]..],
                rs: b_rs,
                cs: b_cs,
            },
            par,
        )
    };
    let work = batches * mn * k.max(1);
    if batches > 1 && ctx.par.parallel(work) {
        c.par_chunks_mut(mn)
            .enumerate()
            .try_for_each(|(bi, dst)| run_one(bi, dst, gemm::Parallelism::None))
    } else {
        let par = if ctx.par.parallel(work) {
            ctx.par.gemm()
        } else {
            gemm::Parallelism::None
        };
        c.chunks_mut(mn)
            .enumerate()
            .try_for_each(|(bi, dst)| run_one(bi, dst, par))
    }
}

/// The serial / parallel gemm setting for one product of `work` multiply-adds.
pub(crate) fn gemm_par(par: Par, work: usize) -> gemm::Parallelism {
    if par.parallel(work) {
        par.gemm()
    } else {
        gemm::Parallelism::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(len: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
    }

    /// Transposed copies equal the naive transpose for every size around the 8 x 8 tiles,
    /// in f32 (AVX tiles where present) and f64, written and accumulated, with padded
    /// leading dimensions on both sides.
    #[test]
    fn transposes_match_the_naive_copy() {
        fn check<T: Real>(of: impl Fn(f64) -> T) {
            for (rows, cols) in [
                (1, 1),
                (8, 8),
                (16, 24),
                (13, 8),
                (8, 13),
                (17, 19),
                (64, 7),
            ] {
                let (src_ld, dst_ld) = (rows + 3, cols + 2);
                let src: Vec<T> = values(src_ld * cols, (rows * 31 + cols) as u64)
                    .into_iter()
                    .map(&of)
                    .collect();
                let base: Vec<T> = values(rows * dst_ld, 5).into_iter().map(&of).collect();
                for accumulate in [false, true] {
                    let mut got = base.clone();
                    transpose_into(&src, (rows, cols), src_ld, &mut got, dst_ld, accumulate);
                    let mut want = base.clone();
                    for i in 0..rows {
                        for j in 0..cols {
                            let v = src[i + j * src_ld];
                            let d = &mut want[i * dst_ld + j];
                            *d = if accumulate { *d + v } else { v };
                        }
                    }
                    assert_eq!(
                        got,
                        want,
                        "{rows}x{cols} accumulate={accumulate} {:?}",
                        T::DTYPE
                    );
                }
            }
        }
        check(|v| v as f32);
        check(|v| v);
    }

    /// Both rewrites of a column-major right operand (copy `b`; or `c` column-major from a
    /// column-major `a`), with `a` row-major, column-major or strided both ways, a padded
    /// destination, and accumulation, against a naive product; and the small product that
    /// stays on the crate's own path.
    #[test]
    fn column_major_right_operands_are_rewritten_exactly() {
        // (m, n, k): direct (below the work threshold), `c` column-major, `b` copied.
        for &(m, n, k) in &[(32, 64, 64), (32, 128, 128), (5, 300, 200), (200, 40, 40)] {
            for a_layout in 0..3 {
                for accumulate in [false, true] {
                    for par in [gemm::Parallelism::None, gemm::Parallelism::Rayon(2)] {
                        // a: row-major (rs k), column-major (cs m), or every other element
                        // of a row-major (m, 2k) matrix.
                        let (a_rs, a_cs, a_len) = match a_layout {
                            0 => (k, 1, m * k),
                            1 => (1, m, m * k),
                            _ => (2 * k, 2, 2 * m * k),
                        };
                        let a = values(a_len, 1);
                        let b = values(n * k, 2); // stored (n, k): b(p, j) at p + j * k
                        let ld = n + 3;
                        let before = values(m * ld, 3);
                        let mut c = before.clone();
                        gemm_strided(
                            m,
                            n,
                            k,
                            Dst {
                                data: &mut c,
                                rs: ld,
                                cs: 1,
                                accumulate,
                            },
                            Src {
                                data: &a,
                                rs: a_rs,
                                cs: a_cs,
                            },
                            Src {
                                data: &b,
                                rs: 1,
                                cs: k,
                            },
                            par,
                        )
                        .expect("in bounds");
                        for i in 0..m {
                            for j in 0..ld {
                                let got = c[i * ld + j];
                                if j >= n {
                                    assert_eq!(got, before[i * ld + j], "padding written");
                                    continue;
                                }
                                let mut want = if accumulate { before[i * ld + j] } else { 0.0 };
                                for p in 0..k {
                                    want += a[i * a_rs + p * a_cs] * b[p + j * k];
                                }
                                assert!(
                                    (got - want).abs() <= 1e-12 * (k as f64),
                                    "({m}, {n}, {k}) a layout {a_layout} accumulate \
                                     {accumulate}: c[{i}][{j}] = {got}, want {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
