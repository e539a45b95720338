//! HCCL's collectives over the shared-memory transport ([`crate::shm`]): element types, reduce
//! operations, and each collective's chunking of its buffers into the slots.

use crate::bail;
use crate::diag::EmuResult;
use crate::dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::shm::{op, Desc, Segment, SLOT};

/// An HcclDataType the emulator moves and reduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HType {
    /// HCCL_DATA_TYPE_INT8 (0).
    I8,
    /// HCCL_DATA_TYPE_INT16 (1).
    I16,
    /// HCCL_DATA_TYPE_INT32 (2).
    I32,
    /// HCCL_DATA_TYPE_FP16 (3).
    F16,
    /// HCCL_DATA_TYPE_FP32 (4).
    F32,
    /// HCCL_DATA_TYPE_INT64 (5).
    I64,
    /// HCCL_DATA_TYPE_UINT64 (6).
    U64,
    /// HCCL_DATA_TYPE_UINT8 (7).
    U8,
    /// HCCL_DATA_TYPE_UINT16 (8).
    U16,
    /// HCCL_DATA_TYPE_UINT32 (9).
    U32,
    /// HCCL_DATA_TYPE_FP64 (10).
    F64,
    /// HCCL_DATA_TYPE_BFP16 (11).
    Bf16,
}

impl HType {
    /// The type of HcclDataType value `v`.
    pub fn parse(api: &str, v: i64) -> EmuResult<HType> {
        Ok(match v {
            0 => HType::I8,
            1 => HType::I16,
            2 => HType::I32,
            3 => HType::F16,
            4 => HType::F32,
            5 => HType::I64,
            6 => HType::U64,
            7 => HType::U8,
            8 => HType::U16,
            9 => HType::U32,
            10 => HType::F64,
            11 => HType::Bf16,
            _ => bail!(InvalidParam, "{api}: HcclDataType {v} is not supported"),
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            HType::I8 | HType::U8 => 1,
            HType::I16 | HType::U16 | HType::F16 | HType::Bf16 => 2,
            HType::I32 | HType::U32 | HType::F32 => 4,
            HType::I64 | HType::U64 | HType::F64 => 8,
        }
    }

    /// The HcclDataType value.
    pub fn code(self) -> u64 {
        self as u64
    }
}

/// An HcclReduceOp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ROp {
    /// HCCL_REDUCE_SUM (0).
    Sum,
    /// HCCL_REDUCE_PROD (1).
    Prod,
    /// HCCL_REDUCE_MAX (2).
    Max,
    /// HCCL_REDUCE_MIN (3).
    Min,
}

impl ROp {
    /// The op of HcclReduceOp value `v`.
    pub fn parse(api: &str, v: i64) -> EmuResult<ROp> {
        Ok(match v {
            0 => ROp::Sum,
            1 => ROp::Prod,
            2 => ROp::Max,
            3 => ROp::Min,
            _ => bail!(InvalidParam, "{api}: HcclReduceOp {v} is not supported"),
        })
    }
}

macro_rules! fold_int {
    ($t:ty, $acc:expr, $x:expr, $op:expr) => {{
        const S: usize = std::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut(S).zip($x.chunks_exact(S)) {
            let p = <$t>::from_le_bytes(crate::dtype::bytes(a));
            let q = <$t>::from_le_bytes(crate::dtype::bytes(b));
            let r = match $op {
                ROp::Sum => p.wrapping_add(q),
                ROp::Prod => p.wrapping_mul(q),
                ROp::Max => p.max(q),
                ROp::Min => p.min(q),
            };
            a.copy_from_slice(&r.to_le_bytes());
        }
    }};
}

fn f(op: ROp, p: f64, q: f64) -> f64 {
    match op {
        ROp::Sum => p + q,
        ROp::Prod => p * q,
        ROp::Max => p.max(q),
        ROp::Min => p.min(q),
    }
}

fn f32op(op: ROp, p: f32, q: f32) -> f32 {
    match op {
        ROp::Sum => p + q,
        ROp::Prod => p * q,
        ROp::Max => p.max(q),
        ROp::Min => p.min(q),
    }
}

