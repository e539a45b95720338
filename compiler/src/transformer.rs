//! A transformer encoder stack with an MSE loss: the model of the parallel compiler's
//! compile-time benchmark and of its largest equivalence tests.
//!
//! The layout follows MindSpore's `nn.transformer`: the dense layers see 2-D activations
//! `(batch * seq, hidden)`, so every `MatMul` is 2-D, and attention reshapes them to 4-D
//! `(batch, heads, seq, hidden / heads)`. Per layer `i`, in this order (instance names
//! prefixed by `layer{i}_`, scope `layer{i}-TransformerEncoderLayer`, parameters
//! `layer{i}.{name}`):
//!
//! | step | ops (instance names without the prefix) |
//! |------|------------------------------------------|
//! | Q, K, V dense | `attn_q_matmul` (`MatMul`) + `attn_q_bias_add` (`Add`), same for `k`, `v` |
//! | to heads | `attn_q_reshape` `(B*S, H) -> (B, S, A, H/A)`, `attn_q_transpose` `(0, 2, 1, 3)`, same for `k`, `v` |
//! | scores | `attn_scores_batch_matmul` (`q k^T`, `transpose_b`), `attn_scale_mul` (`* 1/sqrt(H/A)`), `attn_softmax` |
//! | context | `attn_context_batch_matmul` (`p v`), `attn_context_transpose`, `attn_context_reshape` back to `(B*S, H)` |
//! | output | `attn_out_matmul` + `attn_out_bias_add`, `attn_residual_add`, `attn_layernorm` + `attn_layernorm_output` (`TupleGetItem` 0) |
//! | FFN | `ffn_in_matmul` + `ffn_in_bias_add` `(H -> F)`, `ffn_gelu`, `ffn_out_matmul` + `ffn_out_bias_add` `(F -> H)`, `ffn_residual_add`, `ffn_layernorm` + `ffn_layernorm_output` |
//!
//! That is 31 nodes per layer: 6 `MatMul`, 8 `Add`, 4 `Reshape`, 4 `Transpose`, 2
//! `BatchMatMul`, 1 `Mul`, 1 `Softmax`, 1 `GeLU`, 2 `LayerNorm`, 2 `TupleGetItem`. The loss is
//! MindSpore's `MSELoss`: `Sub`, `Square`, `ReduceMean` over all axes.
//!
//! Weights are `normal(sigma = 0.02)` (seeded per weight by the builder), biases and LayerNorm
//! betas zeros, LayerNorm gammas ones. Inputs: `x (batch * seq, hidden)` and
//! `label (batch * seq, hidden)`, Float32.
//!
//! ```
//! use shardc_compiler::transformer::{transformer, TransformerConfig};
//!
//! let g = transformer(&TransformerConfig::new(2, 16, 2, 4, 2))?;
//! assert!(g.node_by_instance("layer1_attn_q_matmul").is_some());
//! # Ok::<(), shardc_compiler::builder::BuildError>(())
//! ```

use crate::builder::{BuildError, GraphBuilder, Value};
use crate::init;
use crate::loss::MSELoss;
use crate::model::build_network;
use crate::nn::{call_cell, Cell};
use shardc_ir::{Attr, Attrs, Const, DType, Graph, OpKind, Operand, Strategy};
use std::cell::RefCell;

/// The shape of a [`transformer`] and the strategies of its annotated ops.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    /// Number of encoder layers (at least 1).
    pub layers: usize,
    /// Hidden size `H` (divisible by `heads`).
    pub hidden: usize,
    /// Number of attention heads `A`.
    pub heads: usize,
    /// Sequence length `S`.
    pub seq: usize,
    /// Batch size `B`.
    pub batch: usize,
    /// Inner size `F` of the feed-forward block ([`TransformerConfig::new`] sets `4 * hidden`).
    pub ffn: usize,
    /// `in_strategy` of ops by full instance name (`layer0_attn_q_matmul`): each is checked
    /// against the op when it is added, and one naming no op of the graph is an error.
    pub annotations: Vec<(String, Strategy)>,
    /// Recompute every encoder layer in the backward pass (MindSpore's `cell.recompute()` on
    /// each layer: its nodes but its output replayed; default false).
    pub recompute: bool,
}

impl TransformerConfig {
    /// `layers` layers of `hidden` units and `heads` heads over `batch` sequences of `seq`
    /// tokens; feed-forward size `4 * hidden`; no annotations.
    pub fn new(layers: usize, hidden: usize, heads: usize, seq: usize, batch: usize) -> Self {
        TransformerConfig {
            layers,
            hidden,
            heads,
            seq,
            batch,
            ffn: 4 * hidden,
            annotations: Vec::new(),
            recompute: false,
        }
    }

    /// Sets the feed-forward size.
    pub fn ffn(mut self, ffn: usize) -> Self {
        self.ffn = ffn;
        self
    }

    /// Recomputes every encoder layer in the backward pass ([`TransformerConfig::recompute`]).
    pub fn with_recompute(mut self, on: bool) -> Self {
        self.recompute = on;
        self
    }

