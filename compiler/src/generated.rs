//! Models for the strategy search beyond the transformer ([`crate::transformer`]): a wide
//! ResNet (convolutions, BatchNorm, pooling), an embedding-heavy network (Gather on a large
//! table) and seeded random layered networks of any size (the search's scale test).
//!
//! ```
//! use shardc_compiler::generated::{embedding_net, generated_network, wide_resnet};
//!
//! let g = generated_network(200, 64, 64, 7)?;
//! assert!(g.nodes.len() >= 180);
//! let e = embedding_net(8, 1000, 16, 4, &[32, 8])?;
//! assert!(e.nodes.iter().any(|n| n.op == shardc_ir::OpKind::Gather));
//! let w = wide_resnet(2, 10, 1)?;
//! assert!(w.nodes.iter().any(|n| n.op == shardc_ir::OpKind::Conv2D));
//! # Ok::<(), shardc_compiler::builder::BuildError>(())
//! ```

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::init;
use crate::loss::{MSELoss, SoftmaxCrossEntropyWithLogits};
use crate::model::build_network;
use crate::nn::{call_cell, BatchNorm2d, Cell, Conv2d, Dense, FnCell, ReLU};
use crate::ops;
use shardc_ir::{Attr, Attrs, Const, DType, Graph, OpKind};

fn invalid(instance: &str, reason: String) -> BuildError {
    BuildError::InvalidArgument {
        instance: instance.to_string(),
        reason,
    }
}

/// A wide ResNet's pre-activation basic block (Zagoruyko and Komodakis): BN, ReLU, 3x3 conv
/// (stride), BN, ReLU, 3x3 conv, plus the shortcut (a 1x1 conv with the stride when the shape
/// changes).
#[derive(Clone, Copy, Debug)]
pub struct WideBlock {
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Stride of the first convolution.
    pub stride: usize,
}

impl Cell for WideBlock {
    fn class_name(&self) -> &str {
        "WideBlock"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let mut y = call_cell(b, "bn1", &BatchNorm2d::new(self.in_channels), x)?;
        y = call_cell(b, "relu1", &ReLU, y)?;
        let pre = y;
        let conv1 = Conv2d::new(self.in_channels, self.out_channels, 3).stride(self.stride);
        y = call_cell(b, "conv1", &conv1, y)?;
        y = call_cell(b, "bn2", &BatchNorm2d::new(self.out_channels), y)?;
        y = call_cell(b, "relu2", &ReLU, y)?;
        let conv2 = Conv2d::new(self.out_channels, self.out_channels, 3);
        y = call_cell(b, "conv2", &conv2, y)?;
        let shortcut = if self.stride != 1 || self.in_channels != self.out_channels {
            let c = Conv2d::new(self.in_channels, self.out_channels, 1).stride(self.stride);
            call_cell(b, "shortcut", &c, pre)?
        } else {
            x
        };
        b.add(y, shortcut)
    }
}

/// WRN-`depth`-`widen` for CIFAR-10 (3x32x32): a 3x3 stem of 16 channels, three groups of
/// `(depth - 4) / 6` [`WideBlock`]s of `16·widen`, `32·widen`, `64·widen` channels (groups 2
/// and 3 start with stride 2), BN, ReLU, global average pooling, `Dense(64·widen, classes)`.
#[derive(Clone, Copy, Debug)]
pub struct WideResNet {
    /// `6n + 4`.
    pub depth: usize,
    /// The width multiplier `k`.
    pub widen: usize,
    /// Number of classes.
    pub num_classes: usize,
}

