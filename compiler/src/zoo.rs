//! Ready-made networks, each as its forward graph with loss (what the CLI and the examples
//! compile): the parallel quickstart's net, the data-parallel tutorial's MLP, LeNet-5 and
//! ResNet-18 for CIFAR-10. Each returns an error (never panics) for a batch size or layer list
//! it cannot build.

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::init;
use crate::loss::{MSELoss, SoftmaxCrossEntropyWithLogits};
use crate::model::build_network;
use crate::nn::{
    call_cell, BatchNorm2d, Cell, Conv2d, Dense, Flatten, MaxPool2d, ReLU, SequentialCell,
};
use crate::ops;
use shardc_ir::{DType, Graph};

/// The net of MindSpore's parallel-training quickstart (`Net(32, 16, 16)`), class `Net`:
/// `matmul = MatMul().shard(((2, 4), (4, 1)))` with `w (32, 16)`, `relu`, `matmul2` with
/// `w2 (16, 16)`; both weights `normal(sigma=0.01)` (MindSpore's `"normal"`).
#[derive(Clone, Copy, Debug, Default)]
pub struct QuickstartNet;

impl Cell for QuickstartNet {
    fn class_name(&self) -> &str {
        "Net"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let w = b.weight("w", DType::Float32, &[32, 16], init::normal(0.01))?;
        let w2 = b.weight("w2", DType::Float32, &[16, 16], init::normal(0.01))?;
        let out = ops::MatMul::new().shard(((2, 4), (4, 1))).call(b, x, w)?;
        let out = ops::ReLU::new().call(b, out)?;
        ops::MatMul::new().call(b, out, w2)
    }
}

/// The quickstart net with `MSELoss`: inputs `x (batch, 32)` and `label (batch, 16)`, Float32.
/// For `batch = 16` it is `models/quickstart.ir`. `batch` must be even (the strategy splits it
/// in two).
pub fn quickstart(batch: usize) -> Result<Graph, BuildError> {
    build_network(
        "Net",
        &QuickstartNet,
        &MSELoss::new(),
        &[
            ("x", DType::Float32, &[batch, 32]),
            ("label", DType::Float32, &[batch, 16]),
        ],
    )
}

