//! Shared helpers of the runtime tests: a naive test backend for a handful of ops, a tiny
//! graph builder, a reference interpreter that allocates fresh tensors for every value, and
//! a synthetic deep-MLP training graph.

#![allow(dead_code)]

use shardc_ir::{
    Attr, Attrs, Const, DType, Graph, Init, Node, OpKind, Operand, Param, ParamKind, TensorType,
    Type,
};
use shardc_runtime::{Arg, Backend, Data, KernelContext, KernelError, Tensor};
use std::collections::HashMap;

/// Naive f64 kernels for MatMul, Add, Sub, Mul, ReLU, ReluGrad, Square, ReduceSum (all axes)
/// and Split (axis 0), on Float32 and Float64 tensors.
pub struct TestBackend;

fn values(arg: &Arg<'_>) -> Option<(Vec<usize>, Vec<f64>)> {
    match arg {
        Arg::Tensor(t) => Some((t.shape.clone(), t.to_f64_vec())),
        Arg::Const(c) => c.as_f64().map(|v| (Vec::new(), vec![v])),
    }
}

fn write(node: &Node, out: &mut Tensor, vals: &[f64]) -> Result<(), KernelError> {
    match &mut out.data {
        Data::F32(v) if v.len() == vals.len() => {
            for (o, x) in v.iter_mut().zip(vals) {
                *o = *x as f32;
            }
        }
        Data::F64(v) if v.len() == vals.len() => v.copy_from_slice(vals),
        _ => {
            return Err(KernelError::new(
                node,
                format!(
                    "output {:?} of {} elements cannot take {} values",
                    out.dtype(),
                    out.len(),
                    vals.len()
                ),
            ))
        }
    }
    Ok(())
}

/// Elementwise binary op with broadcasting of a scalar or a trailing vector.
fn binary(
    node: &Node,
    a: &(Vec<usize>, Vec<f64>),
    b: &(Vec<usize>, Vec<f64>),
    f: impl Fn(f64, f64) -> f64,
) -> Result<Vec<f64>, KernelError> {
    let (big, small, swapped) = if a.1.len() >= b.1.len() {
        (a, b, false)
    } else {
        (b, a, true)
    };
    if small.1.is_empty() || big.1.len() % small.1.len() != 0 {
        return Err(KernelError::new(node, "shapes do not broadcast"));
    }
    let m = small.1.len();
    Ok(big
        .1
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let y = small.1[i % m];
            if swapped {
                f(y, x)
            } else {
                f(x, y)
            }
        })
        .collect())
}

impl Backend for TestBackend {
    fn name(&self) -> &str {
        "test"
    }

    fn run(
        &self,
        node: &Node,
        inputs: &[Arg<'_>],
        outputs: &mut [Tensor],
        _ctx: &KernelContext,
    ) -> Result<(), KernelError> {
        let arg = |i: usize| {
            inputs
                .get(i)
                .and_then(values)
                .ok_or_else(|| KernelError::new(node, format!("operand {i} missing")))
        };
        let out = match node.op {
            OpKind::MatMul => {
                let (sa, a) = arg(0)?;
                let (sb, b) = arg(1)?;
                let ta = node.attrs.bool_or("transpose_a", false);
                let tb = node.attrs.bool_or("transpose_b", false);
                let (m, k) = if ta { (sa[1], sa[0]) } else { (sa[0], sa[1]) };
                let n = if tb { sb[0] } else { sb[1] };
                let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] };
                let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] };
                let mut c = vec![0.0; m * n];
                for i in 0..m {
                    for j in 0..n {
                        c[i * n + j] = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
                    }
                }
                c
            }
            OpKind::Add => binary(node, &arg(0)?, &arg(1)?, |x, y| x + y)?,
            OpKind::Sub => binary(node, &arg(0)?, &arg(1)?, |x, y| x - y)?,
            OpKind::Mul => binary(node, &arg(0)?, &arg(1)?, |x, y| x * y)?,
            OpKind::ReLU => arg(0)?.1.iter().map(|&x| x.max(0.0)).collect(),
            OpKind::ReluGrad => binary(
                node,
                &arg(0)?,
                &arg(1)?,
                |dy, y| {
                    if y > 0.0 {
                        dy
                    } else {
                        0.0
                    }
                },
            )?,
            OpKind::Square => arg(0)?.1.iter().map(|&x| x * x).collect(),
            OpKind::ReduceSum => vec![arg(0)?.1.iter().sum()],
            OpKind::Split => {
                let (_, x) = arg(0)?;
                let parts = outputs.len();
                let each = x.len() / parts.max(1);
                for (k, out) in outputs.iter_mut().enumerate() {
                    write(node, out, &x[k * each..(k + 1) * each])?;
                }
                return Ok(());
            }
            other => {
                return Err(KernelError::new(
                    node,
                    format!("the test backend has no kernel for {other}"),
                ))
            }
        };
        let first = outputs
            .first_mut()
            .ok_or_else(|| KernelError::new(node, "no output"))?;
        write(node, first, &out)
    }
}

