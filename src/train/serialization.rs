//! MindSpore's `load_checkpoint`, `load_param_into_net` and `save_checkpoint` for a
//! [`Model`]: MindSpore's `.ckpt` or safetensors files, by parameter name.
//!
//! A `Model` compiles its graph on its first batch ([`Model::build`]); its parameters exist
//! from then on, so parameters are loaded into a built model (on several ranks, each rank
//! takes its block of every whole tensor under the parameter's layout). As MindSpore's,
//! [`load_param_into_net`] returns the model's parameters the dictionary did not have and
//! the dictionary's entries the model has no parameter for; with `strict_load` a missing
//! trainable weight, and always a tensor of another shape or element type, is an error
//! naming it. Names are matched as they are, then through PyTorch's and MindSpore's
//! conventions where unambiguous ([`shardc_runtime::name_map`]: a file's `bn.weight` loads
//! a model's `bn.gamma`).

use super::model::Model;
use super::TrainError;
use shardc_runtime::mindspore_ckpt;
use shardc_runtime::name_map::NameMap;
use shardc_runtime::Tensor;
use std::collections::BTreeMap;
use std::path::Path;

/// MindSpore's `load_checkpoint`: the whole tensors of a `.ckpt` or `.safetensors` file, by
/// name.
pub fn load_checkpoint(path: &Path) -> Result<BTreeMap<String, Tensor>, TrainError> {
    Ok(mindspore_ckpt::read_weights(path)?.into_iter().collect())
}

/// MindSpore's `load_param_into_net(net, parameter_dict, strict_load)`: sets every parameter
/// of the built `model` that `params` holds (this rank's block of it); returns
/// `(param_not_load, ckpt_not_load)`: the model's parameters `params` lacks, and the names in
/// `params` the model has no parameter for. Errors: the model is not built yet; a tensor
/// whose shape or element type is not the parameter's (its global shape on several ranks);
/// with `strict_load`, any trainable weight missing.
pub fn load_param_into_net(
    model: &mut Model,
    params: &BTreeMap<String, Tensor>,
    strict_load: bool,
) -> Result<(Vec<String>, Vec<String>), TrainError> {
    let rank = model.rank().0;
    let layouts: BTreeMap<String, shardc_ir::TensorLayout> =
        model.param_layouts().iter().cloned().collect();
    let name = model.name().to_string();
    let exec = model.executor_mut().ok_or_else(|| {
        TrainError::Mismatch(format!(
            "load_param_into_net: Model({name}) is not built yet (it compiles on its first batch: call Model::build with one)"
        ))
    })?;
    let weights: Vec<(String, shardc_ir::TensorType, bool)> = exec
        .graph()
        .params
        .iter()
        .filter(|p| matches!(p.kind, shardc_ir::ParamKind::Weight { .. }))
        .map(|p| (p.name.clone(), p.ty.clone(), p.requires_grad()))
        .collect();
    // The frameworks' conventions (`bn.weight` for `bn.gamma`, ...), where unambiguous.
    let file: std::collections::BTreeSet<String> = params.keys().cloned().collect();
    let model_names: std::collections::BTreeSet<String> =
        weights.iter().map(|(n, _, _)| n.clone()).collect();
    let found = NameMap::default()
        .resolve(&file, &model_names)
        .map_err(|faults| {
            TrainError::Mismatch(format!("load_param_into_net: {}", faults.join("; ")))
        })?;
    let mut not_loaded = Vec::new();
    let mut faults = Vec::new();
    for (pname, ty, trainable) in &weights {
        let Some(pname_in_file) = found.get(pname) else {
            if strict_load && *trainable {
                faults.push(format!("{pname} is missing"));
            }
            not_loaded.push(pname.clone());
            continue;
        };
        let Some(whole) = params.get(pname_in_file) else {
            continue;
        };
        let global = layouts
            .get(pname)
            .map_or_else(|| ty.shape.clone(), |l| l.tensor_shape.clone());
        if whole.dtype() != ty.dtype || whole.shape != global {
            faults.push(format!(
                "{pname} is {} {:?} in the checkpoint but {} {global:?} in the model",
                whole.dtype().name(),
                whole.shape,
                ty.dtype.name()
            ));
            continue;
        }
        let value = match layouts.get(pname) {
            Some(l) => whole.block(&l.block(rank)).ok_or_else(|| {
                TrainError::Mismatch(format!("{pname}: rank {rank}'s block under {l}"))
            })?,
            None => whole.clone(),
        };
        exec.set_param(pname, value)?;
    }
    if !faults.is_empty() {
        return Err(TrainError::Mismatch(format!(
            "load_param_into_net: Model({name}): {}",
            faults.join("; ")
        )));
    }
    let known: std::collections::HashSet<&str> = found.values().map(String::as_str).collect();
    let ckpt_not_load = params
        .keys()
        .filter(|k| !known.contains(k.as_str()))
        .cloned()
        .collect();
    Ok((not_loaded, ckpt_not_load))
}

/// MindSpore's `save_checkpoint(net, path)`: the built `model`'s parameters (this rank's, as
/// it holds them: whole on one device) as MindSpore's `.ckpt` or as safetensors, by the
/// file's extension.
pub fn save_checkpoint(model: &Model, path: &Path) -> Result<(), TrainError> {
    let exec = model.executor().ok_or_else(|| {
        TrainError::Mismatch(format!(
            "save_checkpoint: Model({}) is not built yet",
            model.name()
        ))
    })?;
    let tensors = exec.weight_values()?;
    match path.extension().and_then(|e| e.to_str()) {
        Some("ckpt") => mindspore_ckpt::write(path, &tensors)?,
        _ => {
            let cp = shardc_runtime::checkpoint::Checkpoint::whole(model.name(), tensors);
            shardc_runtime::checkpoint::save(path, &cp)?;
        }
    }
    Ok(())
}
