//! `nn` cells, as MindSpore's `mindspore.nn`: layers that own parameters and build their part
//! of the graph.
//!
//! A cell is called with [`call_cell`] (or [`GraphBuilder::in_cell`]) under the name its parent
//! gives it, as MindSpore names a sub-cell after the attribute holding it: calling a [`Dense`]
//! as `fc1` puts its nodes under scope `.../fc1-Dense` and names its parameters `fc1.weight`,
//! `fc1.bias`. [`SequentialCell`] names its children `0`, `1`, ... (`layer1.0.conv1.weight`).
//! A cell's own [`Cell::construct`] called directly adds no scope or prefix.
//!
//! Default initializers follow MindSpore 2.x: `Dense` and `Conv2d` weights and biases
//! `HeUniform(sqrt(5))`, i.e. uniform on `±1/sqrt(fan_in)` ([`init::he_uniform_default`]);
//! BatchNorm gamma ones, beta zeros, moving mean zeros, moving variance ones. Every random
//! initializer gets its seed from the builder ([`GraphBuilder::weight`]).

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::init;
use crate::ops;
use crate::strategy::IntoStrategy;
use shardc_ir::{Attr, Attrs, DType, Init, OpKind, Strategy};

/// A layer: builds its part of the graph from one input value.
pub trait Cell {
    /// The class name used in scopes (`Dense` in `fc1-Dense`).
    fn class_name(&self) -> &str;

    /// Adds the cell's parameters and nodes to `b`, applied to `x`; returns the output.
    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError>;

    /// MindSpore's `cell.recompute()`: the cell's nodes but its output are marked
    /// `recompute: true`, so the `recompute` pass replays them in the backward pass instead of
    /// keeping their results alive from the forward pass (the output is the checkpoint the
    /// replay starts from).
    fn recompute(self) -> Recompute<Self>
    where
        Self: Sized,
    {
        Recompute(self)
    }
}

/// A cell whose nodes are all recomputed in the backward pass ([`Cell::recompute`]); same
/// class name, scopes and parameters as the cell it wraps.
pub struct Recompute<C>(pub C);

impl<C: Cell> Cell for Recompute<C> {
    fn class_name(&self) -> &str {
        self.0.class_name()
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let y = b.in_recompute(|b| self.0.construct(b, x))?;
        b.unmark_recompute(y);
        Ok(y)
    }
}

/// Calls `cell` on `x` as a sub-cell named `name`: scope `name-Class`, parameter prefix `name`.
pub fn call_cell(
    b: &mut GraphBuilder,
    name: &str,
    cell: &dyn Cell,
    x: Value,
) -> Result<Value, BuildError> {
    b.in_cell(name, cell.class_name(), |b| cell.construct(b, x))
}

/// An error about a cell's use, naming the cell by its scope.
fn cell_error(b: &GraphBuilder, class: &str, reason: String) -> BuildError {
    let scope = b.scope();
    BuildError::InvalidArgument {
        instance: if scope.is_empty() {
            class.to_string()
        } else {
            format!("{class} at {scope}")
        },
        reason,
    }
}

/// An activation a [`Dense`] can apply, MindSpore's `activation="relu"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `ReLU`.
    ReLU,
    /// `GeLU`.
    GeLU,
    /// `Sigmoid`.
    Sigmoid,
    /// `SiLU` (`x * sigmoid(x)`).
    SiLU,
    /// `Tanh`.
    Tanh,
    /// `Softmax` over the last axis.
    Softmax,
}

impl Activation {
    /// The activation of a MindSpore name (`relu`, `gelu`, `sigmoid`, `silu`, `tanh`,
    /// `softmax`).
    pub fn from_name(name: &str) -> Option<Activation> {
        Some(match name.to_ascii_lowercase().as_str() {
            "relu" => Activation::ReLU,
            "gelu" => Activation::GeLU,
            "sigmoid" => Activation::Sigmoid,
            "silu" => Activation::SiLU,
            "tanh" => Activation::Tanh,
            "softmax" => Activation::Softmax,
            _ => return None,
        })
    }

