//! A [`crate::transformer`] as the stage planner sees it
//! ([`shardc_passes::parallel::search::layer_profile::LayeredModel`]): its training graph with
//! any number of layers at any micro-batch (Adam), optionally annotated with Megatron-LM's
//! tensor-parallel strategies, and which layer each op belongs to (by its cell's scope,
//! `layer{i}-TransformerEncoderLayer`, which the backward nodes keep under `Gradients/`).
//! `shardc bench plan` and `shardc explain --plan-pipeline` plan with it.

use crate::optim::Adam;
use crate::pipeline::{compile, CompileOptions};
use crate::transformer::{transformer, TransformerConfig};
use shardc_ir::{Graph, Node, Strategy};
use shardc_passes::parallel::search::layer_profile::LayeredModel;

/// A transformer of the builder as the planner sees it: its layers, built at any micro-batch,
/// optionally with Megatron-LM's tensor-parallel strategies.
#[derive(Clone, Debug)]
pub struct TransformerLayers {
    /// The configuration (its `batch` is ignored: the planner sets the micro-batch).
    pub cfg: TransformerConfig,
}

/// Megatron-LM's strategies of one layer's ops on a `tp × dp` mesh: Q, K, V and the first FFN
/// dense column-split (weights on their output dimension), attention split by heads, the
/// attention output and second FFN dense row-split (a partial sum, then AllReduce), the batch
/// split `dp` ways throughout.
pub fn megatron_annotations(layer: usize, tp: usize, dp: usize) -> Vec<(String, Strategy)> {
    let (t, d) = (tp as i64, dp as i64);
    let mut v = Vec::new();
    let mut add =
        |name: &str, s: Vec<Vec<i64>>| v.push((format!("layer{layer}_{name}"), Strategy(s)));
    for x in ["q", "k", "v"] {
        add(&format!("attn_{x}_matmul"), vec![vec![d, 1], vec![1, t]]);
        add(&format!("attn_{x}_bias_add"), vec![vec![d, t], vec![t]]);
    }
    add(
        "attn_scores_batch_matmul",
        vec![vec![d, t, 1, 1], vec![d, t, 1, 1]],
    );
    add("attn_softmax", vec![vec![d, t, 1, 1]]);
    add(
        "attn_context_batch_matmul",
        vec![vec![d, t, 1, 1], vec![d, t, 1, 1]],
    );
    add("attn_out_matmul", vec![vec![d, t], vec![t, 1]]);
    add("ffn_in_matmul", vec![vec![d, 1], vec![1, t]]);
    add("ffn_in_bias_add", vec![vec![d, t], vec![t]]);
    add("ffn_gelu", vec![vec![d, t]]);
    add("ffn_out_matmul", vec![vec![d, t], vec![t, 1]]);
    v
}

/// The layer index in a scope or instance name: the digits after the first `layer` followed
/// by digits.
pub fn layer_index(s: &str) -> Option<usize> {
    let mut rest = s;
    while let Some(at) = rest.find("layer") {
        let tail = &rest[at + 5..];
        let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
        if !digits.is_empty() {
            return digits.parse().ok();
        }
        rest = tail;
    }
    None
}

/// `s` with the digits after its first `layer` removed.
pub fn without_layer_index(s: &str) -> String {
    let mut rest = s;
    let mut out = String::new();
    while let Some(at) = rest.find("layer") {
        out.push_str(&rest[..at + 5]);
        let tail = &rest[at + 5..];
        let n = tail.chars().take_while(char::is_ascii_digit).count();
        if n > 0 {
            out.push_str(&tail[n..]);
            return out;
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

impl LayeredModel for TransformerLayers {
    fn layers(&self) -> usize {
        self.cfg.layers
    }

    fn layer_graph(
        &self,
        layers: usize,
        micro_batch: usize,
        tensor_parallel: Option<(usize, usize)>,
    ) -> std::result::Result<Option<Graph>, String> {
        let c = &self.cfg;
        let mut cfg =
            TransformerConfig::new(layers, c.hidden, c.heads, c.seq, micro_batch).ffn(c.ffn);
        if let Some((tp, dp)) = tensor_parallel {
            if c.heads % tp != 0 || c.ffn % tp != 0 || micro_batch % dp != 0 {
                return Ok(None);
            }
            for i in 0..layers {
                cfg.annotations.extend(megatron_annotations(i, tp, dp));
            }
        }
        let forward = transformer(&cfg).map_err(|e| e.to_string())?;
        compile(
            forward,
            &CompileOptions {
                optimizer: Some(Adam::new(1e-4).to_spec()),
                verify: false,
                ..Default::default()
            },
        )
        .map(|c| Some(c.graph))
        .map_err(|e| e.to_string())
    }

    fn layer_of(&self, node: &Node) -> Option<usize> {
        // The scope names the layer's cell (`.../layer3-TransformerEncoderLayer`, backward
        // nodes under `Gradients/...`); the instance name starts with `layer3_`.
        if node.scope.contains("-TransformerEncoderLayer") {
            layer_index(&node.scope)
        } else {
            None
        }
    }

    fn role(&self, node: &Node) -> String {
        without_layer_index(&node.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_names_fold() {
        assert_eq!(
            layer_index("Default/x/layer12-TransformerEncoderLayer"),
            Some(12)
        );
        assert_eq!(
            without_layer_index("layer12_attn_q_matmul"),
            "layer_attn_q_matmul"
        );
        assert_eq!(without_layer_index("grad_layer3_ffn"), "grad_layer_ffn");
        assert_eq!(without_layer_index("sub"), "sub");
    }
}
