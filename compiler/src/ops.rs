//! Op primitives with `shard`, reading like MindSpore's `ops`:
//!
//! ```
//! use shardc_compiler::{builder::GraphBuilder, init, ops};
//! use shardc_ir::DType;
//!
//! let mut b = GraphBuilder::new("Net");
//! let x = b.input("x", DType::Float32, &[16, 32])?;
//! let w = b.weight("w", DType::Float32, &[32, 16], init::normal(0.01))?;
//! // MindSpore: self.matmul = ops.MatMul().shard(((2, 4), (4, 1)))
//! let y = ops::MatMul::new().shard(((2, 4), (4, 1))).call(&mut b, x, w)?;
//! let y = ops::ReLU::new().shard(((2, 4),)).call(&mut b, y)?;
//! assert_eq!(b.graph().nodes[0].in_strategy.as_ref().unwrap().to_string(), "((2, 4), (4, 1))");
//! # Ok::<(), shardc_compiler::builder::BuildError>(())
//! ```
//!
//! One struct per op with builder-style attribute setters; every struct has `shard` (the
//! `in_strategy`, anything [`IntoStrategy`]), `out_strategy` and `instance` (the instance name;
//! by default the MindSpore-style name of the op, `matmul`, `matmul2`, ...). `call` adds the
//! node to a [`GraphBuilder`]; a strategy of the wrong arity or rank, or one that does not
//! divide a dimension, is an error naming the instance. Ops without their own struct go
//! through [`Primitive`].

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::strategy::IntoStrategy;
use shardc_ir::{Attr, Attrs, Const, DType, OpKind, Operand, Strategy};

/// Anything usable as an operand of a primitive: a [`Value`], a [`Const`], an [`Operand`],
/// or a Rust number (a scalar constant, `Mul(-1.0, loss)`).
pub trait IntoOperand {
    /// The operand.
    fn into_operand(self) -> Operand;
}

impl IntoOperand for Value {
    fn into_operand(self) -> Operand {
        self.into()
    }
}

impl IntoOperand for Operand {
    fn into_operand(self) -> Operand {
        self
    }
}

impl IntoOperand for Const {
    fn into_operand(self) -> Operand {
        Operand::Const(self)
    }
}

impl IntoOperand for f64 {
    fn into_operand(self) -> Operand {
        Operand::Const(Const::Float(self))
    }
}

impl IntoOperand for f32 {
    fn into_operand(self) -> Operand {
        Operand::Const(Const::Float(f64::from(self)))
    }
}

impl IntoOperand for i64 {
    fn into_operand(self) -> Operand {
        Operand::Const(Const::Int(self))
    }
}

/// A generic primitive: an op kind, its attributes, strategies and instance name. Every typed
/// op below wraps one.
#[derive(Clone, Debug, PartialEq)]
pub struct Primitive {
    op: OpKind,
    attrs: Attrs,
    in_strategy: Option<Strategy>,
    out_strategy: Option<Strategy>,
    instance: Option<String>,
}

impl Primitive {
    /// A primitive of `op` with no attributes (the op's defaults apply).
    pub fn new(op: OpKind) -> Self {
        Primitive {
            op,
            attrs: Attrs::new(),
            in_strategy: None,
            out_strategy: None,
            instance: None,
        }
    }

    /// Sets attribute `key`.
    pub fn attr(mut self, key: &str, value: Attr) -> Self {
        self.attrs.set(key, value);
        self
    }

    /// Sets the `in_strategy`: one entry per tensor operand, one split count per dimension.
    pub fn shard(mut self, strategy: impl IntoStrategy) -> Self {
        self.in_strategy = Some(strategy.into_strategy());
        self
    }

    /// Sets the `out_strategy`.
    pub fn out_strategy(mut self, strategy: impl IntoStrategy) -> Self {
        self.out_strategy = Some(strategy.into_strategy());
        self
    }