/// A tiny graph builder: every op's result type is given by the caller.
pub struct Builder {
    pub g: Graph,
    count: usize,
}

impl Builder {
    pub fn new(name: &str) -> Self {
        Builder {
            g: Graph::new(name),
            count: 0,
        }
    }

    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Operand {
        Operand::Param(self.g.add_param(Param {
            name: name.into(),
            ty: TensorType::new(dtype, shape.to_vec()),
            kind: ParamKind::Input,
        }))
    }

    pub fn weight(&mut self, name: &str, dtype: DType, shape: &[usize], init: Init) -> Operand {
        Operand::Param(self.g.add_param(Param {
            name: name.into(),
            ty: TensorType::new(dtype, shape.to_vec()),
            kind: ParamKind::Weight {
                init,
                requires_grad: true,
            },
        }))
    }

    pub fn ty(&self, o: &Operand) -> TensorType {
        self.g
            .operand_tensor_type(o)
            .cloned()
            .expect("a tensor operand")
    }

    pub fn op(&mut self, op: OpKind, inputs: Vec<Operand>, attrs: Attrs, ty: Type) -> Operand {
        self.count += 1;
        let mut node = Node::new(op, inputs);
        node.attrs = attrs;
        node.ty = ty;
        node.instance = format!("{}{}", op.name().to_lowercase(), self.count);
        Operand::Node(self.g.push_node(node))
    }

    /// An op whose result has the type of its first operand.
    pub fn same(&mut self, op: OpKind, inputs: Vec<Operand>) -> Operand {
        let ty = self.ty(&inputs[0]);
        self.op(op, inputs, Attrs::new(), Type::Tensor(ty))
    }

    pub fn matmul(&mut self, a: Operand, b: Operand, ta: bool, tb: bool) -> Operand {
        let (sa, sb) = (self.ty(&a), self.ty(&b));
        let m = if ta { sa.shape[1] } else { sa.shape[0] };
        let n = if tb { sb.shape[0] } else { sb.shape[1] };
        let attrs = Attrs::new()
            .with("transpose_a", Attr::Bool(ta))
            .with("transpose_b", Attr::Bool(tb));
        self.op(
            OpKind::MatMul,
            vec![a, b],
            attrs,
            Type::Tensor(TensorType::new(sa.dtype, vec![m, n])),
        )
    }

    pub fn reduce_sum(&mut self, x: Operand) -> Operand {
        let dtype = self.ty(&x).dtype;
        self.op(
            OpKind::ReduceSum,
            vec![x, Operand::Const(Const::Ints(vec![]))],
            Attrs::new(),
            Type::Tensor(TensorType::scalar(dtype)),
        )
    }

    pub fn assign(&mut self, param: Operand, value: Operand) -> Operand {
        let ty = self.ty(&param);
        self.op(
            OpKind::Assign,
            vec![param, value],
            Attrs::new(),
            Type::Tensor(ty),
        )
    }

    pub fn finish(mut self, outputs: Vec<Operand>) -> Graph {
        self.g.outputs = outputs;
        self.g
    }
}

/// A deep-MLP training step: `widths[0]` inputs, ReLU hidden layers, a squared-error loss,
/// hand-written backward pass and SGD updates (each right after its layer's backward when
/// `interleave`, otherwise all at the end).
pub fn mlp_train_graph(batch: usize, widths: &[usize], dtype: DType, interleave: bool) -> Graph {
    let mut b = Builder::new("Mlp");
    let layers = widths.len() - 1;
    let x = b.input("x", dtype, &[batch, widths[0]]);
    let label = b.input("label", dtype, &[batch, widths[layers]]);
    let ws: Vec<Operand> = (0..layers)
        .map(|k| {
            b.weight(
                &format!("w{}", k + 1),
                dtype,
                &[widths[k], widths[k + 1]],
                Init::XavierUniform {
                    gain: 1.0,
                    seed: k as u64 + 1,
                },
            )
        })
        .collect();
    let mut hs = vec![x];
    for (k, w) in ws.iter().enumerate() {
        let z = b.matmul(hs[k].clone(), w.clone(), false, false);
        let h = if k + 1 < layers {
            b.same(OpKind::ReLU, vec![z])
        } else {
            z
        };
        hs.push(h);
    }
    let diff = b.same(OpKind::Sub, vec![hs[layers].clone(), label]);
    let sq = b.same(OpKind::Square, vec![diff.clone()]);
    let loss = b.reduce_sum(sq);
    let mut d = b.same(OpKind::Mul, vec![diff, Operand::Const(Const::Float(2.0))]);
    let mut pending = Vec::new();
    for k in (0..layers).rev() {
        let dz = if k + 1 < layers {
            b.same(OpKind::ReluGrad, vec![d.clone(), hs[k + 1].clone()])
        } else {
            d.clone()
        };
        let dw = b.matmul(hs[k].clone(), dz.clone(), true, false);
        if k > 0 {
            d = b.matmul(dz, ws[k].clone(), false, true);
        }
        if interleave {
            let step = b.same(OpKind::Mul, vec![dw, Operand::Const(Const::Float(0.01))]);
            let new_w = b.same(OpKind::Sub, vec![ws[k].clone(), step]);
            b.assign(ws[k].clone(), new_w);
        } else {
            pending.push((k, dw));
        }
    }
    for (k, dw) in pending {
        let step = b.same(OpKind::Mul, vec![dw, Operand::Const(Const::Float(0.01))]);
        let new_w = b.same(OpKind::Sub, vec![ws[k].clone(), step]);
        b.assign(ws[k].clone(), new_w);
    }
    b.finish(vec![loss])
}

