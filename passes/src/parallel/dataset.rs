//! The layouts of the data inputs under the dataset strategy (MindSpore's
//! `dataset_strategy`): what every strategy assignment starts from.

use super::{DatasetLayout, ParallelError, ParallelOptions};
use shardc_ir::{Graph, ParamKind, ReduceOp, TensorLayout};

/// Per parameter of `g`: the layout of a data input under the dataset strategy of `opts`,
/// `None` for a weight.
pub(crate) fn data_input_layouts(
    g: &Graph,
    opts: &ParallelOptions,
) -> Result<Vec<Option<TensorLayout>>, ParallelError> {
    let mut inputs = vec![None; g.params.len()];
    let mut k = 0;
    for (i, p) in g.params.iter().enumerate() {
        if matches!(p.kind, ParamKind::Input) {
            inputs[i] = Some(dataset_layout(&p.name, &p.ty.shape, k, opts)?);
            k += 1;
        }
    }
    Ok(inputs)
}

/// The layout of data input `shape` under the dataset strategy.
fn dataset_layout(
    name: &str,
    shape: &[usize],
    k: usize,
    opts: &ParallelOptions,
) -> Result<TensorLayout, ParallelError> {
    let n = opts.device_num;
    let splits: Vec<usize> = match &opts.dataset {
        DatasetLayout::FullBatch => vec![1; shape.len()],
        DatasetLayout::DataParallel => {
            let mut v = vec![1; shape.len()];
            if let Some(first) = v.first_mut() {
                if shape[0] % n != 0 {
                    return Err(ParallelError::Dataset {
                        input: name.to_string(),
                        reason: format!(
                            "dataset_strategy data_parallel splits dimension 0 of size {} over \
                             {n} devices, which does not divide it (use full_batch or a batch \
                             size divisible by {n})",
                            shape[0]
                        ),
                    });
                }
                *first = n;
            }
            v
        }
        DatasetLayout::Explicit(s) => {
            let row = s.0.get(k).ok_or_else(|| ParallelError::Dataset {
                input: name.to_string(),
                reason: format!(
                    "the dataset strategy {s} has no entry for data input {k} (one tuple per \
                     data input)"
                ),
            })?;
            if row.len() != shape.len() || row.iter().any(|&x| x < 1) {
                return Err(ParallelError::Dataset {
                    input: name.to_string(),
                    reason: format!(
                        "its strategy {row:?} does not fit its shape {shape:?} (one split >= 1 \
                         per dimension)"
                    ),
                });
            }
            row.iter().map(|&x| x as usize).collect()
        }
    };
    let used = splits
        .iter()
        .try_fold(1usize, |acc, &s| acc.checked_mul(s))
        .unwrap_or(0);
    if used == 0 || used > n || n % used != 0 {
        return Err(ParallelError::Dataset {
            input: name.to_string(),
            reason: format!("its splits {splits:?} use {used} devices, which does not divide {n}"),
        });
    }
    for (d, (&s, &size)) in splits.iter().zip(shape).enumerate() {
        if size % s != 0 {
            return Err(ParallelError::Dataset {
                input: name.to_string(),
                reason: format!("dimension {d} of size {size} is not divisible by {s}"),
            });
        }
    }
    let r = shape.len();
    let mut dev = Vec::new();
    if n / used > 1 || r == 0 {
        dev.push(n / used);
    }
    dev.extend(&splits);
    Ok(TensorLayout {
        dev_matrix: dev,
        tensor_map: (0..r).map(|d| (r - 1 - d) as i64).collect(),
        tensor_shape: shape.to_vec(),
        partial: Vec::new(),
        partial_op: ReduceOp::Sum,
    })
}
