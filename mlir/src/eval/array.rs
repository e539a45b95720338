//! Host arrays of the evaluator: a shape, row-major `f64` data, the element type it stands for
//! (every stored value rounded to it).

use super::ir::Elem;

/// A tensor value.
#[derive(Clone, Debug, PartialEq)]
pub struct Arr {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Row-major elements.
    pub data: Vec<f64>,
    /// What they stand for.
    pub elem: Elem,
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f` with every multi-index of `shape` in row-major order.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl Arr {
    /// A tensor of `shape` filled with `v`.
    pub fn full(shape: &[usize], v: f64, elem: Elem) -> Arr {
        Arr {
            shape: shape.to_vec(),
            data: vec![elem.round(v); shape.iter().product()],
            elem,
        }
    }

    /// The flat offset of a multi-index.
    pub fn offset(&self, idx: &[usize]) -> usize {
        idx.iter()
            .zip(strides(&self.shape))
            .map(|(i, s)| i * s)
            .sum()
    }

    /// The block at `offsets` of `sizes` with `steps`, or `None` when it leaves the tensor.
    pub fn slice(&self, offsets: &[usize], sizes: &[usize], steps: &[usize]) -> Option<Arr> {
        if offsets.len() != self.shape.len() || sizes.len() != offsets.len() {
            return None;
        }
        for d in 0..self.shape.len() {
            let st = steps.get(d).copied().unwrap_or(1);
            if sizes[d] > 0 && offsets[d] + (sizes[d] - 1) * st >= self.shape[d] {
                return None;
            }
        }
        let mut data = Vec::with_capacity(sizes.iter().product());
        let str_ = strides(&self.shape);
        for_each_index(sizes, |i| {
            let o: usize = (0..i.len())
                .map(|d| (offsets[d] + i[d] * steps.get(d).copied().unwrap_or(1)) * str_[d])
                .sum();
            data.push(self.data[o]);
        });
        Some(Arr {
            shape: sizes.to_vec(),
            data,
            elem: self.elem,
        })
    }

    /// This tensor with `src` written at `offsets` (with `steps`), or `None` when it leaves it.
    pub fn insert(&self, src: &Arr, offsets: &[usize], steps: &[usize]) -> Option<Arr> {
        let mut out = self.clone();
        let str_ = strides(&self.shape);
        if offsets.len() != self.shape.len() || src.shape.len() != offsets.len() {
            return None;
        }
        for (d, (&n, (&o, &m))) in self
            .shape
            .iter()
            .zip(offsets.iter().zip(&src.shape))
            .enumerate()
        {
            let st = steps.get(d).copied().unwrap_or(1);
            if m > 0 && o + (m - 1) * st >= n {
                return None;
            }
        }
        let mut k = 0;
        for_each_index(&src.shape, |i| {
            let o: usize = (0..i.len())
                .map(|d| (offsets[d] + i[d] * steps.get(d).copied().unwrap_or(1)) * str_[d])
                .sum();
            out.data[o] = src.data[k];
            k += 1;
        });
        Some(out)
    }

    /// Part `k` of `parts` equal parts along `axis`.
    pub fn chunk(&self, axis: usize, parts: usize, k: usize) -> Option<Arr> {
        let n = *self.shape.get(axis)?;
        if parts == 0 || n % parts != 0 {
            return None;
        }
        let mut offs = vec![0; self.shape.len()];
        let mut sizes = self.shape.clone();
        offs[axis] = k * (n / parts);
        sizes[axis] = n / parts;
        self.slice(&offs, &sizes, &[])
    }

    /// `parts` concatenated along `axis`.
    pub fn concat(parts: &[&Arr], axis: usize) -> Option<Arr> {
        let first = parts.first()?;
        let mut shape = first.shape.clone();
        let total: usize = parts
            .iter()
            .map(|p| p.shape.get(axis).copied().unwrap_or(0))
            .sum();
        *shape.get_mut(axis)? = total;
        let mut out = Arr::full(&shape, 0.0, first.elem);
        let mut at = 0;
        for p in parts {
            let mut offs = vec![0; shape.len()];
            offs[axis] = at;
            out = out.insert(p, &offs, &[])?;
            at += p.shape[axis];
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_chunks_and_concats() {
        let a = Arr {
            shape: vec![2, 4],
            data: (0..8).map(f64::from).collect(),
            elem: Elem::F32,
        };
        let s = a.slice(&[0, 1], &[2, 2], &[1, 2]).unwrap();
        assert_eq!(s.data, vec![1.0, 3.0, 5.0, 7.0]);
        assert!(a.slice(&[1, 3], &[2, 1], &[]).is_none());
        let c0 = a.chunk(1, 2, 0).unwrap();
        let c1 = a.chunk(1, 2, 1).unwrap();
        assert_eq!(c1.data, vec![2.0, 3.0, 6.0, 7.0]);
        assert_eq!(Arr::concat(&[&c0, &c1], 1).unwrap(), a);
        let z = Arr::full(&[2, 4], 0.0, Elem::F32);
        let w = z.insert(&c1, &[0, 2], &[]).unwrap();
        assert_eq!(w.data, vec![0.0, 0.0, 2.0, 3.0, 0.0, 0.0, 6.0, 7.0]);
    }
}