/// The data-parallel tutorial's `Network` generalised to any layer sizes: `Dense` layers with
/// ReLU between them in a `SequentialCell` called `dense_relu_sequential`, weights
/// `normal(0.01)`, biases zeros; sparse softmax cross-entropy (mean). Inputs `x (batch,
/// dims[0])` Float32 and `label (batch)` Int32. `mlp(b, &[784, 512, 512, 10])` is the tutorial's.
pub fn mlp(batch: usize, dims: &[usize]) -> Result<Graph, BuildError> {
    if dims.len() < 2 {
        return Err(BuildError::InvalidArgument {
            instance: "mlp".into(),
            reason: format!("needs at least an input and an output size, got {dims:?}"),
        });
    }
    let net = MlpNetwork::new(dims);
    build_network(
        "Network",
        &net,
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[batch, dims[0]]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}

/// The data-parallel tutorial's `Network`: optionally `nn.Flatten()`, then `Dense` layers of
/// the given sizes with ReLU between them in a `SequentialCell` called
/// `dense_relu_sequential`; weights `normal(0.01)`, biases zeros.
pub struct MlpNetwork {
    flatten: bool,
    seq: SequentialCell,
}

impl MlpNetwork {
    /// Dense layers `dims[0] -> dims[1] -> ...` with ReLU between them (no flatten).
    pub fn new(dims: &[usize]) -> Self {
        let mut seq = SequentialCell::new(Vec::new());
        for (i, pair) in dims.windows(2).enumerate() {
            if i > 0 {
                seq.push(Box::new(ReLU));
            }
            seq.push(Box::new(
                Dense::new(pair[0], pair[1])
                    .weight_init(init::normal(0.01))
                    .bias_init(init::zeros()),
            ));
        }
        MlpNetwork {
            flatten: false,
            seq,
        }
    }

    /// With `nn.Flatten()` first, as the tutorial's net (images in, `(N, C*H*W)` to the
    /// first Dense).
    pub fn with_flatten(mut self) -> Self {
        self.flatten = true;
        self
    }
}

impl Cell for MlpNetwork {
    fn class_name(&self) -> &str {
        "Network"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let x = if self.flatten {
            call_cell(b, "flatten", &Flatten, x)?
        } else {
            x
        };
        call_cell(b, "dense_relu_sequential", &self.seq, x)
    }
}

/// MindSpore's `LeNet5(num_class=10, num_channel=1)`: input `(N, 1, 32, 32)`.
#[derive(Clone, Copy, Debug)]
pub struct LeNet5 {
    /// Number of classes.
    pub num_class: usize,
    /// Number of input channels.
    pub num_channel: usize,
}

impl Default for LeNet5 {
    fn default() -> Self {
        LeNet5 {
            num_class: 10,
            num_channel: 1,
        }
    }
}

impl Cell for LeNet5 {
    fn class_name(&self) -> &str {
        "LeNet5"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let conv1 = Conv2d::new(self.num_channel, 6, 5).pad_mode("valid");
        let conv2 = Conv2d::new(6, 16, 5).pad_mode("valid");
        let fc1 = Dense::new(16 * 5 * 5, 120).weight_init(init::normal(0.02));
        let fc2 = Dense::new(120, 84).weight_init(init::normal(0.02));
        let fc3 = Dense::new(84, self.num_class).weight_init(init::normal(0.02));
        let pool = MaxPool2d::new(2, 2);
        let mut x = call_cell(b, "conv1", &conv1, x)?;
        x = call_cell(b, "relu", &ReLU, x)?;
        x = call_cell(b, "max_pool2d", &pool, x)?;
        x = call_cell(b, "conv2", &conv2, x)?;
        x = call_cell(b, "relu", &ReLU, x)?;
        x = call_cell(b, "max_pool2d", &pool, x)?;
        x = call_cell(b, "flatten", &Flatten, x)?;
        x = call_cell(b, "fc1", &fc1, x)?;
        x = call_cell(b, "relu", &ReLU, x)?;
        x = call_cell(b, "fc2", &fc2, x)?;
        x = call_cell(b, "relu", &ReLU, x)?;
        call_cell(b, "fc3", &fc3, x)
    }
}

/// LeNet-5 with sparse softmax cross-entropy: inputs `x (batch, 1, 32, 32)` Float32 and
/// `label (batch)` Int32.
pub fn lenet(batch: usize) -> Result<Graph, BuildError> {
    build_network(
        "LeNet5",
        &LeNet5::default(),
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[batch, 1, 32, 32]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}

/// ResNet's basic block: `conv1` 3x3 (stride), `bn1`, ReLU, `conv2` 3x3, `bn2`, plus the
/// shortcut (`down_sample_layer`: 1x1 conv with the stride and BatchNorm when the stride or the
/// width changes), then ReLU.
#[derive(Clone, Copy, Debug)]
pub struct BasicBlock {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Stride of the first convolution.
    pub stride: usize,
}

impl Cell for BasicBlock {
    fn class_name(&self) -> &str {
        "BasicBlock"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let conv1 = Conv2d::new(self.in_channels, self.out_channels, 3).stride(self.stride);
        let conv2 = Conv2d::new(self.out_channels, self.out_channels, 3);
        let mut y = call_cell(b, "conv1", &conv1, x)?;
        y = call_cell(b, "bn1", &BatchNorm2d::new(self.out_channels), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        y = call_cell(b, "conv2", &conv2, y)?;
        y = call_cell(b, "bn2", &BatchNorm2d::new(self.out_channels), y)?;
        residual_sum(b, x, y, self.in_channels, self.out_channels, self.stride)
    }
}

/// A residual block's end: `y` plus the shortcut of `x` (`down_sample_layer`: a 1x1
/// convolution with the stride and BatchNorm when the stride or the width changes, else `x`
/// itself), then ReLU.
fn residual_sum(
    b: &mut GraphBuilder,
    x: Value,
    y: Value,
    in_channels: usize,
    out_channels: usize,
    stride: usize,
) -> Result<Value, BuildError> {
    let identity = if stride != 1 || in_channels != out_channels {
        let down = SequentialCell::new(vec![
            Box::new(Conv2d::new(in_channels, out_channels, 1).stride(stride)),
            Box::new(BatchNorm2d::new(out_channels)),
        ]);
        call_cell(b, "down_sample_layer", &down, x)?
    } else {
        x
    };
    let sum = b.add(y, identity)?;
    call_cell(b, "relu", &ReLU, sum)
}

/// ResNet-18 for CIFAR-10: a 3x3 convolution stem of 64 channels (stride 1), BatchNorm, ReLU;
/// four stages (`layer1`..`layer4`) of two [`BasicBlock`]s of 64, 128, 256 and 512 channels
/// (stages 2-4 start with stride 2); global average pooling as `ReduceMean` over (2, 3); a
/// `Dense(512, num_classes)` called `end_point`.
#[derive(Clone, Copy, Debug)]
pub struct ResNet18Cifar {
    /// Number of classes.
    pub num_classes: usize,
}

impl Cell for ResNet18Cifar {
    fn class_name(&self) -> &str {
        "ResNet"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let mut y = call_cell(b, "conv1", &Conv2d::new(3, 64, 3), x)?;
        y = call_cell(b, "bn1", &BatchNorm2d::new(64), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        let mut in_channels = 64;
        for (i, &width) in [64usize, 128, 256, 512].iter().enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            let layer = SequentialCell::new(vec![
                Box::new(BasicBlock {
                    in_channels,
                    out_channels: width,
                    stride,
                }),
                Box::new(BasicBlock {
                    in_channels: width,
                    out_channels: width,
                    stride: 1,
                }),
            ]);
            y = call_cell(b, &format!("layer{}", i + 1), &layer, y)?;
            in_channels = width;
        }
        let pooled = ops::ReduceMean::new()
            .keep_dims(false)
            .instance("mean")
            .call(b, y, &[2, 3])?;
        call_cell(b, "end_point", &Dense::new(512, self.num_classes), pooled)
    }
}

/// ResNet-18 (CIFAR variant) with sparse softmax cross-entropy: inputs `x (batch, 3, 32, 32)`
/// Float32 and `label (batch)` Int32.
pub fn resnet18_cifar(batch: usize) -> Result<Graph, BuildError> {
    build_network(
        "ResNet",
        &ResNet18Cifar { num_classes: 10 },
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[batch, 3, 32, 32]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}

/// MindSpore's `ResidualBlock` (ResNet-50's bottleneck, expansion 4): `conv1` 1x1 to
/// `out_channels / 4`, `bn1`, ReLU, `conv2` 3x3 with the stride, `bn2`, ReLU, `conv3` 1x1 to
/// `out_channels`, `bn3`; the shortcut (`down_sample_layer`: 1x1 conv with the stride and
/// BatchNorm) when the stride or the width changes; the sum, then ReLU.
#[derive(Clone, Copy, Debug)]
pub struct ResidualBlock {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels (4x the bottleneck width).
    pub out_channels: usize,
    /// Stride of the 3x3 convolution and of the shortcut.
    pub stride: usize,
}

impl Cell for ResidualBlock {
    fn class_name(&self) -> &str {
        "ResidualBlock"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let mid = self.out_channels / 4;
        if mid == 0 {
            return Err(BuildError::InvalidArgument {
                instance: "ResidualBlock".into(),
                reason: format!(
                    "out_channels {} is below the expansion 4: the bottleneck would have no channel",
                    self.out_channels
                ),
            });
        }
        let mut y = call_cell(b, "conv1", &Conv2d::new(self.in_channels, mid, 1), x)?;
        y = call_cell(b, "bn1", &BatchNorm2d::new(mid), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        let conv2 = Conv2d::new(mid, mid, 3).stride(self.stride);
        y = call_cell(b, "conv2", &conv2, y)?;
        y = call_cell(b, "bn2", &BatchNorm2d::new(mid), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        y = call_cell(b, "conv3", &Conv2d::new(mid, self.out_channels, 1), y)?;
        y = call_cell(b, "bn3", &BatchNorm2d::new(self.out_channels), y)?;
        residual_sum(b, x, y, self.in_channels, self.out_channels, self.stride)
    }
}

/// MindSpore's `resnet50(class_num)` (the CPU data-parallel tutorial's net): a 7x7 stride-2
/// stem of 64 channels, BatchNorm, ReLU, 3x3 stride-2 max pooling (`same`); four stages
/// (`layer1`..`layer4`) of 3, 4, 6 and 3 [`ResidualBlock`]s with 256, 512, 1024 and 2048
/// output channels (stages 2-4 start with stride 2); global average pooling as `ReduceMean`
/// over (2, 3); `Dense(2048, class_num)` called `end_point`.
///
/// `width_divisor` divides every channel count (1 is the real ResNet-50; 8 or 16 give the same
/// depth and structure at a size the tests can train in seconds).
#[derive(Clone, Copy, Debug)]
pub struct ResNet50 {
    /// Number of classes.
    pub num_classes: usize,
    /// Divides every channel count (1: the real net).
    pub width_divisor: usize,
}

impl ResNet50 {
    /// The real ResNet-50 for `num_classes` classes.
    pub fn new(num_classes: usize) -> Self {
        ResNet50 {
            num_classes,
            width_divisor: 1,
        }
    }

    /// Every channel count divided by `d` (same depth, smaller widths).
    pub fn width_divisor(mut self, d: usize) -> Self {
        self.width_divisor = d;
        self
    }
}

impl Cell for ResNet50 {
    fn class_name(&self) -> &str {
        "ResNet"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let d = self.width_divisor;
        if d == 0 || 64 % d != 0 {
            return Err(BuildError::InvalidArgument {
                instance: "ResNet".into(),
                reason: format!(
                    "width_divisor {d} must divide 64 (the stem's channels) so that every stage keeps whole channels"
                ),
            });
        }
        let stem = 64 / d;
        let conv1 = Conv2d::new(3, stem, 7).stride(2).pad_mode("pad").padding(3);
        let mut y = call_cell(b, "conv1", &conv1, x)?;
        y = call_cell(b, "bn1", &BatchNorm2d::new(stem), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        let pool = MaxPool2d::new(3, 2).pad_mode("same");
        y = call_cell(b, "maxpool", &pool, y)?;
        let mut in_channels = stem;
        for (i, (&blocks, &out)) in [3usize, 4, 6, 3]
            .iter()
            .zip(&[256usize, 512, 1024, 2048])
            .enumerate()
        {
            let out = out / d;
            let stride = if i == 0 { 1 } else { 2 };
            let mut cells: Vec<Box<dyn Cell>> = Vec::with_capacity(blocks);
            for k in 0..blocks {
                cells.push(Box::new(ResidualBlock {
                    in_channels: if k == 0 { in_channels } else { out },
                    out_channels: out,
                    stride: if k == 0 { stride } else { 1 },
                }));
            }
            y = call_cell(
                b,
                &format!("layer{}", i + 1),
                &SequentialCell::new(cells),
                y,
            )?;
            in_channels = out;
        }
        let pooled = ops::ReduceMean::new()
            .keep_dims(false)
            .instance("mean")
            .call(b, y, &[2, 3])?;
        call_cell(
            b,
            "end_point",
            &Dense::new(in_channels, self.num_classes),
            pooled,
        )
    }
}

/// ResNet-50 with the tutorial's `SoftmaxCrossEntropyExpand(sparse=True)`: inputs
/// `x (batch, 3, size, size)` Float32 and `label (batch)` Int32.
pub fn resnet50(
    batch: usize,
    size: usize,
    num_classes: usize,
    width_divisor: usize,
) -> Result<Graph, BuildError> {
    build_network(
        "ResNet",
        &ResNet50::new(num_classes).width_divisor(width_divisor),
        &crate::loss::SoftmaxCrossEntropyExpand::new(true),
        &[
            ("x", DType::Float32, &[batch, 3, size, size]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}