    fn class(self) -> &'static str {
        match self {
            Activation::ReLU => "ReLU",
            Activation::GeLU => "GELU",
            Activation::Sigmoid => "Sigmoid",
            Activation::SiLU => "SiLU",
            Activation::Tanh => "Tanh",
            Activation::Softmax => "Softmax",
        }
    }

    fn apply(self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        match self {
            Activation::ReLU => b.relu(x),
            Activation::GeLU => b.gelu(x),
            Activation::Sigmoid => b.sigmoid(x),
            Activation::SiLU => b.silu(x),
            Activation::Tanh => b.tanh(x),
            Activation::Softmax => b.softmax(x, -1),
        }
    }
}

impl Cell for Activation {
    fn class_name(&self) -> &str {
        self.class()
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        self.apply(b, x)
    }
}

/// `nn.Dense(in_channels, out_channels)`: `y = x @ weight^T + bias`, weight `(out, in)`
/// (MatMul with `transpose_b: true`), bias `(out)` (BiasAdd). Inputs of rank above 2 are
/// reshaped to `(-1, in)` and back, as MindSpore does.
#[derive(Clone, Debug, PartialEq)]
pub struct Dense {
    in_channels: usize,
    out_channels: usize,
    has_bias: bool,
    activation: Option<Activation>,
    weight_init: Option<Init>,
    bias_init: Option<Init>,
    matmul_strategy: Option<Strategy>,
    bias_add_strategy: Option<Strategy>,
}

impl Dense {
    /// A dense layer from `in_channels` to `out_channels` features, with bias, no activation.
    pub fn new(in_channels: usize, out_channels: usize) -> Self {
        Dense {
            in_channels,
            out_channels,
            has_bias: true,
            activation: None,
            weight_init: None,
            bias_init: None,
            matmul_strategy: None,
            bias_add_strategy: None,
        }
    }

    /// Whether to add a bias (true).
    pub fn has_bias(mut self, has_bias: bool) -> Self {
        self.has_bias = has_bias;
        self
    }

    /// The activation applied after the bias (none).
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = Some(a);
        self
    }

    /// The weight's initializer (default `he_uniform_default(in_channels)`).
    pub fn weight_init(mut self, init: Init) -> Self {
        self.weight_init = Some(init);
        self
    }

    /// The bias's initializer (default `he_uniform_default(in_channels)`).
    pub fn bias_init(mut self, init: Init) -> Self {
        self.bias_init = Some(init);
        self
    }

    /// The strategy of the MatMul (`dense.matmul.shard(...)` in MindSpore).
    pub fn matmul_shard(mut self, s: impl IntoStrategy) -> Self {
        self.matmul_strategy = Some(s.into_strategy());
        self
    }

    /// The strategy of the BiasAdd.
    pub fn bias_add_shard(mut self, s: impl IntoStrategy) -> Self {
        self.bias_add_strategy = Some(s.into_strategy());
        self
    }
}

impl Cell for Dense {
    fn class_name(&self) -> &str {
        "Dense"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        // Parameters take the input's element type (f32 by default, f64 for gradient checks).
        let dt = b.ty(&x).map_or(DType::Float32, |t| t.dtype);
        let shape = b.shape_of(x, "Dense")?;
        if shape.last() != Some(&self.in_channels) {
            return Err(cell_error(
                b,
                "Dense",
                format!(
                    "Dense({}, {}) expects inputs with {} features in the last dimension, got shape {:?}",
                    self.in_channels, self.out_channels, self.in_channels, shape
                ),
            ));
        }
        let weight_init = self
            .weight_init
            .clone()
            .unwrap_or_else(|| init::he_uniform_default(self.in_channels));
        let weight = b.weight(
            "weight",
            dt,
            &[self.out_channels, self.in_channels],
            weight_init,
        )?;
        let bias = if self.has_bias {
            let bias_init = self
                .bias_init
                .clone()
                .unwrap_or_else(|| init::he_uniform_default(self.in_channels));
            Some(b.weight("bias", dt, &[self.out_channels], bias_init)?)
        } else {
            None
        };
        let mut x = x;
        if shape.len() != 2 {
            x = b.reshape(x, &[-1, self.in_channels as i64])?;
        }
        let mut mm = ops::MatMul::new().transpose_b(true);
        if let Some(s) = &self.matmul_strategy {
            mm = mm.shard(s);
        }
        let mut y = mm.call(b, x, weight)?;
        if let Some(bias) = bias {
            let mut ba = ops::BiasAdd::new();
            if let Some(s) = &self.bias_add_strategy {
                ba = ba.shard(s);
            }
            y = ba.call(b, y, bias)?;
        }
        if let Some(a) = self.activation {
            y = call_cell(b, "activation", &a, y)?;
        }
        if shape.len() != 2 {
            let mut out: Vec<i64> = shape[..shape.len().saturating_sub(1)]
                .iter()
                .map(|&d| d as i64)
                .collect();
            out.push(self.out_channels as i64);
            y = b.reshape(y, &out)?;
        }
        Ok(y)
    }
}

