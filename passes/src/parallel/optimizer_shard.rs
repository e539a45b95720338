//! MindSpore's parallel optimizer (`enable_parallel_optimizer`, ZeRO-1): a trained weight and
//! its optimizer state are split over the devices that hold the same slice of it (its
//! data-parallel group), each device updating only its own part.
//!
//! After strategy assignment, for every weight with an optimizer update whose bytes reach
//! `parallel_optimizer_threshold`, [`apply`] takes the device axes over which the weight's
//! layout is replicated (the largest run of adjacent such axes: the data-parallel group),
//! limited to `optimizer_weight_shard_size` devices (consecutive ranks of the group, the
//! axis's minor factor), and splits the first whole dimension of the weight that they divide
//! evenly (MindSpore splits dimension 0) over them. The weight's parameter, its optimizer
//! state (the other parameters of its shape its update reads), the update and the `Assign`s
//! take that layout ([`OptimizerShard`] records each); nothing else changes. The partition
//! then does the rest with its ordinary redistribution: an op that reads the weight gets it
//! **all-gathered** (`parallel_optimizer_allgather_<w>_*`), and the gradient, partial over
//! the group, reaches the update as a **reduce-scatter** (`mirror_grad_<w>_ReduceScatter*`)
//! instead of the data-parallel AllReduce (with `gradients_mean` false, scaled by the group
//! size as the AllReduce would be). Each rank's checkpoint then holds its shard.
//!
//! The search's memory model asks [`shard_layout`] too, so `max_device_memory` sees the
//! saving.

pub use super::assignment::OptimizerShard;

use super::assignment::{Assignment, Decision, Source};
use super::propagation::follow_weight;
use super::roles::{gradient_accumulation, updated_weight};
use super::{ParallelError, ParallelOptimizer, ParallelOptions};
use shardc_ir::{Graph, OpClass, Operand, TensorLayout};

/// The devices over which `w` is replicated, as the largest run of adjacent replicated axes
/// (counted from the right): (lowest axis, number of axes, devices).
fn replicated_run(w: &TensorLayout) -> Option<(usize, usize, usize)> {
    let used = |k: usize| w.tensor_map.contains(&(k as i64)) || w.partial.contains(&k);
    let mut best: Option<(usize, usize, usize)> = None;
    let mut k = 0;
    let n = w.dev_matrix.len();
    while k < n {
        if used(k) || w.axis_size(k) == 1 {
            k += 1;
            continue;
        }
        let start = k;
        let mut size = 1;
        while k < n && !used(k) {
            size *= w.axis_size(k);
            k += 1;
        }
        if best.is_none_or(|(_, _, s)| size > s) {
            best = Some((start, k - start, size));
        }
    }
    best.filter(|&(_, _, s)| s > 1)
}

/// The layout `w` takes when the parallel optimizer splits it: `Ok(None)` when it stays as it
/// is (under the threshold, partial, nothing replicated, no dimension divisible); an error
/// when `optimizer_weight_shard_size` does not divide the weight's data-parallel group.
/// `bytes` is the weight's whole size; `weight` its name (for the error).
pub fn shard_layout(
    w: &TensorLayout,
    bytes: usize,
    weight: &str,
    cfg: &ParallelOptimizer,
) -> Result<Option<(TensorLayout, usize, usize)>, ParallelError> {
    if (bytes as f64) < cfg.threshold_bytes() || w.is_partial() {
        return Ok(None);
    }
    let Some((start, len, group)) = replicated_run(w) else {
        return Ok(None);
    };
    let devices = match cfg.weight_shard_size {
        Some(s) if s >= group => group,
        Some(s) if group % s != 0 => {
            return Err(ParallelError::Options(format!(
                "optimizer_weight_shard_size {s} does not divide the data-parallel group of \
                 weight '{weight}' ({group} devices hold the same slice of it under {w}): use \
                 a divisor of {group} or -1"
            )))
        }
        Some(s) => s,
        None => group,
    };
    // A dimension mapped to an axis of one device is whole too.
    let (slice, splits) = (w.slice_shape(), w.splits());
    let Some(dim) = (0..slice.len()).find(|&d| splits[d] == 1 && slice[d] % devices == 0) else {
        return Ok(None);
    };
    // The run of axes [start, start + len) becomes one axis of `group` devices, factored as
    // (group / devices) major x `devices` minor; the minor one splits `dim`.
    let mut from_right: Vec<usize> = w.dev_matrix.iter().rev().copied().collect();
    let major = group / devices;
    let mut replacement = vec![devices];
    if major > 1 {
        replacement.push(major);
    }
    let added = replacement.len() as i64 - len as i64;
    from_right.splice(start..start + len, replacement);
    let renumber = |k: usize| -> usize {
        if k >= start + len {
            (k as i64 + added) as usize
        } else {
            k
        }
    };
    let mut tensor_map: Vec<i64> = w
        .tensor_map
        .iter()
        .map(|&k| {
            if k < 0 {
                k
            } else {
                renumber(k as usize) as i64
            }
        })
        .collect();
    tensor_map[dim] = start as i64;
    let out = TensorLayout {
        dev_matrix: from_right.into_iter().rev().collect(),
        tensor_map,
        tensor_shape: w.tensor_shape.clone(),
        partial: w.partial.iter().map(|&k| renumber(k)).collect(),
        partial_op: w.partial_op,
    };
    Ok(Some((out, dim, devices)))
}

