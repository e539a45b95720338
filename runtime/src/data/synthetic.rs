//! Seeded random batches for every data input of a graph, as the tutorials' fake data sets.
//!
//! A fixed pool of batches is generated once and cycled, so a model can fit it and its loss
//! falls. Float inputs are standard normal, except regression targets: a float input of shape
//! `(batch, m)` after a first float input `(batch, n)` is a fixed random linear function of it
//! (`x @ T / sqrt(n)` plus 10 % noise), so an MSE loss has something to learn; integer inputs are drawn from the range their
//! consumer accepts (the class count of a sparse cross-entropy, the depth of a OneHot, the rows
//! of a Gather table), or {0, 1} when no consumer says.

use super::DataError;
use crate::tensor::{Data, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use shardc_ir::{DType, Graph, OpKind, Operand, ParamId, ParamKind};

/// A cycled pool of seeded batches for a graph's data inputs.
#[derive(Clone, Debug)]
pub struct SyntheticData {
    names: Vec<String>,
    batches: Vec<Vec<Tensor>>,
}

/// The exclusive upper bound of values an integer input may take, from its consumers.
fn int_range(graph: &Graph, pid: ParamId) -> i64 {
    let mut bound: Option<i64> = None;
    let mut tighten = |b: i64| {
        if b > 0 {
            bound = Some(bound.map_or(b, |x| x.min(b)));
        }
    };
    for node in &graph.nodes {
        for (i, operand) in node.inputs.iter().enumerate() {
            if *operand != Operand::Param(pid) {
                continue;
            }
            match (node.op, i) {
                (OpKind::SparseSoftmaxCrossEntropyWithLogits, 1) => {
                    if let Some(t) = node
                        .inputs
                        .first()
                        .and_then(|o| graph.operand_tensor_type(o))
                    {
                        if let Some(&c) = t.shape.last() {
                            tighten(c as i64);
                        }
                    }
                }
                (OpKind::OneHot, 0) => {
                    if let Some(d) = node
                        .inputs
                        .get(1)
                        .and_then(Operand::as_const)
                        .and_then(|c| c.as_int())
                    {
                        tighten(d);
                    }
                }
                (OpKind::Gather, 1) => {
                    let table = node
                        .inputs
                        .first()
                        .and_then(|o| graph.operand_tensor_type(o));
                    let axis = node
                        .inputs
                        .get(2)
                        .and_then(Operand::as_const)
                        .and_then(|c| c.as_int())
                        .unwrap_or(0);
                    if let Some(t) = table {
                        let r = t.rank() as i64;
                        let a = if axis < 0 { axis + r } else { axis };
                        if let Some(&n) = usize::try_from(a).ok().and_then(|a| t.shape.get(a)) {
                            tighten(n as i64);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    bound.unwrap_or(2)
}

/// Replaces regression targets in `batch` by a fixed linear function of the first input.
fn teach(inputs: &[(ParamId, &shardc_ir::Param)], batch: &mut [Tensor], rng: &mut ChaCha8Rng) {
    let Some(x) = batch.first().cloned() else {
        return;
    };
    let (&[b, n], Some(xs)) = (x.shape.as_slice(), x.as_f32()) else {
        return;
    };
    for (i, (pid, p)) in inputs.iter().enumerate().skip(1) {
        let (&[bb, m], DType::Float32) = (p.ty.shape.as_slice(), p.ty.dtype) else {
            continue;
        };
        if bb != b {
            continue;
        }
        // The teacher matrix depends only on the input's position, not on the batch.
        let mut trng = ChaCha8Rng::seed_from_u64(0x7eac_4e00 ^ u64::from(pid.0));
        let t: Vec<f32> = (0..n * m)
            .map(|_| StandardNormal.sample(&mut trng))
            .collect();
        let scale = 1.0 / (n as f32).sqrt();
        let mut y = vec![0f32; b * m];
        for r in 0..b {
            for k in 0..n {
                let xv = xs[r * n + k] * scale;
                for c in 0..m {
                    y[r * m + c] += xv * t[k * m + c];
                }
            }
        }
        for v in &mut y {
            let noise: f32 = StandardNormal.sample(rng);
            *v += 0.1 * noise;
        }
        batch[i] = Tensor {
            shape: vec![b, m],
            data: Data::F32(y),
        };
    }
}

impl SyntheticData {
    /// Generates `pool` batches for every data input of `graph` from `seed`.
    pub fn new(graph: &Graph, seed: u64, pool: usize) -> Result<SyntheticData, DataError> {
        let pool = pool.max(1);
        let inputs: Vec<(ParamId, &shardc_ir::Param)> = graph
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| p.kind == ParamKind::Input)
            .map(|(i, p)| (ParamId(i as u32), p))
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut batches = Vec::with_capacity(pool);
        for _ in 0..pool {
            let mut batch = Vec::with_capacity(inputs.len());
            for &(pid, p) in &inputs {
                let n = p.ty.num_elements();
                let data = match p.ty.dtype {
                    DType::Float32 => Data::F32((0..n).map(|_| StandardNormal.sample(&mut rng)).collect()),
                    DType::Float64 => Data::F64((0..n).map(|_| StandardNormal.sample(&mut rng)).collect()),
                    DType::Int32 => {
                        let hi = int_range(graph, pid);
                        Data::I32((0..n).map(|_| rng.random_range(0..hi) as i32).collect())
                    }
                    DType::Int64 => {
                        let hi = int_range(graph, pid);
                        Data::I64((0..n).map(|_| rng.random_range(0..hi)).collect())
                    }
                    DType::Bool => Data::Bool((0..n).map(|_| rng.random::<bool>()).collect()),
                    other => {
                        return Err(DataError::Mismatch(format!(
                            "input '{}' has dtype {other}: synthetic data is made for Float32, Float64, Int32, Int64 and Bool inputs",
                            p.name
                        )))
                    }
                };
                batch.push(Tensor {
                    shape: p.ty.shape.clone(),
                    data,
                });
            }
            teach(&inputs, &mut batch, &mut rng);
            batches.push(batch);
        }
        Ok(SyntheticData {
            names: inputs.iter().map(|(_, p)| p.name.clone()).collect(),
            batches,
        })
    }

    /// The feeds of `step` (batches cycle through the pool), as `(input name, tensor)`.
    pub fn feeds(&self, step: u64) -> Vec<(&str, Tensor)> {
        let b = &self.batches[(step as usize) % self.batches.len()];
        self.names
            .iter()
            .map(String::as_str)
            .zip(b.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::{Const, Init, Node, Param, TensorType, Type};

    #[test]
    fn labels_respect_the_class_count_and_pool_cycles() {
        let mut g = Graph::new("t");
        let x = g.add_param(Param {
            name: "x".into(),
            ty: TensorType::new(DType::Float32, vec![4, 3]),
            kind: ParamKind::Input,
        });
        let y = g.add_param(Param {
            name: "y".into(),
            ty: TensorType::new(DType::Int32, vec![4]),
            kind: ParamKind::Input,
        });
        let w = g.add_param(Param {
            name: "w".into(),
            ty: TensorType::new(DType::Float32, vec![3, 3]),
            kind: ParamKind::Weight {
                init: Init::Zeros,
                requires_grad: true,
            },
        });
        let mut mm = Node::new(OpKind::MatMul, vec![x.into(), w.into()]);
        mm.ty = Type::Tensor(TensorType::new(DType::Float32, vec![4, 3]));
        let mm = g.push_node(mm);
        let mut ce = Node::new(
            OpKind::SparseSoftmaxCrossEntropyWithLogits,
            vec![mm.into(), y.into()],
        );
        ce.ty = Type::Tensor(TensorType::scalar(DType::Float32));
        g.push_node(ce);
        let _ = Const::Int(0);
        let data = SyntheticData::new(&g, 3, 2).unwrap();
        let f0 = data.feeds(0);
        assert_eq!(f0.len(), 2);
        assert_eq!(f0[0].0, "x");
        let labels = f0[1].1.to_f64_vec();
        assert!(labels.iter().all(|&l| (0.0..3.0).contains(&l)));
        assert_eq!(data.feeds(2)[0].1, f0[0].1);
        assert_ne!(data.feeds(1)[0].1, f0[0].1);
    }
}