/// Deterministic feeds for every input of `graph` (values depend on `step`).
pub fn feeds_for(graph: &Graph, step: u64) -> Vec<(String, Tensor)> {
    graph
        .params
        .iter()
        .filter(|p| p.kind == ParamKind::Input)
        .enumerate()
        .map(|(i, p)| {
            let n = p.ty.num_elements();
            let vals: Vec<f64> = (0..n)
                .map(|j| (((j * 7 + i * 3 + step as usize * 5) % 11) as f64 - 5.0) / 5.0)
                .collect();
            let t = match p.ty.dtype {
                DType::Float64 => Tensor::from_f64(p.ty.shape.clone(), vals),
                _ => Tensor::from_f32(p.ty.shape.clone(), vals.iter().map(|&v| v as f32).collect()),
            }
            .expect("sizes match");
            (p.name.clone(), t)
        })
        .collect()
}

/// A reference interpreter: fresh output tensors for every node, a map of values, weights
/// kept in `weights` between calls. Returns the outputs of one step.
pub fn reference_step(
    graph: &Graph,
    backend: &dyn Backend,
    weights: &mut HashMap<usize, Tensor>,
    feeds: &[(String, Tensor)],
    step: u64,
) -> Vec<Tensor> {
    let mut values: Vec<Vec<Tensor>> = Vec::new();
    let param_value = |p: usize, weights: &HashMap<usize, Tensor>| -> Tensor {
        match weights.get(&p) {
            Some(t) => t.clone(),
            None => {
                let name = &graph.params[p].name;
                feeds
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.clone())
                    .expect("fed")
            }
        }
    };
    for node in &graph.nodes {
        let get = |o: &Operand, weights: &HashMap<usize, Tensor>, values: &Vec<Vec<Tensor>>| match o
        {
            Operand::Node(n) => values[n.index()][0].clone(),
            Operand::Param(p) => param_value(p.index(), weights),
            Operand::Const(_) => unreachable!(),
        };
        match node.op {
            OpKind::TupleGetItem => {
                let (Operand::Node(s), Some(Const::Int(k))) =
                    (&node.inputs[0], node.inputs[1].as_const())
                else {
                    panic!("bad TupleGetItem")
                };
                let v = values[s.index()][*k as usize].clone();
                values.push(vec![v]);
            }
            OpKind::Assign => {
                let Operand::Param(p) = node.inputs[0] else {
                    panic!("bad Assign")
                };
                let v = get(&node.inputs[1], weights, &values);
                weights.insert(p.index(), v.clone());
                values.push(vec![v]);
            }
            _ => {
                let owned: Vec<Option<Tensor>> = node
                    .inputs
                    .iter()
                    .map(|o| match o {
                        Operand::Const(_) => None,
                        other => Some(get(other, weights, &values)),
                    })
                    .collect();
                let args: Vec<Arg<'_>> = node
                    .inputs
                    .iter()
                    .zip(&owned)
                    .map(|(o, t)| match (o, t) {
                        (Operand::Const(c), _) => Arg::Const(c),
                        (_, Some(t)) => Arg::Tensor(t),
                        _ => unreachable!(),
                    })
                    .collect();
                let mut outs: Vec<Tensor> = node.ty.tensors().iter().map(Tensor::zeros).collect();
                backend
                    .run(node, &args, &mut outs, &KernelContext { step, rank: 0 })
                    .expect("reference kernel");
                values.push(outs);
            }
        }
    }
    graph
        .outputs
        .iter()
        .flat_map(|o| match o {
            Operand::Node(n) => values[n.index()].clone(),
            Operand::Param(p) => vec![param_value(p.index(), weights)],
            Operand::Const(_) => unreachable!(),
        })
        .collect()
}

/// Borrowed form of owned feeds.
pub fn borrow(feeds: &[(String, Tensor)]) -> Vec<(&str, Tensor)> {
    feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect()
}
