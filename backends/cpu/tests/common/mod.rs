//! Test helpers: a case builder that runs one node on the CPU backend, a deterministic RNG,
//! comparisons.

#![allow(dead_code)]

use shardc_backend_cpu::CpuBackend;
use shardc_ir::{Attr, Const, DType, Node, NodeId, OpKind, Operand, TensorType, Type};
use shardc_runtime::{Arg, Backend, Data, KernelContext, KernelError, Tensor};

/// xorshift64*: deterministic test data without extra dependencies.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    pub fn vec(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// A Float64 tensor.
pub fn t64(shape: &[usize], v: Vec<f64>) -> Tensor {
    Tensor::from_f64(shape.to_vec(), v).expect("test tensor size")
}

/// A random Float64 tensor with values in `[lo, hi)`.
pub fn rand64(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    t64(shape, rng.vec(numel(shape), lo, hi))
}

/// A tensor converted to Float32 (floats only; others unchanged).
pub fn to_f32(t: &Tensor) -> Tensor {
    match &t.data {
        Data::F64(v) => Tensor {
            shape: t.shape.clone(),
            data: Data::F32(v.iter().map(|&x| x as f32).collect()),
        },
        _ => t.clone(),
    }
}

/// An operand of a case.
#[derive(Clone, Debug)]
pub enum In {
    T(Tensor),
    C(Const),
}

/// One node with its operands and result types, ready to run.
#[derive(Clone, Debug)]
pub struct Case {
    pub node: Node,
    pub args: Vec<In>,
    pub outs: Vec<TensorType>,
    pub step: u64,
}

pub fn op(kind: OpKind) -> Case {
    let mut node = Node::new(kind, Vec::new());
    node.instance = format!("{}-test", kind.name().to_lowercase());
    Case {
        node,
        args: Vec::new(),
        outs: Vec::new(),
        step: 0,
    }
}

impl Case {
    pub fn attr(mut self, key: &str, value: Attr) -> Self {
        self.node.attrs.set(key, value);
        self
    }
    pub fn t(mut self, t: Tensor) -> Self {
        self.node
            .inputs
            .push(Operand::Node(NodeId(self.args.len() as u32)));
        self.args.push(In::T(t));
        self
    }
    pub fn c(mut self, c: Const) -> Self {
        self.node.inputs.push(Operand::Const(c.clone()));
        self.args.push(In::C(c));
        self
    }
    pub fn out(mut self, dtype: DType, shape: &[usize]) -> Self {
        self.outs.push(TensorType::new(dtype, shape.to_vec()));
        self.node.ty = if self.outs.len() == 1 {
            Type::Tensor(self.outs[0].clone())
        } else {
            Type::Tuple(self.outs.clone())
        };
        self
    }
    pub fn step(mut self, step: u64) -> Self {
        self.step = step;
        self
    }

    /// Runs on `backend`, with every output pre-filled with garbage.
    pub fn run_on(&self, backend: &CpuBackend) -> Result<Vec<Tensor>, KernelError> {
        let args: Vec<Arg<'_>> = self
            .args
            .iter()
            .map(|a| match a {
                In::T(t) => Arg::Tensor(t),
                In::C(c) => Arg::Const(c),
            })
            .collect();
        let mut outs: Vec<Tensor> = self
            .outs
            .iter()
            .map(|ty| {
                let mut t = Tensor::zeros(ty);
                match &mut t.data {
                    Data::F32(v) => v.fill(f32::NAN),
                    Data::F64(v) => v.fill(f64::NAN),
                    Data::F16(v) => v.fill(half::f16::NAN),
                    Data::BF16(v) => v.fill(half::bf16::NAN),
                    Data::I32(v) => v.fill(-12345),
                    Data::I64(v) => v.fill(-12345),
                    Data::Bool(v) => v.fill(true),
                }
                t
            })
            .collect();
        let ctx = KernelContext {
            step: self.step,
            rank: 0,
        };
        backend.run(&self.node, &args, &mut outs, &ctx)?;
        Ok(outs)
    }

    /// Runs on a serial backend and panics on error.
    pub fn run(&self) -> Vec<Tensor> {
        self.run_on(&CpuBackend::with_threads(1))
            .unwrap_or_else(|e| panic!("{} failed: {e}", self.node.op))
    }

    /// The same case in Float32 (every Float64 operand and result converted).
    pub fn as_f32(&self) -> Case {
        let mut c = self.clone();
        for a in &mut c.args {
            if let In::T(t) = a {
                *t = to_f32(t);
            }
        }
        for o in &mut c.outs {
            if o.dtype == DType::Float64 {
                o.dtype = DType::Float32;
            }
        }
        c
    }
}

/// Asserts `|got - want| <= tol * (1 + |want|)` elementwise.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || (g - w).abs() <= tol * (1.0 + w.abs()) || g == w;
        assert!(ok, "{what}: element {i}: got {g}, want {w} (tol {tol})");
    }
}

/// Runs `case` (Float64) and its Float32 twin, comparing each result with `want`.
pub fn check(case: &Case, want: &[Vec<f64>]) {
    check_tol(case, want, 1e-10, 2e-4);
}

/// [`check`] with explicit tolerances.
pub fn check_tol(case: &Case, want: &[Vec<f64>], tol64: f64, tol32: f64) {
    let name = case.node.op.name();
    let got = case.run();
    assert_eq!(got.len(), want.len(), "{name}: number of results");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape, case.outs[i].shape);
        assert_close(&format!("{name} f64 result {i}"), &g.to_f64_vec(), w, tol64);
    }
    let c32 = case.as_f32();
    let got32 = c32.run();
    for (i, (g, w)) in got32.iter().zip(want).enumerate() {
        assert_close(&format!("{name} f32 result {i}"), &g.to_f64_vec(), w, tol32);
    }
}

pub fn ints(v: &[i64]) -> Const {
    Const::Ints(v.to_vec())
}

pub fn attr_ints(v: &[i64]) -> Attr {
    Attr::ints(v)
}

pub fn word(s: &str) -> Attr {
    Attr::Str(s.to_string())
}

/// Row-major strides.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The multi-index of flat index `i`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

/// The flat index of a multi-index.
pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum()
}

/// Numerical gradient of `sum(dy * f(x))` w.r.t. `x` by central differences.
pub fn numeric_grad(x: &[f64], dy: &[f64], h: f64, f: impl Fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            xp[i] = x[i] + h;
            let lp: f64 = f(&xp).iter().zip(dy).map(|(a, b)| a * b).sum();
            xp[i] = x[i] - h;
            let lm: f64 = f(&xp).iter().zip(dy).map(|(a, b)| a * b).sum();
            xp[i] = x[i];
            (lp - lm) / (2.0 * h)
        })
        .collect()
}
