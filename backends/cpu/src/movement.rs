//! Data movement for every element type: Reshape, Transpose, BroadcastTo, StridedSlice (+Grad),
//! Concat, Split, Gather, UnsortedSegmentSum, OneHot.

use crate::real::{Elem, Real};
use crate::util::{
    chunk_of, for_chunks, index_tensor, strides, with_any, Ctx, KResult, ELEMWISE_CHUNK,
};
use shardc_ir::block::Block;
use shardc_runtime::{Arg, Tensor};

/// Edge of the square tiles a transposing copy works in.
const TILE: usize = 32;

/// Drops size-1 dims and merges dims that are contiguous in both the result and the source.
fn simplify(dims: &[usize], istr: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut d: Vec<usize> = Vec::new();
    let mut s: Vec<usize> = Vec::new();
    for (&n, &st) in dims.iter().zip(istr) {
        if n == 1 {
            continue;
        }
        if let (Some(ld), Some(ls)) = (d.last_mut(), s.last_mut()) {
            if *ls == st * n {
                *ld *= n;
                *ls = st;
                continue;
            }
        }
        d.push(n);
        s.push(st);
    }
    (d, s)
}

/// Decodes a flat index over `dims` into a source offset with strides `istr`.
#[inline]
fn offset_of(mut flat: usize, dims: &[usize], istr: &[usize]) -> usize {
    let mut off = 0;
    for d in (0..dims.len()).rev() {
        off += (flat % dims[d]) * istr[d];
        flat /= dims[d];
    }
    off
}

/// `out[i0, .., ir] = x[base + sum(i_k * istr[k])]`: out is row-major over `dims`.
/// Copies rows when the source is contiguous along the last dim, and works in tiles when it
/// is contiguous along another.
fn gather_strided<T: Copy>(x: &[T], base: usize, dims: &[usize], istr: &[usize], out: &mut [T]) {
    let r = dims.len();
    if r == 0 {
        if let Some(o) = out.first_mut() {
            *o = x[base];
        }
        return;
    }
    let last = r - 1;
    let unit = (0..last).find(|&j| istr[j] == 1);
    let n_last = dims[last];
    match unit {
        Some(ib) if n_last > 1 => {
            // Tiled: ib (source-contiguous) × last (result-contiguous).
            let ostr = strides(dims);
            let others: Vec<usize> = (0..r).filter(|&j| j != ib && j != last).collect();
            let odims: Vec<usize> = others.iter().map(|&j| dims[j]).collect();
            let oistr: Vec<usize> = others.iter().map(|&j| istr[j]).collect();
            let oostr: Vec<usize> = others.iter().map(|&j| ostr[j]).collect();
            let count: usize = odims.iter().product();
            let (na, sa_out) = (dims[ib], ostr[ib]);
            let sb_in = istr[last];
            for k in 0..count {
                let ioff = base + offset_of(k, &odims, &oistr);
                let ooff = offset_of(k, &odims, &oostr);
                for a0 in (0..na).step_by(TILE) {
                    let a1 = (a0 + TILE).min(na);
                    for b0 in (0..n_last).step_by(TILE) {
                        let b1 = (b0 + TILE).min(n_last);
                        for a in a0..a1 {
                            let orow = &mut out[ooff + a * sa_out..][..n_last];
                            let src = ioff + a;
                            for (b, o) in orow.iter_mut().enumerate().take(b1).skip(b0) {
                                *o = x[src + b * sb_in];
                            }
                        }
                    }
                }
            }
        }
        _ => {
            let rows: usize = dims[..last].iter().product();
            let s = istr[last];
            for (row, orow) in out.chunks_mut(n_last).enumerate().take(rows) {
                let off = base + offset_of(row, &dims[..last], &istr[..last]);
                if s == 1 {
                    orow.copy_from_slice(&x[off..off + n_last]);
                } else if s == 0 {
                    orow.fill(x[off]);
                } else {
                    for (b, o) in orow.iter_mut().enumerate() {
                        *o = x[off + b * s];
                    }
                }
            }
        }
    }
}

/// A parallel [`gather_strided`]: the result is split along its first dim into fixed slabs.
fn gather_par<T: Copy + Send + Sync>(
    ctx: &Ctx<'_>,
    x: &[T],
    base: usize,
    dims: &[usize],
    istr: &[usize],
    out: &mut [T],
) {
    let (d, s) = simplify(dims, istr);
    if d.is_empty() {
        gather_strided(x, base, &d, &s, out);
        return;
    }
    let slab: usize = d[1..].iter().product();
    let mut per = (ELEMWISE_CHUNK / slab.max(1)).max(1);
    if s[0] == 1 {
        per = per.div_ceil(TILE) * TILE;
    }
    let total = out.len();
    for_chunks(ctx.par, out, per * slab, total, |ci, oc| {
        let d0 = ci * per;
        let n0 = oc.len() / slab.max(1);
        let mut sub = d.clone();
        sub[0] = n0;
        gather_strided(x, base + d0 * s[0], &sub, &s, oc);
    });
}