impl Cell for WideResNet {
    fn class_name(&self) -> &str {
        "WideResNet"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let n = (self.depth - 4) / 6;
        let mut y = call_cell(b, "conv1", &Conv2d::new(3, 16, 3), x)?;
        let mut in_channels = 16;
        for (g, base) in [16usize, 32, 64].iter().enumerate() {
            let width = base * self.widen;
            for i in 0..n {
                let block = WideBlock {
                    in_channels,
                    out_channels: width,
                    stride: if g > 0 && i == 0 { 2 } else { 1 },
                };
                y = call_cell(b, &format!("group{}_block{i}", g + 1), &block, y)?;
                in_channels = width;
            }
        }
        y = call_cell(b, "bn", &BatchNorm2d::new(in_channels), y)?;
        y = call_cell(b, "relu", &ReLU, y)?;
        let pooled = ops::ReduceMean::new()
            .keep_dims(false)
            .instance("mean")
            .call(b, y, &[2, 3])?;
        call_cell(b, "fc", &Dense::new(in_channels, self.num_classes), pooled)
    }
}

/// WRN-`depth`-`widen` with sparse softmax cross-entropy: inputs `x (batch, 3, 32, 32)` and
/// `label (batch)` Int32. Errors: a depth that is not `6n + 4` with `n ≥ 1`, a zero width.
pub fn wide_resnet(batch: usize, depth: usize, widen: usize) -> Result<Graph, BuildError> {
    if depth < 10 || (depth - 4) % 6 != 0 {
        return Err(invalid(
            "WideResNet",
            format!("depth {depth} is not 6n + 4 with n >= 1 (10, 16, 22, 28, ...)"),
        ));
    }
    if widen == 0 || batch == 0 {
        return Err(invalid(
            "WideResNet",
            format!("widen {widen} and batch {batch} must be at least 1"),
        ));
    }
    build_network(
        "WideResNet",
        &WideResNet {
            depth,
            widen,
            num_classes: 10,
        },
        &SoftmaxCrossEntropyWithLogits::new(true, "mean"),
        &[
            ("x", DType::Float32, &[batch, 3, 32, 32]),
            ("label", DType::Int32, &[batch]),
        ],
    )
}

/// An embedding-heavy network: tokens `(batch, seq)` Int32 → `Gather` on a table
/// `(vocab, embed)` → reshape to `(batch, seq·embed)` → `Dense` layers of `dims` with ReLU
/// between → MSE against `label (batch, dims.last())`. The table dominates the parameters,
/// so the search meets a weight far larger than its activations.
pub fn embedding_net(
    batch: usize,
    vocab: usize,
    embed: usize,
    seq: usize,
    dims: &[usize],
) -> Result<Graph, BuildError> {
    if [batch, vocab, embed, seq].contains(&0) || dims.is_empty() || dims.contains(&0) {
        return Err(invalid(
            "EmbeddingNet",
            format!(
                "batch {batch}, vocab {vocab}, embed {embed}, seq {seq} and dims {dims:?} must \
                 all be at least 1 (dims not empty)"
            ),
        ));
    }
    let dims = dims.to_vec();
    let out = *dims.last().unwrap_or(&1);
    let net = FnCell::new(
        "EmbeddingNet",
        move |b: &mut GraphBuilder, tokens: Value| {
            let table = b.weight(
                "embedding.table",
                DType::Float32,
                &[vocab, embed],
                init::normal(0.02),
            )?;
            let e = b.gather(table, tokens, 0)?;
            let mut x = b.reshape(e, &[batch as i64, (seq * embed) as i64])?;
            let mut width = seq * embed;
            for (i, &d) in dims.iter().enumerate() {
                x = call_cell(b, &format!("dense{i}"), &Dense::new(width, d), x)?;
                if i + 1 < dims.len() {
                    x = b.relu(x)?;
                }
                width = d;
            }
            Ok(x)
        },
    );
    build_network(
        "EmbeddingNet",
        &net,
        &MSELoss::new(),
        &[
            ("tokens", DType::Int32, &[batch, seq]),
            ("label", DType::Float32, &[batch, out]),
        ],
    )
}

/// SplitMix64: a small deterministic generator for [`generated_network`].
struct Mix(u64);

impl Mix {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n.max(1) as u64) as usize
    }
}