/// `nn.Conv2d(in_channels, out_channels, kernel_size)`, NCHW, MindSpore's defaults: stride 1,
/// `pad_mode` `same`, padding 0, dilation 1, group 1, no bias. Weight
/// `(out, in / group, kh, kw)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv2d {
    in_channels: usize,
    out_channels: usize,
    kernel_size: (usize, usize),
    stride: (usize, usize),
    pad_mode: String,
    padding: (usize, usize, usize, usize),
    dilation: (usize, usize),
    group: usize,
    has_bias: bool,
    weight_init: Option<Init>,
    bias_init: Option<Init>,
    strategy: Option<Strategy>,
}

impl Conv2d {
    /// A `kernel_size` x `kernel_size` convolution.
    pub fn new(in_channels: usize, out_channels: usize, kernel_size: usize) -> Self {
        Conv2d {
            in_channels,
            out_channels,
            kernel_size: (kernel_size, kernel_size),
            stride: (1, 1),
            pad_mode: "same".into(),
            padding: (0, 0, 0, 0),
            dilation: (1, 1),
            group: 1,
            has_bias: false,
            weight_init: None,
            bias_init: None,
            strategy: None,
        }
    }

    /// A rectangular kernel (kh, kw).
    pub fn kernel(mut self, kh: usize, kw: usize) -> Self {
        self.kernel_size = (kh, kw);
        self
    }

    /// The stride in both dimensions.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }

    /// `same`, `valid` or `pad`.
    pub fn pad_mode(mut self, mode: &str) -> Self {
        self.pad_mode = mode.to_string();
        self
    }

    /// The same padding on all four sides (needs `pad_mode("pad")`).
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p, p, p);
        self
    }

    /// Padding (top, bottom, left, right) (needs `pad_mode("pad")`).
    pub fn padding4(mut self, top: usize, bottom: usize, left: usize, right: usize) -> Self {
        self.padding = (top, bottom, left, right);
        self
    }

    /// The dilation in both dimensions.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }

    /// The number of groups.
    pub fn group(mut self, g: usize) -> Self {
        self.group = g;
        self
    }

    /// Whether to add a bias (false).
    pub fn has_bias(mut self, has_bias: bool) -> Self {
        self.has_bias = has_bias;
        self
    }

    /// The weight's initializer.
    pub fn weight_init(mut self, init: Init) -> Self {
        self.weight_init = Some(init);
        self
    }

    /// The bias's initializer.
    pub fn bias_init(mut self, init: Init) -> Self {
        self.bias_init = Some(init);
        self
    }

    /// The Conv2D's strategy, `((n, c, h, w), (o, c, kh, kw))`.
    pub fn shard(mut self, s: impl IntoStrategy) -> Self {
        self.strategy = Some(s.into_strategy());
        self
    }
}