/// `Reshape(x, shape)`: a copy (the shape is the result's).
pub(crate) fn reshape(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let out = outputs.first_mut().ok_or_else(|| ctx.err("no output"))?;
    ctx.ensure(out.len() == x.len() && out.dtype() == x.dtype(), || {
        format!(
            "cannot reshape {} {:?} into {} {:?}",
            x.dtype(),
            x.shape,
            out.dtype(),
            out.shape
        )
    })?;
    with_any!(x.dtype(), T => {
        let (_, xs) = ctx.view::<T>(x, 0)?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        let total = o.len();
        for_chunks(ctx.par, o, ELEMWISE_CHUNK, total, |ci, oc| {
            oc.copy_from_slice(&xs[ci * ELEMWISE_CHUNK..][..oc.len()]);
        });
        Ok(())
    })
}

fn same_dtype_out<'o>(
    ctx: &Ctx<'_>,
    x: &Tensor,
    outputs: &'o mut [Tensor],
) -> KResult<&'o mut Tensor> {
    let out = outputs.first_mut().ok_or_else(|| ctx.err("no output"))?;
    ctx.ensure(out.dtype() == x.dtype(), || {
        format!("the result is {}, the input {}", out.dtype(), x.dtype())
    })?;
    Ok(out)
}

/// `Transpose(x, perm)`.
pub(crate) fn transpose(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let perm = ctx.ints(inputs, 1)?;
    let rank = x.shape.len();
    let mut seen = vec![false; rank];
    let mut p = Vec::with_capacity(rank);
    for &a in &perm {
        let a = ctx.axis(a, rank)?;
        ctx.ensure(!seen[a], || format!("perm {perm:?} repeats axis {a}"))?;
        seen[a] = true;
        p.push(a);
    }
    ctx.ensure(p.len() == rank, || {
        format!("perm {perm:?} is not a permutation of {rank} axes")
    })?;
    let dims: Vec<usize> = p.iter().map(|&a| x.shape[a]).collect();
    let xs = strides(&x.shape);
    let istr: Vec<usize> = p.iter().map(|&a| xs[a]).collect();
    let out = same_dtype_out(ctx, x, outputs)?;
    ctx.check_shape("the result", &out.shape, &dims)?;
    with_any!(x.dtype(), T => {
        let (_, xv) = ctx.view::<T>(x, 0)?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        gather_par(ctx, xv, 0, &dims, &istr, o);
        Ok(())
    })
}

/// `BroadcastTo(x, shape)`: to the result's shape.
pub(crate) fn broadcast_to(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let out = same_dtype_out(ctx, x, outputs)?;
    let dims = out.shape.clone();
    ctx.ensure(x.shape.len() <= dims.len(), || {
        format!("cannot broadcast {:?} to {dims:?}", x.shape)
    })?;
    let lead = dims.len() - x.shape.len();
    let xs = strides(&x.shape);
    let mut istr = vec![0usize; dims.len()];
    for (i, &d) in x.shape.iter().enumerate() {
        if d == dims[lead + i] {
            istr[lead + i] = xs[i];
        } else if d != 1 {
            return Err(ctx.err(format!("cannot broadcast {:?} to {dims:?}", x.shape)));
        }
    }
    with_any!(x.dtype(), T => {
        let (_, xv) = ctx.view::<T>(x, 0)?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        gather_par(ctx, xv, 0, &dims, &istr, o);
        Ok(())
    })
}

/// Per dim `(start, step, count)` of a StridedSlice of `shape` with Python semantics for
/// negative begin / end and positive strides.
fn slice_spec(
    ctx: &Ctx<'_>,
    shape: &[usize],
    begin: &[i64],
    end: &[i64],
    steps: &[i64],
) -> KResult<Vec<(usize, usize, usize)>> {
    for mask in shardc_ir::geometry::SLICE_MASKS {
        let v = ctx.node.attrs.int_or(mask, 0);
        ctx.ensure(v == 0, || format!("{mask} {v} is not supported (only 0)"))?;
    }
    shardc_ir::geometry::slice_spec(shape, begin, end, steps).map_err(|reason| ctx.err(reason))
}