/// A seeded random layered network of about `ops` forward ops on `(batch, width)`
/// activations: blocks drawn from dense (`MatMul` + bias `Add`) with an activation (ReLU,
/// GeLU or Tanh), a residual block (dense, activation, dense, `Add` of the block's input),
/// LayerNorm, and a two-branch block (two dense branches of different inner widths joined by
/// `Add`), so the graph has fan-out and joins, not only chains. Inner widths are `width`,
/// `2·width` or `4·width`; take `width` and `batch` powers of two for splits up to thousands
/// of devices. The loss is MSE against `label (batch, width)`. The same seed gives the same
/// graph.
pub fn generated_network(
    ops: usize,
    width: usize,
    batch: usize,
    seed: u64,
) -> Result<Graph, BuildError> {
    if ops == 0 || width == 0 || batch == 0 {
        return Err(invalid(
            "GeneratedNet",
            format!("ops {ops}, width {width} and batch {batch} must be at least 1"),
        ));
    }
    let net = FnCell::new("GeneratedNet", move |b: &mut GraphBuilder, x: Value| {
        let mut rng = Mix(seed);
        let mut h = x;
        let mut k = 0usize;
        let dense = |b: &mut GraphBuilder, k: &mut usize, x: Value, i: usize, o: usize| {
            let w = b.weight(
                &format!("w{k}"),
                DType::Float32,
                &[i, o],
                init::normal(0.02),
            )?;
            let bias = b.weight(&format!("b{k}"), DType::Float32, &[o], init::zeros())?;
            *k += 1;
            let y = b.matmul(x, w)?;
            b.add(y, bias)
        };
        let act = |b: &mut GraphBuilder, x: Value, r: usize| match r {
            0 => b.relu(x),
            1 => b.gelu(x),
            _ => b.tanh(x),
        };
        while b.graph().nodes.len() < ops {
            match rng.below(4) {
                0 => {
                    let y = dense(b, &mut k, h, width, width)?;
                    h = act(b, y, rng.below(3))?;
                }
                1 => {
                    let inner = width << rng.below(3);
                    let y = dense(b, &mut k, h, width, inner)?;
                    let y = act(b, y, rng.below(3))?;
                    let y = dense(b, &mut k, y, inner, width)?;
                    h = b.add(y, h)?;
                }
                2 => {
                    let gamma = b.weight(
                        &format!("ln{k}.gamma"),
                        DType::Float32,
                        &[width],
                        init::ones(),
                    )?;
                    let beta = b.weight(
                        &format!("ln{k}.beta"),
                        DType::Float32,
                        &[width],
                        init::zeros(),
                    )?;
                    k += 1;
                    let attrs = Attrs::new()
                        .with("begin_norm_axis", Attr::Int(-1))
                        .with("begin_params_axis", Attr::Int(-1))
                        .with("epsilon", Attr::Float(1e-7));
                    let t = b.op(
                        OpKind::LayerNorm,
                        &[h.into(), gamma.into(), beta.into()],
                        attrs,
                    )?;
                    h = b.op(
                        OpKind::TupleGetItem,
                        &[t.into(), Const::Int(0).into()],
                        Attrs::new(),
                    )?;
                }
                _ => {
                    let (i1, i2) = (width << rng.below(3), width << rng.below(3));
                    let a = dense(b, &mut k, h, width, i1)?;
                    let a = act(b, a, rng.below(3))?;
                    let a = dense(b, &mut k, a, i1, width)?;
                    let c = dense(b, &mut k, h, width, i2)?;
                    let c = act(b, c, rng.below(3))?;
                    let c = dense(b, &mut k, c, i2, width)?;
                    h = b.add(a, c)?;
                }
            }
        }
        Ok(h)
    });
    build_network(
        "GeneratedNet",
        &net,
        &MSELoss::new(),
        &[
            ("x", DType::Float32, &[batch, width]),
            ("label", DType::Float32, &[batch, width]),
        ],
    )
}