    /// Sets the instance name (made unique with a counter if already used in the graph).
    pub fn instance(mut self, name: &str) -> Self {
        self.instance = Some(name.to_string());
        self
    }

    /// MindSpore's `primitive.recompute()`: the node is marked `recompute: true` and replayed
    /// in the backward pass instead of keeping its result (the `recompute` pass).
    pub fn recompute(self) -> Self {
        self.attr("recompute", Attr::Bool(true))
    }

    /// The op kind.
    pub fn op(&self) -> OpKind {
        self.op
    }

    /// The attributes set so far.
    pub fn attrs(&self) -> &Attrs {
        &self.attrs
    }

    /// The `in_strategy`, if set.
    pub fn in_strategy(&self) -> Option<&Strategy> {
        self.in_strategy.as_ref()
    }

    /// The `out_strategy`, if set.
    pub fn get_out_strategy(&self) -> Option<&Strategy> {
        self.out_strategy.as_ref()
    }

    /// Adds the node to `b` with these operands.
    pub fn call(&self, b: &mut GraphBuilder, inputs: &[Operand]) -> Result<Value, BuildError> {
        b.op_full(
            self.op,
            inputs,
            self.attrs.clone(),
            self.instance.as_deref().unwrap_or(""),
            self.in_strategy.clone(),
            self.out_strategy.clone(),
        )
    }
}