/// `StridedSlice(x, begin, end, strides)`.
pub(crate) fn strided_slice(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let (begin, end, steps) = (
        ctx.ints(inputs, 1)?,
        ctx.ints(inputs, 2)?,
        ctx.ints(inputs, 3)?,
    );
    let spec = slice_spec(ctx, &x.shape, &begin, &end, &steps)?;
    let dims: Vec<usize> = spec.iter().map(|s| s.2).collect();
    let xs = strides(&x.shape);
    let base: usize = spec.iter().zip(&xs).map(|(s, st)| s.0 * st).sum();
    let istr: Vec<usize> = spec.iter().zip(&xs).map(|(s, st)| s.1 * st).collect();
    let out = same_dtype_out(ctx, x, outputs)?;
    ctx.check_shape("the result", &out.shape, &dims)?;
    if out.is_empty() {
        return Ok(());
    }
    with_any!(x.dtype(), T => {
        let (_, xv) = ctx.view::<T>(x, 0)?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        gather_par(ctx, xv, base, &dims, &istr, o);
        Ok(())
    })
}

/// `StridedSliceGrad(dy, shape, begin, end, strides)`: dy scattered into zeros of `shape`.
pub(crate) fn strided_slice_grad(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let dy = ctx.tensor(inputs, 0)?;
    let shape_v = ctx.ints(inputs, 1)?;
    ctx.ensure(shape_v.iter().all(|&d| d >= 0), || {
        format!("negative size in shape {shape_v:?}")
    })?;
    let shape: Vec<usize> = shape_v.iter().map(|&d| d as usize).collect();
    let (begin, end, steps) = (
        ctx.ints(inputs, 2)?,
        ctx.ints(inputs, 3)?,
        ctx.ints(inputs, 4)?,
    );
    let spec = slice_spec(ctx, &shape, &begin, &end, &steps)?;
    let dims: Vec<usize> = spec.iter().map(|s| s.2).collect();
    ctx.check_shape("dy", &dy.shape, &dims)?;
    let out = same_dtype_out(ctx, dy, outputs)?;
    ctx.check_shape("the result", &out.shape, &shape)?;
    let os = strides(&shape);
    let base: usize = spec.iter().zip(&os).map(|(s, st)| s.0 * st).sum();
    let ostr: Vec<usize> = spec.iter().zip(&os).map(|(s, st)| s.1 * st).collect();
    with_any!(dy.dtype(), T => {
        let (_, dv) = ctx.view::<T>(dy, 0)?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        o.fill(T::zero());
        if dv.is_empty() {
            return Ok(());
        }
        let (d, s) = simplify(&dims, &ostr);
        let (n_last, s_last) = (d.last().copied().unwrap_or(1), s.last().copied().unwrap_or(1));
        let outer = if d.is_empty() { &d[..] } else { &d[..d.len() - 1] };
        let outer_s = if s.is_empty() { &s[..] } else { &s[..s.len() - 1] };
        for (row, src) in dv.chunks(n_last).enumerate() {
            let off = base + offset_of(row, outer, outer_s);
            for (b, &v) in src.iter().enumerate() {
                o[off + b * s_last] = v;
            }
        }
        Ok(())
    })
}

/// `Concat(x1, x2, ...)` along attr `axis`.
pub(crate) fn concat(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let xs: Vec<&Tensor> = (0..inputs.len())
        .map(|i| ctx.tensor(inputs, i))
        .collect::<KResult<_>>()?;
    let first = *xs
        .first()
        .ok_or_else(|| ctx.err("Concat needs at least one operand"))?;
    let rank = first.shape.len();
    let axis = ctx.axis(ctx.node.attrs.int_or("axis", 0), rank)?;
    let mut total_len = 0;
    for (i, x) in xs.iter().enumerate() {
        ctx.ensure(
            x.dtype() == first.dtype()
                && x.shape.len() == rank
                && (0..rank).all(|d| d == axis || x.shape[d] == first.shape[d]),
            || {
                format!(
                    "operand {i} ({} {:?}) does not match operand 0 ({} {:?}) off axis {axis}",
                    x.dtype(),
                    x.shape,
                    first.dtype(),
                    first.shape
                )
            },
        )?;
        total_len += x.shape[axis];
    }
    let mut expected = first.shape.clone();
    expected[axis] = total_len;
    let out = same_dtype_out(ctx, first, outputs)?;
    ctx.check_shape("the result", &out.shape, &expected)?;
    let inner: usize = first.shape[axis + 1..].iter().product();
    let row = total_len * inner;
    if out.is_empty() {
        return Ok(());
    }
    with_any!(first.dtype(), T => {
        let parts: Vec<&[T]> = xs
            .iter()
            .enumerate()
            .map(|(i, x)| ctx.view::<T>(x, i).map(|v| v.1))
            .collect::<KResult<_>>()?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        let chunk = chunk_of(row, ELEMWISE_CHUNK);
        let total = o.len();
        for_chunks(ctx.par, o, chunk, total, |ci, oc| {
            for (ri, orow) in oc.chunks_mut(row).enumerate() {
                let outer = ci * chunk / row + ri;
                let mut at = 0;
                for (x, p) in xs.iter().zip(&parts) {
                    let len = x.shape[axis] * inner;
                    orow[at..at + len].copy_from_slice(&p[outer * len..][..len]);
                    at += len;
                }
            }
        });
        Ok(())
    })
}