impl Cell for Conv2d {
    fn class_name(&self) -> &str {
        "Conv2d"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        // Parameters take the input's element type (f32 by default, f64 for gradient checks).
        let dt = b.ty(&x).map_or(DType::Float32, |t| t.dtype);
        let shape = b.shape_of(x, "Conv2d")?;
        let fail = |b: &GraphBuilder, reason: String| Err(cell_error(b, "Conv2d", reason));
        if shape.len() != 4 || shape[1] != self.in_channels {
            return fail(
                b,
                format!(
                    "Conv2d({}, {}) expects NCHW inputs with {} channels, got shape {:?}",
                    self.in_channels, self.out_channels, self.in_channels, shape
                ),
            );
        }
        if self.group == 0
            || self.in_channels % self.group != 0
            || self.out_channels % self.group != 0
        {
            return fail(
                b,
                format!(
                    "group {} must divide in_channels {} and out_channels {}",
                    self.group, self.in_channels, self.out_channels
                ),
            );
        }
        if !["same", "valid", "pad"].contains(&self.pad_mode.as_str()) {
            return fail(
                b,
                format!("pad_mode must be same, valid or pad, got {}", self.pad_mode),
            );
        }
        if self.pad_mode != "pad" && self.padding != (0, 0, 0, 0) {
            return fail(
                b,
                format!(
                    "padding {:?} needs pad_mode pad (got {})",
                    self.padding, self.pad_mode
                ),
            );
        }
        let (kh, kw) = self.kernel_size;
        let fan_in = self.in_channels / self.group * kh * kw;
        let weight_init = self
            .weight_init
            .clone()
            .unwrap_or_else(|| init::he_uniform_default(fan_in));
        let weight = b.weight(
            "weight",
            dt,
            &[self.out_channels, self.in_channels / self.group, kh, kw],
            weight_init,
        )?;
        let bias = if self.has_bias {
            let bias_init = self
                .bias_init
                .clone()
                .unwrap_or_else(|| init::he_uniform_default(fan_in));
            Some(b.weight("bias", dt, &[self.out_channels], bias_init)?)
        } else {
            None
        };
        let p = self.padding;
        let mut conv = ops::Conv2D::with(self.out_channels, self.kernel_size)
            .pad_mode(&self.pad_mode)
            .pad(p)
            .stride(self.stride)
            .dilation(self.dilation)
            .group(self.group);
        if let Some(s) = &self.strategy {
            conv = conv.shard(s);
        }
        let mut y = conv.call(b, x, weight)?;
        if let Some(bias) = bias {
            y = b.bias_add(y, bias)?;
        }
        Ok(y)
    }
}

/// `nn.BatchNorm2d(num_features)`: parameters `gamma` (ones), `beta` (zeros), `moving_mean`
/// (zeros) and `moving_variance` (ones); the moving ones are weights with `requires_grad`
/// false.
///
/// In training mode it adds `BatchNorm(is_training: true)`, takes `y` (item 0), and updates
/// the moving statistics MindSpore's way, `moving = moving * momentum + batch * (1 - momentum)`
/// (momentum 0.9), from the batch mean (item 1) and unbiased batch variance (item 2), each
/// stored with `Assign`. The op's own `momentum` attribute carries `1 - momentum` (the op's
/// convention). In inference mode it adds `BatchNorm(is_training: false)` and item 0.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchNorm2d {
    num_features: usize,
    eps: f64,
    momentum: f64,
    strategy: Option<Strategy>,
}

impl BatchNorm2d {
    /// Batch normalisation over `num_features` channels; eps 1e-5, momentum 0.9.
    pub fn new(num_features: usize) -> Self {
        BatchNorm2d {
            num_features,
            eps: 1e-5,
            momentum: 0.9,
            strategy: None,
        }
    }

    /// Sets epsilon.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Sets the momentum of the moving averages (MindSpore convention: weight of the old value).
    pub fn momentum(mut self, m: f64) -> Self {
        self.momentum = m;
        self
    }

    /// The BatchNorm's strategy (5 entries: x, gamma, beta, mean, variance).
    pub fn shard(mut self, s: impl IntoStrategy) -> Self {
        self.strategy = Some(s.into_strategy());
        self
    }
}