macro_rules! primitive {
    ($(#[$doc:meta])* $name:ident, $op:ident $(, $key:literal => $default:expr)*) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name {
            prim: Primitive,
        }

        impl $name {
            /// The primitive with MindSpore's default attributes.
            pub fn new() -> Self {
                #[allow(unused_mut)]
                let mut prim = Primitive::new(OpKind::$op);
                $( prim = prim.attr($key, $default); )*
                $name { prim }
            }

            /// Sets the `in_strategy` (MindSpore's `shard`): one entry per tensor operand.
            pub fn shard(mut self, strategy: impl IntoStrategy) -> Self {
                self.prim = self.prim.shard(strategy);
                self
            }

            /// Sets the `out_strategy`.
            pub fn out_strategy(mut self, strategy: impl IntoStrategy) -> Self {
                self.prim = self.prim.out_strategy(strategy);
                self
            }

            /// Sets the instance name.
            pub fn instance(mut self, name: &str) -> Self {
                self.prim = self.prim.instance(name);
                self
            }

            /// MindSpore's `primitive.recompute()`: replayed in the backward pass.
            pub fn recompute(mut self) -> Self {
                self.prim = self.prim.recompute();
                self
            }

            /// Sets any attribute.
            pub fn attr(mut self, key: &str, value: Attr) -> Self {
                self.prim = self.prim.attr(key, value);
                self
            }

            /// The underlying generic primitive.
            pub fn primitive(&self) -> &Primitive {
                &self.prim
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    };
}

macro_rules! bool_setter {
    ($name:ident, $($setter:ident => $key:literal),*) => {
        impl $name {
            $(
                #[doc = concat!("Sets `", $key, "`.")]
                pub fn $setter(self, v: bool) -> Self {
                    self.attr($key, Attr::Bool(v))
                }
            )*
        }
    };
}

macro_rules! unary_call {
    ($($name:ident),*) => {$(
        impl $name {
            /// Adds the op applied to `x`.
            pub fn call(&self, b: &mut GraphBuilder, x: impl IntoOperand) -> Result<Value, BuildError> {
                self.prim.call(b, &[x.into_operand()])
            }
        }
    )*};
}

macro_rules! binary_call {
    ($($name:ident),*) => {$(
        impl $name {
            /// Adds the op applied to `x` and `y` (values or scalar constants).
            pub fn call(
                &self,
                b: &mut GraphBuilder,
                x: impl IntoOperand,
                y: impl IntoOperand,
            ) -> Result<Value, BuildError> {
                self.prim.call(b, &[x.into_operand(), y.into_operand()])
            }
        }
    )*};
}

macro_rules! reduce_call {
    ($($name:ident),*) => {$(
        bool_setter!($name, keep_dims => "keep_dims");
        impl $name {
            /// Adds the reduction of `x` over `axes` (empty: all axes; negative counts from
            /// the end).
            pub fn call(&self, b: &mut GraphBuilder, x: Value, axes: &[i64]) -> Result<Value, BuildError> {
                self.prim.call(b, &[x.into(), Const::Ints(axes.to_vec()).into()])
            }

            /// Adds the reduction of `x` over one axis, written as a single integer as in
            /// `ops.ReduceSum(keep_dims=True)(x, -1)`.
            pub fn call_axis(&self, b: &mut GraphBuilder, x: Value, axis: i64) -> Result<Value, BuildError> {
                self.prim.call(b, &[x.into(), Const::Int(axis).into()])
            }
        }
    )*};
}

primitive!(
    /// `MatMul(a, b)`: `(m, k) x (k, n) -> (m, n)`, with `transpose_a` / `transpose_b`.
    MatMul, MatMul, "transpose_a" => Attr::Bool(false), "transpose_b" => Attr::Bool(false)
);
bool_setter!(MatMul, transpose_a => "transpose_a", transpose_b => "transpose_b");
binary_call!(MatMul);

primitive!(
    /// `BatchMatMul(a, b)`: batched matrix product, leading dimensions broadcast.
    BatchMatMul, BatchMatMul, "transpose_a" => Attr::Bool(false), "transpose_b" => Attr::Bool(false)
);
bool_setter!(BatchMatMul, transpose_a => "transpose_a", transpose_b => "transpose_b");
binary_call!(BatchMatMul);

primitive!(
    /// `BiasAdd(x, bias)`: adds `bias` along axis 1.
    BiasAdd, BiasAdd
);
binary_call!(BiasAdd);
primitive!(
    /// `Add(a, b)`, broadcasting.
    Add, Add
);
primitive!(
    /// `Sub(a, b)`, broadcasting.
    Sub, Sub
);
primitive!(
    /// `Mul(a, b)`, broadcasting.
    Mul, Mul
);
primitive!(
    /// `RealDiv(a, b)`, broadcasting.
    RealDiv, RealDiv
);
primitive!(
    /// `Equal(a, b)` -> Bool, broadcasting.
    Equal, Equal
);
binary_call!(Add, Sub, Mul, RealDiv, Equal);

primitive!(
    /// `Neg(x)`.
    Neg, Neg
);
primitive!(
    /// `Square(x)`.
    Square, Square
);
primitive!(
    /// `Sqrt(x)`.
    Sqrt, Sqrt
);
primitive!(
    /// `Exp(x)`.
    Exp, Exp
);
primitive!(
    /// `Log(x)`.
    Log, Log
);
primitive!(
    /// `ReLU(x)`.
    ReLU, ReLU
);
primitive!(
    /// `GeLU(x)` (tanh approximation).
    GeLU, GeLU
);
primitive!(
    /// `Sigmoid(x)`.
    Sigmoid, Sigmoid
);
primitive!(
    /// `SiLU(x)`: `x * sigmoid(x)` (MindSpore's `ops.SiLU`).
    SiLU, SiLU
);
primitive!(
    /// `Erf(x)`: the error function (MindSpore's `ops.Erf`).
    Erf, Erf
);
primitive!(
    /// `Tanh(x)`.
    Tanh, Tanh
);
primitive!(
    /// `ZerosLike(x)`.
    ZerosLike, ZerosLike
);
primitive!(
    /// `OnesLike(x)`.
    OnesLike, OnesLike
);
unary_call!(Neg, Square, Sqrt, Exp, Log, ReLU, GeLU, Sigmoid, SiLU, Tanh, Erf, ZerosLike, OnesLike);

primitive!(
    /// `Softmax(x)` along `axis` (-1).
    Softmax, Softmax, "axis" => Attr::Int(-1)
);
primitive!(
    /// `LogSoftmax(x)` along `axis` (-1).
    LogSoftmax, LogSoftmax, "axis" => Attr::Int(-1)
);
unary_call!(Softmax, LogSoftmax);
impl Softmax {
    /// Sets the axis.
    pub fn axis(self, axis: i64) -> Self {
        self.attr("axis", Attr::Int(axis))
    }
}
impl LogSoftmax {
    /// Sets the axis.
    pub fn axis(self, axis: i64) -> Self {
        self.attr("axis", Attr::Int(axis))
    }
}

primitive!(
    /// `Cast(x)` to `dst_type` (Float32 unless set).
    Cast, Cast, "dst_type" => Attr::Str("Float32".into())
);
unary_call!(Cast);
impl Cast {
    /// Sets the destination type.
    pub fn dst_type(self, dtype: DType) -> Self {
        self.attr("dst_type", Attr::Str(dtype.name().to_string()))
    }
}

primitive!(
    /// `ReduceSum(x, axes)`, `keep_dims` (false).
    ReduceSum, ReduceSum, "keep_dims" => Attr::Bool(false)
);
primitive!(
    /// `ReduceMean(x, axes)`, `keep_dims` (false).
    ReduceMean, ReduceMean, "keep_dims" => Attr::Bool(false)
);
primitive!(
    /// `ReduceMax(x, axes)`, `keep_dims` (false).
    ReduceMax, ReduceMax, "keep_dims" => Attr::Bool(false)
);
reduce_call!(ReduceSum, ReduceMean, ReduceMax);

primitive!(
    /// `Reshape(x, shape)`.
    Reshape, Reshape
);
impl Reshape {
    /// Adds `x` reshaped to `shape` (at most one -1).
    pub fn call(&self, b: &mut GraphBuilder, x: Value, shape: &[i64]) -> Result<Value, BuildError> {
        self.prim
            .call(b, &[x.into(), Const::Ints(shape.to_vec()).into()])
    }
}

primitive!(
    /// `Transpose(x, perm)`.
    Transpose, Transpose
);
impl Transpose {
    /// Adds `x` with its axes permuted by `perm`.
    pub fn call(&self, b: &mut GraphBuilder, x: Value, perm: &[i64]) -> Result<Value, BuildError> {
        self.prim
            .call(b, &[x.into(), Const::Ints(perm.to_vec()).into()])
    }
}

primitive!(
    /// `BroadcastTo(x, shape)`.
    BroadcastTo, BroadcastTo
);
impl BroadcastTo {
    /// Adds `x` broadcast to `shape`.
    pub fn call(&self, b: &mut GraphBuilder, x: Value, shape: &[i64]) -> Result<Value, BuildError> {
        self.prim
            .call(b, &[x.into(), Const::Ints(shape.to_vec()).into()])
    }
}

primitive!(
    /// `StridedSlice(x, begin, end, strides)` (masks 0).
    StridedSlice, StridedSlice
);
impl StridedSlice {
    /// Adds the slice `begin..end` by `strides` of `x`.
    pub fn call(
        &self,
        b: &mut GraphBuilder,
        x: Value,
        begin: &[i64],
        end: &[i64],
        strides: &[i64],
    ) -> Result<Value, BuildError> {
        self.prim.call(
            b,
            &[
                x.into(),
                Const::Ints(begin.to_vec()).into(),
                Const::Ints(end.to_vec()).into(),
                Const::Ints(strides.to_vec()).into(),
            ],
        )
    }
}

primitive!(
    /// `Conv2D(x, w)`, NCHW. Set `out_channel` and `kernel_size`; `stride`, `pad_mode`
    /// (`valid` by default, as MindSpore's primitive), `pad`, `dilation`, `group` as needed.
    Conv2D, Conv2D,
    "out_channel" => Attr::Int(1),
    "kernel_size" => Attr::ints(&[1, 1]),
    "pad_mode" => Attr::Str("valid".into()),
    "pad" => Attr::ints(&[0, 0, 0, 0]),
    "stride" => Attr::ints(&[1, 1]),
    "dilation" => Attr::ints(&[1, 1]),
    "group" => Attr::Int(1),
    "data_format" => Attr::Str("NCHW".into())
);
binary_call!(Conv2D);
impl Conv2D {
    /// A convolution with `out_channel` filters of `kernel_size` (kh, kw).
    pub fn with(out_channel: usize, kernel_size: (usize, usize)) -> Self {
        Self::new()
            .out_channel(out_channel)
            .kernel_size(kernel_size)
    }

    /// Sets `out_channel`.
    pub fn out_channel(self, n: usize) -> Self {
        self.attr("out_channel", Attr::Int(n as i64))
    }

    /// Sets `kernel_size` (kh, kw).
    pub fn kernel_size(self, k: (usize, usize)) -> Self {
        self.attr("kernel_size", Attr::ints(&[k.0 as i64, k.1 as i64]))
    }

    /// Sets `stride` (sh, sw).
    pub fn stride(self, s: (usize, usize)) -> Self {
        self.attr("stride", Attr::ints(&[s.0 as i64, s.1 as i64]))
    }

    /// Sets `dilation` (dh, dw).
    pub fn dilation(self, d: (usize, usize)) -> Self {
        self.attr("dilation", Attr::ints(&[d.0 as i64, d.1 as i64]))
    }

    /// Sets `pad_mode`: `valid`, `same` or `pad`.
    pub fn pad_mode(self, mode: &str) -> Self {
        self.attr("pad_mode", Attr::Str(mode.to_string()))
    }

    /// Sets `pad` (top, bottom, left, right), used with `pad_mode` `pad`.
    pub fn pad(self, p: (usize, usize, usize, usize)) -> Self {
        self.attr(
            "pad",
            Attr::ints(&[p.0 as i64, p.1 as i64, p.2 as i64, p.3 as i64]),
        )
    }

    /// Sets `group`.
    pub fn group(self, g: usize) -> Self {
        self.attr("group", Attr::Int(g as i64))
    }
}

primitive!(
    /// `MaxPool(x)`, NCHW: `kernel_size`, `strides`, `pad_mode` (`valid`).
    MaxPool, MaxPool,
    "kernel_size" => Attr::ints(&[1, 1]),
    "strides" => Attr::ints(&[1, 1]),
    "pad_mode" => Attr::Str("valid".into()),
    "data_format" => Attr::Str("NCHW".into())
);
primitive!(
    /// `AvgPool(x)`, NCHW: `kernel_size`, `strides`, `pad_mode` (`valid`).
    AvgPool, AvgPool,
    "kernel_size" => Attr::ints(&[1, 1]),
    "strides" => Attr::ints(&[1, 1]),
    "pad_mode" => Attr::Str("valid".into()),
    "data_format" => Attr::Str("NCHW".into())
);
unary_call!(MaxPool, AvgPool);
macro_rules! pool_setters {
    ($($name:ident),*) => {$(
        impl $name {
            /// Sets `kernel_size` (kh, kw).
            pub fn kernel_size(self, k: (usize, usize)) -> Self {
                self.attr("kernel_size", Attr::ints(&[k.0 as i64, k.1 as i64]))
            }

            /// Sets `strides` (sh, sw).
            pub fn strides(self, s: (usize, usize)) -> Self {
                self.attr("strides", Attr::ints(&[s.0 as i64, s.1 as i64]))
            }

            /// Sets `pad_mode`: `valid` or `same`.
            pub fn pad_mode(self, mode: &str) -> Self {
                self.attr("pad_mode", Attr::Str(mode.to_string()))
            }
        }
    )*};
}
pool_setters!(MaxPool, AvgPool);

primitive!(
    /// `Gather(params, indices, axis)`.
    Gather, Gather
);
impl Gather {
    /// Adds the gather of `indices` from `params` along `axis`.
    pub fn call(
        &self,
        b: &mut GraphBuilder,
        params: Value,
        indices: Value,
        axis: i64,
    ) -> Result<Value, BuildError> {
        self.prim
            .call(b, &[params.into(), indices.into(), Const::Int(axis).into()])
    }
}

primitive!(
    /// `Concat(x1, x2, ...)` along `axis` (0).
    Concat, Concat, "axis" => Attr::Int(0)
);
impl Concat {
    /// Sets the axis.
    pub fn axis(self, axis: i64) -> Self {
        self.attr("axis", Attr::Int(axis))
    }

    /// Adds the concatenation of `xs`.
    pub fn call(&self, b: &mut GraphBuilder, xs: &[Value]) -> Result<Value, BuildError> {
        let inputs: Vec<Operand> = xs.iter().map(|v| v.operand()).collect();
        self.prim.call(b, &inputs)
    }
}

primitive!(
    /// `OneHot(indices, depth, on_value, off_value)` along `axis` (-1).
    OneHot, OneHot, "axis" => Attr::Int(-1)
);
impl OneHot {
    /// Sets the axis.
    pub fn axis(self, axis: i64) -> Self {
        self.attr("axis", Attr::Int(axis))
    }

    /// Adds the one-hot encoding of `indices`.
    pub fn call(
        &self,
        b: &mut GraphBuilder,
        indices: Value,
        depth: i64,
        on_value: f64,
        off_value: f64,
    ) -> Result<Value, BuildError> {
        self.prim.call(
            b,
            &[
                indices.into(),
                Const::Int(depth).into(),
                Const::Float(on_value).into(),
                Const::Float(off_value).into(),
            ],
        )
    }
}

/// `Dropout(x)` with `keep_prob`: the result is the `(y, mask)` tuple; take `y` with
/// [`GraphBuilder::tuple_get_item`] or use [`Dropout::call_output`]. Seeds not set explicitly
/// are derived from the builder's seed ([`GraphBuilder::next_op_seeds`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Dropout {
    prim: Primitive,
    seeds: Option<(i64, i64)>,
}

impl Dropout {
    /// A dropout keeping each element with probability `keep_prob`.
    pub fn new(keep_prob: f64) -> Self {
        Dropout {
            prim: Primitive::new(OpKind::Dropout).attr("keep_prob", Attr::Float(keep_prob)),
            seeds: None,
        }
    }

    /// Sets `seed0` and `seed1`.
    pub fn seeds(mut self, seed0: i64, seed1: i64) -> Self {
        self.seeds = Some((seed0, seed1));
        self
    }

    /// Sets the `in_strategy`.
    pub fn shard(mut self, strategy: impl IntoStrategy) -> Self {
        self.prim = self.prim.shard(strategy);
        self
    }

    /// Sets the instance name.
    pub fn instance(mut self, name: &str) -> Self {
        self.prim = self.prim.instance(name);
        self
    }

    /// Adds the dropout of `x`; returns the `(y, mask)` tuple value.
    pub fn call(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let keep = self.prim.attrs().float_or("keep_prob", 0.5);
        if !(keep > 0.0 && keep <= 1.0) {
            return Err(BuildError::InvalidArgument {
                instance: self
                    .prim
                    .instance
                    .clone()
                    .unwrap_or_else(|| "dropout".into()),
                reason: format!("keep_prob must be in (0, 1], got {keep}"),
            });
        }
        let (s0, s1) = match self.seeds {
            Some(s) => s,
            None => b.next_op_seeds(),
        };
        let prim = self
            .prim
            .clone()
            .attr("seed0", Attr::Int(s0))
            .attr("seed1", Attr::Int(s1));
        prim.call(b, &[x.into()])
    }

    /// Adds the dropout of `x` and returns only `y`.
    pub fn call_output(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let t = self.call(b, x)?;
        b.tuple_get_item(t, 0)
    }
}

primitive!(
    /// `BatchNorm(x, scale, bias, mean, variance)`; result the 5-tuple `(y, batch_mean,
    /// batch_variance, saved_mean, saved_rstd)`.
    BatchNorm, BatchNorm,
    "is_training" => Attr::Bool(true),
    "epsilon" => Attr::Float(1e-5),
    "momentum" => Attr::Float(0.1)
);
bool_setter!(BatchNorm, is_training => "is_training");
impl BatchNorm {
    /// Sets `epsilon`.
    pub fn epsilon(self, eps: f64) -> Self {
        self.attr("epsilon", Attr::Float(eps))
    }

    /// Sets the op's `momentum` (the weight of the batch statistic, MindSpore op convention).
    pub fn momentum(self, m: f64) -> Self {
        self.attr("momentum", Attr::Float(m))
    }

    /// Adds the batch normalisation; returns the tuple value.
    pub fn call(
        &self,
        b: &mut GraphBuilder,
        x: Value,
        scale: Value,
        bias: Value,
        mean: Value,
        variance: Value,
    ) -> Result<Value, BuildError> {
        self.prim.call(
            b,
            &[
                x.into(),
                scale.into(),
                bias.into(),
                mean.into(),
                variance.into(),
            ],
        )
    }
}

primitive!(
    /// `LayerNorm(x, gamma, beta)`; result `(y, mean, rstd)`.
    LayerNorm, LayerNorm,
    "begin_norm_axis" => Attr::Int(-1),
    "begin_params_axis" => Attr::Int(-1),
    "epsilon" => Attr::Float(1e-7)
);
impl LayerNorm {
    /// Sets `begin_norm_axis` and `begin_params_axis`.
    pub fn axes(self, begin_norm_axis: i64, begin_params_axis: i64) -> Self {
        self.attr("begin_norm_axis", Attr::Int(begin_norm_axis))
            .attr("begin_params_axis", Attr::Int(begin_params_axis))
    }

    /// Sets `epsilon`.
    pub fn epsilon(self, eps: f64) -> Self {
        self.attr("epsilon", Attr::Float(eps))
    }

    /// Adds the layer normalisation; returns the tuple value.
    pub fn call(
        &self,
        b: &mut GraphBuilder,
        x: Value,
        gamma: Value,
        beta: Value,
    ) -> Result<Value, BuildError> {
        self.prim.call(b, &[x.into(), gamma.into(), beta.into()])
    }
}

primitive!(
    /// `SoftmaxCrossEntropyWithLogits(logits, labels)`; result `(loss (N), backprop (N, C))`.
    SoftmaxCrossEntropyWithLogits, SoftmaxCrossEntropyWithLogits
);
binary_call!(SoftmaxCrossEntropyWithLogits);

primitive!(
    /// `SparseSoftmaxCrossEntropyWithLogits(logits, labels)`: the mean loss.
    SparseSoftmaxCrossEntropyWithLogits, SparseSoftmaxCrossEntropyWithLogits
);
binary_call!(SparseSoftmaxCrossEntropyWithLogits);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setters_set_attributes() {
        let m = MatMul::new().transpose_b(true).instance("dense");
        assert_eq!(
            m.primitive().attrs().get("transpose_b"),
            Some(&Attr::Bool(true))
        );
        assert_eq!(
            m.primitive().attrs().get("transpose_a"),
            Some(&Attr::Bool(false))
        );
        assert_eq!(m.primitive().instance.as_deref(), Some("dense"));
        let c = Conv2D::with(64, (3, 3)).stride((2, 2)).pad_mode("same");
        assert_eq!(c.primitive().attrs().ints("kernel_size"), Some(vec![3, 3]));
        assert_eq!(c.primitive().attrs().ints("stride"), Some(vec![2, 2]));
        assert_eq!(c.primitive().attrs().str_or("pad_mode", ""), "same");
        let r = ReduceSum::new().keep_dims(true).shard(((2, 1),));
        assert!(r.primitive().attrs().bool_or("keep_dims", false));
        assert_eq!(r.primitive().in_strategy().unwrap().0, vec![vec![2, 1]]);
    }
}