/// `acc := acc ∘ x` element-wise. f32 combines in f32 (a member-order f32 sum); f16 / bf16
/// combine in f32 and round after each step.
pub fn fold(t: HType, op: ROp, acc: &mut [u8], x: &[u8]) {
    match t {
        HType::I8 => fold_int!(i8, acc, x, op),
        HType::U8 => fold_int!(u8, acc, x, op),
        HType::I16 => fold_int!(i16, acc, x, op),
        HType::U16 => fold_int!(u16, acc, x, op),
        HType::I32 => fold_int!(i32, acc, x, op),
        HType::U32 => fold_int!(u32, acc, x, op),
        HType::I64 => fold_int!(i64, acc, x, op),
        HType::U64 => fold_int!(u64, acc, x, op),
        HType::F32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                let p = f32::from_le_bytes(crate::dtype::bytes(a));
                let q = f32::from_le_bytes(crate::dtype::bytes(b));
                a.copy_from_slice(&f32op(op, p, q).to_le_bytes());
            }
        }
        HType::F64 => {
            for (a, b) in acc.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
                let p = f64::from_le_bytes(crate::dtype::bytes(a));
                let q = f64::from_le_bytes(crate::dtype::bytes(b));
                a.copy_from_slice(&f(op, p, q).to_le_bytes());
            }
        }
        HType::F16 | HType::Bf16 => {
            type Conv = (fn(u16) -> f32, fn(f32) -> u16);
            let (to, from): Conv = if t == HType::F16 {
                (f16_to_f32, f32_to_f16)
            } else {
                (bf16_to_f32, f32_to_bf16)
            };
            for (a, b) in acc.chunks_exact_mut(2).zip(x.chunks_exact(2)) {
                let p = to(u16::from_le_bytes([a[0], a[1]]));
                let q = to(u16::from_le_bytes([b[0], b[1]]));
                a.copy_from_slice(&from(f32op(op, p, q)).to_le_bytes());
            }
        }
    }
}

fn desc(opc: u64, t: HType, count: u64, root: Option<usize>, r: Option<ROp>) -> Desc {
    Desc {
        op: opc,
        dtype: t.code(),
        count,
        root: root.map_or(u64::MAX, |r| r as u64),
        reduce: r.map_or(u64::MAX, |r| r as u64),
        seq: 0,
    }
}

/// Elements of `t` per slot (whole slot) and per personalized sub-slot (a slot split in `n`).
fn per(t: HType, n: usize) -> (usize, usize) {
    let whole = SLOT / t.size();
    (whole, (SLOT / n / t.size()).max(1))
}

/// AllReduce of `input` (`count` elements); every rank returns the rank-order reduction.
pub fn all_reduce(seg: &Segment, api: &str, t: HType, r: ROp, input: &[u8]) -> EmuResult<Vec<u8>> {
    let es = t.size();
    let count = input.len() / es;
    let (ce, _) = per(t, seg.n);
    let mut out = vec![0u8; input.len()];
    seg.collective(
        api,
        desc(op::ALL_REDUCE, t, count as u64, None, Some(r)),
        count.div_ceil(ce),
        |c, slot| {
            let lo = c * ce * es;
            let hi = ((c + 1) * ce * es).min(input.len());
            if lo < hi {
                slot[..hi - lo].copy_from_slice(&input[lo..hi]);
            }
        },
        |c, slots| {
            let lo = c * ce * es;
            let hi = ((c + 1) * ce * es).min(input.len());
            if lo >= hi {
                return;
            }
            let acc = &mut out[lo..hi];
            acc.copy_from_slice(&slots[0][..hi - lo]);
            for s in &slots[1..] {
                fold(t, r, acc, &s[..hi - lo]);
            }
        },
    )?;
    Ok(out)
}

/// AllGather: every rank returns the concatenation, in rank order, of every rank's `input`.
pub fn all_gather(seg: &Segment, api: &str, t: HType, input: &[u8]) -> EmuResult<Vec<u8>> {
    let es = t.size();
    let len = input.len();
    let (ce, _) = per(t, seg.n);
    let step = ce * es;
    let mut out = vec![0u8; len * seg.n];
    seg.collective(
        api,
        desc(op::ALL_GATHER, t, (len / es) as u64, None, None),
        len.div_ceil(step),
        |c, slot| {
            let (lo, hi) = (c * step, ((c + 1) * step).min(len));
            if lo < hi {
                slot[..hi - lo].copy_from_slice(&input[lo..hi]);
            }
        },
        |c, slots| {
            let (lo, hi) = (c * step, ((c + 1) * step).min(len));
            for (q, s) in slots.iter().enumerate() {
                if lo < hi {
                    out[q * len + lo..q * len + hi].copy_from_slice(&s[..hi - lo]);
                }
            }
        },
    )?;
    Ok(out)
}

/// Broadcast of `root`'s `buf` (`count` elements) to every rank.
pub fn broadcast(seg: &Segment, api: &str, t: HType, root: usize, buf: &mut [u8]) -> EmuResult<()> {
    let es = t.size();
    let len = buf.len();
    let (ce, _) = per(t, seg.n);
    let step = ce * es;
    let me = seg.rank;
    let src = buf.to_vec();
    seg.collective(
        api,
        desc(op::BROADCAST, t, (len / es) as u64, Some(root), None),
        len.div_ceil(step),
        |c, slot| {
            let (lo, hi) = (c * step, ((c + 1) * step).min(len));
            if me == root && lo < hi {
                slot[..hi - lo].copy_from_slice(&src[lo..hi]);
            }
        },
        |c, slots| {
            let (lo, hi) = (c * step, ((c + 1) * step).min(len));
            if lo < hi {
                buf[lo..hi].copy_from_slice(&slots[root][..hi - lo]);
            }
        },
    )
}