    /// Adds the `in_strategy` of the op named `instance`.
    pub fn annotate(mut self, instance: &str, strategy: Strategy) -> Self {
        self.annotations.push((instance.to_string(), strategy));
        self
    }

    /// Size of one head, `hidden / heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Rows of the 2-D activations, `batch * seq`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// Checks that the sizes are usable.
    pub fn validate(&self) -> Result<(), BuildError> {
        let fail = |reason: String| {
            Err(BuildError::InvalidArgument {
                instance: "transformer".into(),
                reason,
            })
        };
        for (name, v) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("seq", self.seq),
            ("batch", self.batch),
            ("ffn", self.ffn),
        ] {
            if v == 0 {
                return fail(format!("{name} must be at least 1, got 0"));
            }
        }
        if self.hidden % self.heads != 0 {
            return fail(format!(
                "hidden {} is not divisible by heads {}",
                self.hidden, self.heads
            ));
        }
        let too_big = self
            .batch
            .checked_mul(self.seq)
            .and_then(|t| t.checked_mul(self.hidden.max(self.ffn)))
            .is_none_or(|n| i64::try_from(n).is_err());
        if too_big {
            return fail(format!(
                "batch {} * seq {} * max(hidden {}, ffn {}) overflows",
                self.batch, self.seq, self.hidden, self.ffn
            ));
        }
        Ok(())
    }
}

/// Nodes per encoder layer (see the module table).
pub const NODES_PER_LAYER: usize = 31;

/// The forward graph of `cfg` with its MSE loss (graph name `Transformer`). Errors: a config
/// [`TransformerConfig::validate`] rejects, an annotation that does not fit its op, or one
/// naming no op of the graph.
pub fn transformer(cfg: &TransformerConfig) -> Result<Graph, BuildError> {
    cfg.validate()?;
    let used = RefCell::new(vec![false; cfg.annotations.len()]);
    let net = Transformer { cfg, used: &used };
    let tokens = cfg.tokens();
    let g = build_network(
        "Transformer",
        &net,
        &MSELoss::new(),
        &[
            ("x", DType::Float32, &[tokens, cfg.hidden]),
            ("label", DType::Float32, &[tokens, cfg.hidden]),
        ],
    )?;
    if let Some(i) = used.borrow().iter().position(|u| !u) {
        let (name, s) = &cfg.annotations[i];
        return Err(BuildError::InvalidArgument {
            instance: name.clone(),
            reason: format!("annotation {s} names no op of the transformer"),
        });
    }
    Ok(g)
}

/// The backbone: the encoder layers in sequence.
struct Transformer<'a> {
    cfg: &'a TransformerConfig,
    used: &'a RefCell<Vec<bool>>,
}

impl Cell for Transformer<'_> {
    fn class_name(&self) -> &str {
        "Transformer"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let mut y = x;
        for index in 0..self.cfg.layers {
            let layer = EncoderLayer {
                cfg: self.cfg,
                used: self.used,
                index,
            };
            y = if self.cfg.recompute {
                call_cell(b, &format!("layer{index}"), &layer.recompute(), y)?
            } else {
                call_cell(b, &format!("layer{index}"), &layer, y)?
            };
        }
        Ok(y)
    }
}

/// One encoder layer (post-LayerNorm, as BERT).
struct EncoderLayer<'a> {
    cfg: &'a TransformerConfig,
    used: &'a RefCell<Vec<bool>>,
    index: usize,
}