/// `Split(x)` into `output_num` equal parts along `axis`.
pub(crate) fn split(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let x = ctx.tensor(inputs, 0)?;
    let rank = x.shape.len();
    let axis = ctx.axis(ctx.node.attrs.int_or("axis", 0), rank)?;
    let n = ctx.node.attrs.int_or("output_num", 1);
    ctx.ensure(n >= 1 && x.shape[axis] % n as usize == 0, || {
        format!("output_num {n} does not divide dim {axis} of {:?}", x.shape)
    })?;
    let n = n as usize;
    ctx.ensure(outputs.len() == n, || {
        format!("{n} parts but {} outputs", outputs.len())
    })?;
    let part = x.shape[axis] / n;
    let mut expected = x.shape.clone();
    expected[axis] = part;
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..].iter().product();
    let len = part * inner;
    with_any!(x.dtype(), T => {
        let (_, xv) = ctx.view::<T>(x, 0)?;
        let outs = ctx.outs::<T>(outputs, n)?;
        for (i, (shape, o)) in outs.into_iter().enumerate() {
            ctx.check_shape(&format!("output {i}"), shape, &expected)?;
            if len == 0 {
                continue;
            }
            for (r, orow) in o.chunks_mut(len).enumerate().take(outer) {
                orow.copy_from_slice(&xv[(r * n + i) * len..][..len]);
            }
        }
        Ok(())
    })
}

/// `Gather(params, indices, axis)`. With `global_shape` and `offset` ([`Block`]), `params` is
/// a block of a table split along `axis`: indices are checked against the whole table, and
/// rows outside the block give zeros.
pub(crate) fn gather(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let params = ctx.tensor(inputs, 0)?;
    let (si, idx) = index_tensor(ctx, inputs, 1)?;
    let rank = params.shape.len();
    let axis = if inputs.len() > 2 {
        ctx.int(inputs, 2)?
    } else {
        0
    };
    let axis = ctx.axis(axis, rank)?;
    let dim = params.shape[axis];
    // A block of a table split along `axis` holds rows `lo..lo + dim` of `global`.
    let block = Block::of(&ctx.node.attrs, &params.shape).map_err(|e| ctx.err(e))?;
    let (global, lo) = Block::along(block.as_ref(), axis, dim);
    for i in 0..idx.len() {
        let v = idx.get(i);
        ctx.ensure(v >= 0 && (v as usize) < global, || {
            format!("index {v} (position {i}) is out of range for dim {axis} of size {global}")
        })?;
    }
    let mut expected = params.shape[..axis].to_vec();
    expected.extend_from_slice(si);
    expected.extend_from_slice(&params.shape[axis + 1..]);
    let out = same_dtype_out(ctx, params, outputs)?;
    ctx.check_shape("the result", &out.shape, &expected)?;
    let inner: usize = params.shape[axis + 1..].iter().product();
    let n = idx.len();
    if out.is_empty() {
        return Ok(());
    }
    with_any!(params.dtype(), T => {
        let (_, pv) = ctx.view::<T>(params, 0)?;
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        let chunk = chunk_of(inner, ELEMWISE_CHUNK);
        let total = o.len();
        for_chunks(ctx.par, o, chunk, total, |ci, oc| {
            for (ri, orow) in oc.chunks_mut(inner).enumerate() {
                let r = ci * chunk / inner + ri;
                let (outer, j) = (r / n, r % n);
                match (idx.get(j) as usize).checked_sub(lo).filter(|&k| k < dim) {
                    Some(k) => {
                        let src = (outer * dim + k) * inner;
                        orow.copy_from_slice(&pv[src..src + inner]);
                    }
                    // A row another block of the table holds.
                    None => orow.fill(<T as Elem>::zero()),
                }
            }
        });
        Ok(())
    })
}