/// Reduce to `root`: the root returns the rank-order reduction, others their input unchanged.
pub fn reduce(
    seg: &Segment,
    api: &str,
    t: HType,
    r: ROp,
    root: usize,
    input: &[u8],
) -> EmuResult<Vec<u8>> {
    let es = t.size();
    let count = input.len() / es;
    let (ce, _) = per(t, seg.n);
    let me = seg.rank;
    let mut out = input.to_vec();
    seg.collective(
        api,
        desc(op::REDUCE, t, count as u64, Some(root), Some(r)),
        count.div_ceil(ce),
        |c, slot| {
            let lo = c * ce * es;
            let hi = ((c + 1) * ce * es).min(input.len());
            if lo < hi {
                slot[..hi - lo].copy_from_slice(&input[lo..hi]);
            }
        },
        |c, slots| {
            let lo = c * ce * es;
            let hi = ((c + 1) * ce * es).min(input.len());
            if me != root || lo >= hi {
                return;
            }
            let acc = &mut out[lo..hi];
            acc.copy_from_slice(&slots[0][..hi - lo]);
            for s in &slots[1..] {
                fold(t, r, acc, &s[..hi - lo]);
            }
        },
    )?;
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
/// The personalized exchange under ReduceScatter, AlltoAll and Scatter: rank `q` sends block
/// `d` of its input (`count` elements each) to rank `d`; `take(q, offset_bytes, bytes)` gets
/// rank `q`'s block for this rank piece by piece.
fn exchange(
    seg: &Segment,
    api: &str,
    d: Desc,
    t: HType,
    count: usize,
    input: &[u8],
    only_from: Option<usize>,
    mut take: impl FnMut(usize, usize, &[u8]),
) -> EmuResult<()> {
    let es = t.size();
    let n = seg.n;
    let (_, sub) = per(t, n);
    let step = sub * es;
    let blen = count * es;
    let me = seg.rank;
    seg.collective(
        api,
        d,
        blen.div_ceil(step),
        |c, slot| {
            let (lo, hi) = (c * step, ((c + 1) * step).min(blen));
            if lo >= hi || only_from.is_some_and(|r| r != me) {
                return;
            }
            for dst in 0..n {
                slot[dst * step..dst * step + hi - lo]
                    .copy_from_slice(&input[dst * blen + lo..dst * blen + hi]);
            }
        },
        |c, slots| {
            let (lo, hi) = (c * step, ((c + 1) * step).min(blen));
            if lo >= hi {
                return;
            }
            for (q, s) in slots.iter().enumerate() {
                if only_from.is_some_and(|r| r != q) {
                    continue;
                }
                take(q, lo, &s[me * step..me * step + hi - lo]);
            }
        },
    )
}

/// ReduceScatter: rank `r` returns the rank-order reduction of block `r` (`count` elements) of
/// every rank's input (`n · count` elements).
pub fn reduce_scatter(
    seg: &Segment,
    api: &str,
    t: HType,
    r: ROp,
    count: usize,
    input: &[u8],
) -> EmuResult<Vec<u8>> {
    let mut out = vec![0u8; count * t.size()];
    let d = desc(op::REDUCE_SCATTER, t, count as u64, None, Some(r));
    exchange(seg, api, d, t, count, input, None, |q, off, piece| {
        let acc = &mut out[off..off + piece.len()];
        if q == 0 {
            acc.copy_from_slice(piece);
        } else {
            fold(t, r, acc, piece);
        }
    })?;
    Ok(out)
}

/// AlltoAll with equal blocks: rank `r` returns, in rank order, block `r` of every rank's input.
pub fn all_to_all(
    seg: &Segment,
    api: &str,
    t: HType,
    count: usize,
    input: &[u8],
) -> EmuResult<Vec<u8>> {
    let blen = count * t.size();
    let mut out = vec![0u8; blen * seg.n];
    let d = desc(op::ALL_TO_ALL, t, count as u64, None, None);
    exchange(seg, api, d, t, count, input, None, |q, off, piece| {
        out[q * blen + off..q * blen + off + piece.len()].copy_from_slice(piece);
    })?;
    Ok(out)
}

/// Scatter from `root`: rank `r` returns block `r` of the root's input.
pub fn scatter(
    seg: &Segment,
    api: &str,
    t: HType,
    root: usize,
    count: usize,
    input: &[u8],
) -> EmuResult<Vec<u8>> {
    let mut out = vec![0u8; count * t.size()];
    let d = desc(op::SCATTER, t, count as u64, Some(root), None);
    exchange(seg, api, d, t, count, input, Some(root), |_, off, piece| {
        out[off..off + piece.len()].copy_from_slice(piece);
    })?;
    Ok(out)
}

/// Barrier: returns when every rank has reached it.
pub fn barrier(seg: &Segment, api: &str) -> EmuResult<()> {
    let d = desc(op::BARRIER, HType::I8, 0, None, None);
    seg.collective(api, d, 1, |_, _| {}, |_, _| {})
}