impl EncoderLayer<'_> {
    /// Adds `op` named `layer{i}_{name}`, with its annotation if there is one.
    fn op(
        &self,
        b: &mut GraphBuilder,
        op: OpKind,
        name: &str,
        inputs: &[Operand],
        attrs: Attrs,
    ) -> Result<Value, BuildError> {
        let instance = format!("layer{}_{name}", self.index);
        let mut strategy = None;
        for (i, (n, s)) in self.cfg.annotations.iter().enumerate() {
            if *n == instance {
                strategy = Some(s.clone());
                self.used.borrow_mut()[i] = true;
            }
        }
        b.op_full(op, inputs, attrs, &instance, strategy, None)
    }

    /// `x @ W + b` with `W (n_in, n_out)` normal(0.02) and `b (n_out)` zeros, parameters
    /// `{name}.weight` and `{name}.bias`, ops `{name}_matmul` and `{name}_bias_add`.
    fn dense(
        &self,
        b: &mut GraphBuilder,
        name: &str,
        x: Value,
        n_in: usize,
        n_out: usize,
    ) -> Result<Value, BuildError> {
        let w = b.weight(
            &format!("{name}.weight"),
            DType::Float32,
            &[n_in, n_out],
            init::normal(0.02),
        )?;
        let bias = b.weight(
            &format!("{name}.bias"),
            DType::Float32,
            &[n_out],
            init::zeros(),
        )?;
        let attrs = Attrs::new()
            .with("transpose_a", Attr::Bool(false))
            .with("transpose_b", Attr::Bool(false));
        let y = self.op(
            b,
            OpKind::MatMul,
            &format!("{name}_matmul"),
            &[x.into(), w.into()],
            attrs,
        )?;
        self.op(
            b,
            OpKind::Add,
            &format!("{name}_bias_add"),
            &[y.into(), bias.into()],
            Attrs::new(),
        )
    }

    /// `(B*S, H) -> (B, A, S, H/A)`: ops `{name}_reshape`, `{name}_transpose`.
    fn to_heads(&self, b: &mut GraphBuilder, name: &str, x: Value) -> Result<Value, BuildError> {
        let c = self.cfg;
        let shape = [c.batch, c.seq, c.heads, c.head_dim()].map(|d| d as i64);
        let r = self.op(
            b,
            OpKind::Reshape,
            &format!("{name}_reshape"),
            &[x.into(), Const::Ints(shape.to_vec()).into()],
            Attrs::new(),
        )?;
        self.op(
            b,
            OpKind::Transpose,
            &format!("{name}_transpose"),
            &[r.into(), Const::Ints(vec![0, 2, 1, 3]).into()],
            Attrs::new(),
        )
    }

    /// `LayerNorm(x)` over the last axis with gamma ones and beta zeros (`{name}.gamma`,
    /// `{name}.beta`), ops `{name}` and `{name}_output` (its item 0).
    fn layer_norm(&self, b: &mut GraphBuilder, name: &str, x: Value) -> Result<Value, BuildError> {
        let h = self.cfg.hidden;
        let gamma = b.weight(&format!("{name}.gamma"), DType::Float32, &[h], init::ones())?;
        let beta = b.weight(&format!("{name}.beta"), DType::Float32, &[h], init::zeros())?;
        let attrs = Attrs::new()
            .with("begin_norm_axis", Attr::Int(-1))
            .with("begin_params_axis", Attr::Int(-1))
            .with("epsilon", Attr::Float(1e-7));
        let t = self.op(
            b,
            OpKind::LayerNorm,
            name,
            &[x.into(), gamma.into(), beta.into()],
            attrs,
        )?;
        self.op(
            b,
            OpKind::TupleGetItem,
            &format!("{name}_output"),
            &[t.into(), Const::Int(0).into()],
            Attrs::new(),
        )
    }
}

impl Cell for EncoderLayer<'_> {
    fn class_name(&self) -> &str {
        "TransformerEncoderLayer"
    }

    fn construct(&self, b: &mut GraphBuilder, x: Value) -> Result<Value, BuildError> {
        let c = self.cfg;
        let h = c.hidden;
        let bmm = |ta: bool, tb: bool| {
            Attrs::new()
                .with("transpose_a", Attr::Bool(ta))
                .with("transpose_b", Attr::Bool(tb))
        };
        // Attention.
        let q = self.dense(b, "attn_q", x, h, h)?;
        let k = self.dense(b, "attn_k", x, h, h)?;
        let v = self.dense(b, "attn_v", x, h, h)?;
        let q = self.to_heads(b, "attn_q", q)?;
        let k = self.to_heads(b, "attn_k", k)?;
        let v = self.to_heads(b, "attn_v", v)?;
        let scores = self.op(
            b,
            OpKind::BatchMatMul,
            "attn_scores_batch_matmul",
            &[q.into(), k.into()],
            bmm(false, true),
        )?;
        let scale = 1.0 / (c.head_dim() as f64).sqrt();
        let scores = self.op(
            b,
            OpKind::Mul,
            "attn_scale_mul",
            &[scores.into(), Const::Float(scale).into()],
            Attrs::new(),
        )?;
        let probs = self.op(
            b,
            OpKind::Softmax,
            "attn_softmax",
            &[scores.into()],
            Attrs::new().with("axis", Attr::Int(-1)),
        )?;
        let ctx = self.op(
            b,
            OpKind::BatchMatMul,
            "attn_context_batch_matmul",
            &[probs.into(), v.into()],
            bmm(false, false),
        )?;
        let ctx = self.op(
            b,
            OpKind::Transpose,
            "attn_context_transpose",
            &[ctx.into(), Const::Ints(vec![0, 2, 1, 3]).into()],
            Attrs::new(),
        )?;
        let ctx = self.op(
            b,
            OpKind::Reshape,
            "attn_context_reshape",
            &[
                ctx.into(),
                Const::Ints(vec![c.tokens() as i64, h as i64]).into(),
            ],
            Attrs::new(),
        )?;
        let out = self.dense(b, "attn_out", ctx, h, h)?;
        let res = self.op(
            b,
            OpKind::Add,
            "attn_residual_add",
            &[out.into(), x.into()],
            Attrs::new(),
        )?;
        let y = self.layer_norm(b, "attn_layernorm", res)?;
        // Feed-forward.
        let f = self.dense(b, "ffn_in", y, h, c.ffn)?;
        let f = self.op(b, OpKind::GeLU, "ffn_gelu", &[f.into()], Attrs::new())?;
        let f = self.dense(b, "ffn_out", f, c.ffn, h)?;
        let res = self.op(
            b,
            OpKind::Add,
            "ffn_residual_add",
            &[f.into(), y.into()],
            Attrs::new(),
        )?;
        self.layer_norm(b, "ffn_layernorm", res)
    }
}