impl Cell for BatchNorm2d {
    fn class_name(&self) -> &str {
        "BatchNorm2d"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        // Parameters take the input's element type (f32 by default, f64 for gradient checks).
        let dt = b.ty(&x).map_or(DType::Float32, |t| t.dtype);
        let shape = b.shape_of(x, "BatchNorm2d")?;
        if shape.len() != 4 || shape[1] != self.num_features {
            return Err(cell_error(
                b,
                "BatchNorm2d",
                format!(
                    "BatchNorm2d({}) expects NCHW inputs with {} channels, got shape {:?}",
                    self.num_features, self.num_features, shape
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.momentum) {
            return Err(cell_error(
                b,
                "BatchNorm2d",
                format!("momentum must be in [0, 1], got {}", self.momentum),
            ));
        }
        let c = [self.num_features];
        let gamma = b.weight("gamma", dt, &c, init::ones())?;
        let beta = b.weight("beta", dt, &c, init::zeros())?;
        let mean = b.weight_with("moving_mean", dt, &c, init::zeros(), false)?;
        let var = b.weight_with("moving_variance", dt, &c, init::ones(), false)?;
        let training = b.is_training();
        // 1 - 0.9 is 0.09999999999999998 in binary; print and compute with 0.1.
        let batch_weight = ((1.0 - self.momentum) * 1e15).round() / 1e15;
        let mut bn = ops::BatchNorm::new()
            .is_training(training)
            .epsilon(self.eps)
            .momentum(batch_weight);
        if let Some(s) = &self.strategy {
            bn = bn.shard(s);
        }
        let t = bn.call(b, x, gamma, beta, mean, var)?;
        let y = b.tuple_get_item(t, 0)?;
        if training {
            for (index, moving) in [(1, mean), (2, var)] {
                let batch = b.tuple_get_item(t, index)?;
                let old = b.mul_scalar(moving, self.momentum)?;
                let new = b.mul_scalar(batch, batch_weight)?;
                let updated = b.add(old, new)?;
                b.assign(moving, updated)?;
            }
        }
        Ok(y)
    }
}

/// `nn.ReLU()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReLU;

impl ReLU {
    /// The cell.
    pub fn new() -> Self {
        ReLU
    }
}

impl Cell for ReLU {
    fn class_name(&self) -> &str {
        "ReLU"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        b.relu(x)
    }
}

/// `nn.Flatten()`: `(N, ...)` to `(N, product of the rest)` by a Reshape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flatten;

impl Flatten {
    /// The cell.
    pub fn new() -> Self {
        Flatten
    }
}

impl Cell for Flatten {
    fn class_name(&self) -> &str {
        "Flatten"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let shape = b.shape_of(x, "Flatten")?;
        let Some((&n, rest)) = shape.split_first() else {
            return Err(cell_error(
                b,
                "Flatten",
                "cannot flatten a scalar".to_string(),
            ));
        };
        let rest: usize = rest.iter().product();
        b.reshape(x, &[n as i64, rest as i64])
    }
}

/// Pooling of either kind, MindSpore's `nn.MaxPool2d` / `nn.AvgPool2d` arguments.
#[derive(Clone, Debug, PartialEq)]
struct Pool {
    kernel_size: (usize, usize),
    stride: (usize, usize),
    pad_mode: String,
    strategy: Option<Strategy>,
}

impl Pool {
    fn new(kernel_size: usize, stride: usize) -> Self {
        Pool {
            kernel_size: (kernel_size, kernel_size),
            stride: (stride, stride),
            pad_mode: "valid".into(),
            strategy: None,
        }
    }

    fn build(
        &self,
        b: &mut GraphBuilder,
        op: OpKind,
        class: &str,
        x: Value,
    ) -> Result<Value, BuildError> {
        let shape = b.shape_of(x, class)?;
        if shape.len() != 4 {
            return Err(cell_error(
                b,
                class,
                format!("expects NCHW inputs, got shape {shape:?}"),
            ));
        }
        if !["same", "valid"].contains(&self.pad_mode.as_str()) {
            return Err(cell_error(
                b,
                class,
                format!("pad_mode must be same or valid, got {}", self.pad_mode),
            ));
        }
        let (kh, kw) = self.kernel_size;
        let (sh, sw) = self.stride;
        let attrs = Attrs::new()
            .with("kernel_size", Attr::ints(&[kh as i64, kw as i64]))
            .with("strides", Attr::ints(&[sh as i64, sw as i64]))
            .with("pad_mode", Attr::Str(self.pad_mode.clone()))
            .with("data_format", Attr::Str("NCHW".into()));
        b.op_named(op, &[x.into()], attrs, "", self.strategy.clone())
    }
}

macro_rules! pool_cell {
    ($(#[$doc:meta])* $name:ident, $op:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name(Pool);

        impl $name {
            /// A `kernel_size` x `kernel_size` window moved by `stride`, `pad_mode` `valid`.
            pub fn new(kernel_size: usize, stride: usize) -> Self {
                $name(Pool::new(kernel_size, stride))
            }

            /// A rectangular window (kh, kw).
            pub fn kernel(mut self, kh: usize, kw: usize) -> Self {
                self.0.kernel_size = (kh, kw);
                self
            }

            /// Strides (sh, sw).
            pub fn strides(mut self, sh: usize, sw: usize) -> Self {
                self.0.stride = (sh, sw);
                self
            }

            /// `valid` or `same`.
            pub fn pad_mode(mut self, mode: &str) -> Self {
                self.0.pad_mode = mode.to_string();
                self
            }

            /// The pooling op's strategy.
            pub fn shard(mut self, s: impl IntoStrategy) -> Self {
                self.0.strategy = Some(s.into_strategy());
                self
            }
        }

        impl Cell for $name {
            fn class_name(&self) -> &str {
                stringify!($name)
            }

            fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
                self.0.build(b, OpKind::$op, stringify!($name), x)
            }
        }
    };
}

pool_cell!(
    /// `nn.MaxPool2d(kernel_size, stride)`, MaxPool op.
    MaxPool2d, MaxPool
);
pool_cell!(
    /// `nn.AvgPool2d(kernel_size, stride)`, AvgPool op.
    AvgPool2d, AvgPool
);

/// `nn.Dropout(keep_prob)`: in training mode the Dropout op (seeds from the builder) and its
/// output 0; in inference mode the identity.
#[derive(Clone, Debug, PartialEq)]
pub struct Dropout {
    keep_prob: f64,
}

impl Dropout {
    /// Keeps each element with probability `keep_prob` (scaling kept ones by `1/keep_prob`).
    pub fn new(keep_prob: f64) -> Self {
        Dropout { keep_prob }
    }

    /// Drops each element with probability `p` (MindSpore 2.x's `p`): `keep_prob = 1 - p`.
    pub fn with_p(p: f64) -> Self {
        Dropout { keep_prob: 1.0 - p }
    }
}

impl Cell for Dropout {
    fn class_name(&self) -> &str {
        "Dropout"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        if !b.is_training() || self.keep_prob == 1.0 {
            return Ok(x);
        }
        ops::Dropout::new(self.keep_prob).call_output(b, x)
    }
}

/// `nn.SequentialCell([...])`: children applied in order, named `0`, `1`, ... (or by the
/// names given to [`SequentialCell::named`]).
pub struct SequentialCell {
    children: Vec<(String, Box<dyn Cell>)>,
}

impl SequentialCell {
    /// Children named by their index.
    pub fn new(children: Vec<Box<dyn Cell>>) -> Self {
        SequentialCell {
            children: children
                .into_iter()
                .enumerate()
                .map(|(i, c)| (i.to_string(), c))
                .collect(),
        }
    }

    /// Children with names (MindSpore's `OrderedDict` form).
    pub fn named(children: Vec<(&str, Box<dyn Cell>)>) -> Self {
        SequentialCell {
            children: children
                .into_iter()
                .map(|(n, c)| (n.to_string(), c))
                .collect(),
        }
    }

    /// Appends a child named by its index.
    pub fn push(&mut self, cell: Box<dyn Cell>) {
        let name = self.children.len().to_string();
        self.children.push((name, cell));
    }

    /// Number of children.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether there are no children.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }
}

impl Cell for SequentialCell {
    fn class_name(&self) -> &str {
        "SequentialCell"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let mut x = x;
        for (name, cell) in &self.children {
            x = call_cell(b, name, cell.as_ref(), x)?;
        }
        Ok(x)
    }
}

/// A cell written as a closure, for networks defined inline:
/// `FnCell::new("Net", |b, x| { ... })`.
pub struct FnCell<F> {
    class: String,
    f: F,
}

impl<F> FnCell<F>
where
    F: Fn(&mut GraphBuilder, Value) -> Result<Value, BuildError>,
{
    /// A cell of class `class` whose construct is `f`.
    pub fn new(class: &str, f: F) -> Self {
        FnCell {
            class: class.to_string(),
            f,
        }
    }
}

impl<F> Cell for FnCell<F>
where
    F: Fn(&mut GraphBuilder, Value) -> Result<Value, BuildError>,
{
    fn class_name(&self) -> &str {
        &self.class
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        (self.f)(b, x)
    }
}