/// `UnsortedSegmentSum(x, segment_ids, num_segments)`: negative ids are dropped. With
/// `global_shape` and `offset` ([`Block`]), the result is a block of segments: ids are checked
/// against the global count, and those outside the block are skipped.
pub(crate) fn unsorted_segment_sum<T: Real>(
    ctx: &Ctx<'_>,
    inputs: &[Arg<'_>],
    outputs: &mut [Tensor],
) -> KResult {
    let (sx, x) = ctx.data::<T>(inputs, 0)?;
    let (sids, ids) = index_tensor(ctx, inputs, 1)?;
    let num = ctx.int(inputs, 2)?;
    ctx.ensure(num >= 0, || format!("num_segments {num} is negative"))?;
    let num = num as usize;
    ctx.ensure(sids.len() <= sx.len() && sx[..sids.len()] == *sids, || {
        format!("segment_ids shape {sids:?} is not a prefix of x's shape {sx:?}")
    })?;
    let inner: usize = sx[sids.len()..].iter().product();
    let mut expected = vec![num];
    expected.extend_from_slice(&sx[sids.len()..]);
    let out_shape = ctx.out_shape(outputs, 0)?;
    ctx.check_shape("the result", &out_shape, &expected)?;
    // A block of a result split along the segments holds segments `lo..lo + num` of `global`.
    let block = Block::of(&ctx.node.attrs, &expected).map_err(|e| ctx.err(e))?;
    let (global, lo) = Block::along(block.as_ref(), 0, num);
    for i in 0..ids.len() {
        let v = ids.get(i);
        ctx.ensure(v < global as i64, || {
            format!("segment id {v} (position {i}) is not below num_segments {global}")
        })?;
    }
    let lo = lo as i64;
    let out = ctx.out::<T>(outputs, 0)?;
    if out.is_empty() {
        return Ok(());
    }
    // Each task owns a fixed range of segments and adds x's rows in index order.
    let chunk = chunk_of(inner, ELEMWISE_CHUNK);
    let rows_per = chunk / inner.max(1);
    for_chunks(ctx.par, out, chunk, x.len() + num * inner, |ci, oc| {
        oc.fill(T::ZERO);
        let s0 = ci * rows_per;
        let s1 = s0 + oc.len() / inner.max(1);
        for i in 0..ids.len() {
            let id = ids.get(i) - lo;
            if id < s0 as i64 || id >= s1 as i64 {
                continue;
            }
            let dst = &mut oc[(id as usize - s0) * inner..][..inner];
            for (d, &v) in dst.iter_mut().zip(&x[i * inner..][..inner]) {
                *d += v;
            }
        }
    });
    Ok(())
}

/// `OneHot(indices, depth, on_value, off_value)` along attr `axis` (-1: last).
pub(crate) fn one_hot(ctx: &Ctx<'_>, inputs: &[Arg<'_>], outputs: &mut [Tensor]) -> KResult {
    let (si, idx) = index_tensor(ctx, inputs, 0)?;
    let depth = ctx.int(inputs, 1)?;
    ctx.ensure(depth >= 0, || format!("depth {depth} is negative"))?;
    let depth = depth as usize;
    let on = ctx.scalar(inputs, 2)?;
    let off = ctx.scalar(inputs, 3)?;
    let rank = si.len();
    let axis = ctx.node.attrs.int_or("axis", -1);
    ctx.ensure(axis >= -1 && axis <= rank as i64, || {
        format!("axis {axis} is out of range for indices of rank {rank}")
    })?;
    let axis = if axis == -1 { rank } else { axis as usize };
    let mut expected = si[..axis].to_vec();
    expected.push(depth);
    expected.extend_from_slice(&si[axis..]);
    let out = outputs.first_mut().ok_or_else(|| ctx.err("no output"))?;
    ctx.check_shape("the result", &out.shape, &expected)?;
    let inner: usize = si[axis..].iter().product();
    let block = depth * inner;
    if out.is_empty() {
        return Ok(());
    }
    let dtype = out.dtype();
    with_any!(dtype, T => {
        let o = T::slice_mut(&mut out.data).ok_or_else(|| ctx.err("internal: output type"))?;
        let (on, off) = (T::from_f64(on), T::from_f64(off));
        let chunk = chunk_of(block, ELEMWISE_CHUNK);
        let total = o.len();
        for_chunks(ctx.par, o, chunk, total, |ci, oc| {
            for (bi, ob) in oc.chunks_mut(block).enumerate() {
                let outer = ci * chunk / block + bi;
                ob.fill(off);
                for i in 0..inner {
                    let v = idx.get(outer * inner + i);
                    if v >= 0 && (v as usize) < depth {
                        ob[v as usize * inner + i] = on;
                    }
                }
            }
        });
        Ok(())
    })
}