/// Splits every eligible weight of `a` and its optimizer state over its data-parallel group
/// (see the module documentation); records each in `a.optimizer_shards`.
pub fn apply(g: &Graph, a: &mut Assignment, opts: &ParallelOptions) -> Result<(), ParallelError> {
    let Some(cfg) = &opts.parallel_optimizer else {
        return Ok(());
    };
    let mut changed: Vec<Option<TensorLayout>> = vec![None; g.params.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        if node.op.class() != OpClass::Optimizer {
            continue;
        }
        let Some(w) = updated_weight(g, node) else {
            continue;
        };
        if changed[w].is_some() {
            continue;
        }
        let param = &g.params[w];
        let before = a.param_layouts[w].clone();
        let Some((layout, dim, devices)) =
            shard_layout(&before, param.ty.size_bytes(), &param.name, cfg)?
        else {
            continue;
        };
        let states: Vec<usize> = node
            .inputs
            .iter()
            .skip(1)
            .filter_map(|o| match o {
                Operand::Param(p)
                    if p.index() != w
                        && g.param(*p).is_weight()
                        && g.param(*p).ty.shape == param.ty.shape =>
                {
                    Some(p.index())
                }
                _ => None,
            })
            .collect();
        for &p in std::iter::once(&w).chain(&states) {
            a.param_layouts[p] = layout.clone();
            changed[p] = Some(layout.clone());
        }
        a.decisions[i] = Some(Decision {
            sharding: follow_weight(g, node, &layout),
            source: Source::FollowsWeight(format!(
                "{} (split by the parallel optimizer: dimension {dim} over {devices} devices)",
                param.name
            )),
            candidates: Vec::new(),
        });
        a.optimizer_shards.push(OptimizerShard {
            weight: w,
            states,
            dim,
            devices,
            before,
        });
    }
    // The gradient's accumulation (the micro-batches' terms summed) takes the shard's layout
    // too: each term, partial over the group, is reduce-scattered into it (MindSpore's
    // `gradient_accumulation_shard`); the pipeline pass sums the raw terms first and
    // reduce-scatters once when that option is off.
    let users = g.users();
    for (i, node) in g.nodes.iter().enumerate() {
        if node.op.class() != OpClass::Optimizer {
            continue;
        }
        let Some((w, Some(layout))) = updated_weight(g, node).map(|w| (w, &changed[w])) else {
            continue;
        };
        for add in gradient_accumulation(g, &users, i) {
            a.decisions[add] = Some(Decision {
                sharding: follow_weight(g, &g.nodes[add], layout),
                source: Source::FollowsWeight(format!(
                    "{} (its gradient accumulated as split by the parallel optimizer)",
                    g.params[w].name
                )),
                candidates: Vec::new(),
            });
        }
    }
    // Every other update or Assign of a split parameter follows its new layout.
    for (i, node) in g.nodes.iter().enumerate() {
        let Some(p) = updated_weight(g, node) else {
            continue;
        };
        let Some(layout) = &changed[p] else {
            continue;
        };
        let already = a.decisions[i]
            .as_ref()
            .and_then(|d| d.sharding.inputs.first().cloned().flatten())
            .is_some_and(|l| &l == layout);
        if already {
            continue;
        }
        a.decisions[i] = Some(Decision {
            sharding: follow_weight(g, node, layout),
            source: Source::FollowsWeight(format!(
                "{} (split by the parallel optimizer)",
                g.params[p].name
            )),
            candidates: Vec::new(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::ReduceOp;

    fn cfg(size: Option<usize>) -> ParallelOptimizer {
        ParallelOptimizer {
            threshold_kb: 0,
            weight_shard_size: size,
            gradient_accumulation_shard: false,
        }
    }

    fn layout(dev: &[usize], map: &[i64], shape: &[usize]) -> TensorLayout {
        TensorLayout {
            dev_matrix: dev.to_vec(),
            tensor_map: map.to_vec(),
            tensor_shape: shape.to_vec(),
            partial: Vec::new(),
            partial_op: ReduceOp::Sum,
        }
    }

    #[test]
    fn a_replicated_weight_splits_dimension_zero_over_the_whole_group() {
        let w = layout(&[4, 1, 1], &[1, 0], &[32, 16]);
        let (l, dim, n) = shard_layout(&w, 2048, "w", &cfg(None)).unwrap().unwrap();
        assert_eq!((dim, n), (0, 4));
        assert_eq!(l.slice_shape(), vec![8, 16]);
        l.validate().unwrap();
    }

    #[test]
    fn a_shard_size_factors_the_group_into_consecutive_devices() {
        let w = layout(&[8], &[-1, -1], &[32, 16]);
        let (l, _, n) = shard_layout(&w, 2048, "w", &cfg(Some(2))).unwrap().unwrap();
        assert_eq!(n, 2);
        assert_eq!(l.dev_matrix, vec![4, 2]);
        assert_eq!(l.tensor_map, vec![0, -1]);
        let err = shard_layout(&w, 2048, "w", &cfg(Some(3))).unwrap_err();
        assert!(
            err.to_string().contains("optimizer_weight_shard_size 3"),
            "{err}"
        );
    }

    #[test]
    fn a_model_parallel_weight_splits_another_dimension_over_its_replicas() {
        // [2, 2] devices: axis 1 splits dim 1, axis 0 replicates.
        let w = layout(&[2, 2], &[-1, 1], &[6, 16]);
        let (l, dim, n) = shard_layout(&w, 2048, "w", &cfg(None)).unwrap().unwrap();
        assert_eq!((dim, n), (0, 2));
        assert_eq!(l.slice_shape(), vec![3, 8]);
        // Under the threshold nothing changes.
        let big = ParallelOptimizer {
            threshold_kb: 64,
            ..cfg(None)
        };
        assert!(shard_layout(&w, 2048, "w", &big).unwrap().is_none());
    }
}

#[cfg(test)]
mod apply_tests {
    use super::super::{strategy, DatasetLayout, Mode, SearchOptions};
    use super::*;
    use crate::autodiff::{training_graph, Optimizer};

    const NET: &str = "\
%para1_x : <Tensor[Float32], (16, 32)>
%para2_label : <Tensor[Float32], (16, 16)>
%para3_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: normal(sigma=0.01, seed=1)

subgraph @Net(%para1_x, %para2_label, %para3_w) {
  %1(out) = MatMul(%para1_x, %para3_w) {instance name: matmul} primitive_attrs: {transpose_a: false, transpose_b: false}
  %2(diff) = Sub(%1, %para2_label) {instance name: sub}
  %3(sq) = Square(%2) {instance name: square}
  %4(loss) = ReduceMean(%3, (0, 1)) {instance name: reduce_mean} primitive_attrs: {keep_dims: false}
  Return(%4)
}
";

    #[test]
    fn a_data_parallel_weight_and_its_moment_are_split_and_their_update_follows() {
        let mut g = shardc_ir::text::parse_graph(NET, "net.ir").unwrap();
        crate::infer::infer_graph(&mut g).unwrap();
        let opt = Optimizer::Momentum {
            learning_rate: 0.1,
            momentum: 0.9,
            use_nesterov: false,
        };
        let g = training_graph(&g, &opt).unwrap();
        let opts = ParallelOptions {
            mode: Mode::DataParallel,
            device_num: 4,
            dataset: DatasetLayout::DataParallel,
            gradients_mean: true,
            enable_alltoall: false,
            search: SearchOptions::default(),
            parallel_optimizer: Some(ParallelOptimizer {
                threshold_kb: 0,
                weight_shard_size: None,
                gradient_accumulation_shard: true,
            }),
        };
        let a = strategy::assign(&g, &opts).unwrap();
        assert_eq!(a.optimizer_shards.len(), 1, "{:?}", a.param_layouts);
        let w = g.param_by_name("w").unwrap().index();
        let m = g.param_by_name("moments.w").unwrap().index();
        assert_eq!(a.param_layouts[w].slice_shape(), vec![8, 16]);
        assert_eq!(a.param_layouts[m], a.param_layouts[w]);
    }
}
