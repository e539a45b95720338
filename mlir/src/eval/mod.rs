//! A small evaluator of MLIR's partitioned per-rank programs: every rank at once, the shard
//! collectives simulated across them, on `f64` host arrays rounded to each value's element
//! type after every op (so `f32` programs compute in `f32` precision).
//!
//! It runs what `shard-partition` (then `canonicalize`) emits for the ops shardc exports:
//! `func.return`, `arith` (constants, arithmetic, comparisons, `select`, casts), `math`,
//! `affine.apply`, `scf.if`, `tensor.empty` / `extract_slice` / `insert_slice` /
//! `expand_shape` / `collapse_shape` / `reshape` / `cast` / `concat`, `linalg.fill` and
//! `linalg.generic` (any indexing maps, any scalar body), `shard.process_multi_index` /
//! `process_linear_index` / `grid_shape`, and the collectives `all_reduce`, `all_gather`,
//! `all_slice`, `reduce_scatter`, `all_to_all`, `broadcast`. Anything else is an error naming
//! the op.
//!
//! Why it walks MLIR's own parse (the `mlir` module builds the [`ir::Module`] it runs from
//! melior's operations, attributes printed by MLIR) rather than parsing MLIR text itself:
//! the structure (which value is which, regions, result types) then comes from MLIR's parser
//! and verifier, and only attribute values are read from their printed form; a hand-written
//! parser of MLIR's printed syntax would be a second, weaker reading of what the oracle
//! checks. The evaluator itself is pure Rust over [`ir`], and testable without MLIR.

pub mod affine;
pub mod array;
pub mod attr;
pub mod collective;
pub mod exec;
pub mod ir;

use crate::error::EvalError;
use array::Arr;
use exec::{Env, RankInfo, Val};
use ir::{Module, Ty};

/// One collective as it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Collective {
    /// The shard op (`shard.all_reduce`).
    pub op: String,
    /// Its grid axes.
    pub grid_axes: String,
    /// The bytes it moved over all ranks ([`collective::bytes`]).
    pub bytes: f64,
}

/// What a run of every rank gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Per rank, the function's results.
    pub outputs: Vec<Vec<Arr>>,
    /// The collectives, in program order.
    pub collectives: Vec<Collective>,
}

/// Runs function `func` of `module` on every rank of its grid; `inputs[r]` are rank `r`'s
/// arguments.
pub fn run(module: &Module, func: &str, inputs: &[Vec<Arr>]) -> Result<Run, EvalError> {
    let f = module
        .funcs
        .iter()
        .find(|f| f.name == func)
        .ok_or_else(|| EvalError::Program(format!("no function @{func}")))?;
    let grid: Vec<usize> = if module.grid.is_empty() {
        vec![1]
    } else {
        module.grid.clone()
    };
    let n: usize = grid.iter().product();
    if inputs.len() != n {
        return Err(EvalError::Program(format!(
            "{} ranks of inputs for a grid of {n} devices",
            inputs.len()
        )));
    }
    let mut envs: Vec<Env> = vec![Env::new(); n];
    for (r, (env, ins)) in envs.iter_mut().zip(inputs).enumerate() {
        if ins.len() != f.body.args.len() {
            return Err(EvalError::Program(format!(
                "rank {r}: {} inputs for @{func}'s {} arguments",
                ins.len(),
                f.body.args.len()
            )));
        }
        for ((id, ty), a) in f.body.args.iter().zip(ins) {
            if let Ty::Tensor(s, _) = ty {
                if *s != a.shape {
                    return Err(EvalError::Program(format!(
                        "rank {r}: argument %v{id} of type {ty:?} given shape {:?}",
                        a.shape
                    )));
                }
            }
            env.insert(*id, Val::T(a.clone()));
        }
    }
    let mut collectives = Vec::new();
    let op_err = |rank: usize, op: &ir::Op, reason: String| EvalError::Op {
        rank,
        op: op.name.clone(),
        value: op.value(),
        reason,
    };
    for op in &f.body.ops {
        if op.name == "func.return" {
            let mut outputs = Vec::with_capacity(n);
            for (r, env) in envs.iter().enumerate() {
                let mut outs = Vec::with_capacity(op.operands.len());
                for k in 0..op.operands.len() {
                    let t = exec::tensor(env, op, k).map_err(|e| op_err(r, op, e))?;
                    outs.push(t.clone());
                }
                outputs.push(outs);
            }
            return Ok(Run {
                outputs,
                collectives,
            });
        }
        if collective::is_collective(&op.name) {
            let (outs, bytes) = collective::run(op, &grid, &envs).map_err(|e| op_err(0, op, e))?;
            for (env, vals) in envs.iter_mut().zip(outs) {
                for ((id, _), v) in op.results.iter().zip(vals) {
                    env.insert(*id, v);
                }
            }
            collectives.push(Collective {
                op: op.name.clone(),
                grid_axes: op.attrs.get("grid_axes").cloned().unwrap_or_default(),
                bytes,
            });
            continue;
        }
        for (r, env) in envs.iter_mut().enumerate() {
            let at = RankInfo {
                rank: r,
                grid: &grid,
            };
            let vals = exec::eval(op, env, &at).map_err(|e| op_err(r, op, e))?;
            for ((id, _), v) in op.results.iter().zip(vals) {
                env.insert(*id, v);
            }
        }
    }
    Err(EvalError::Program(format!("@{func} has no func.return")))
}

#[cfg(test)]
mod tests {
    use super::ir::{Block, Elem, Func, Op, Ty};
    use super::*;
    use std::collections::BTreeMap;

    fn op(name: &str, operands: &[usize], results: &[(usize, Ty)], attrs: &[(&str, &str)]) -> Op {
        Op {
            name: name.into(),
            operands: operands.to_vec(),
            results: results.to_vec(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            regions: Vec::new(),
        }
    }

    #[test]
    fn collectives_run_across_ranks() {
        let t2 = Ty::Tensor(vec![2], Elem::F32);
        let t4 = Ty::Tensor(vec![4], Elem::F32);
        let m = Module {
            grid: vec![2, 2],
            funcs: vec![Func {
                name: "f".into(),
                body: Block {
                    args: vec![(0, t2.clone())],
                    ops: vec![
                        op(
                            "shard.all_reduce",
                            &[0],
                            &[(1, t2.clone())],
                            &[("grid_axes", "array<i16: 0>")],
                        ),
                        op(
                            "shard.all_gather",
                            &[1],
                            &[(2, t4.clone())],
                            &[("grid_axes", "array<i16: 1>"), ("gather_axis", "0 : index")],
                        ),
                        op("func.return", &[2], &[], &[]),
                    ],
                },
            }],
        };
        let inputs: Vec<Vec<Arr>> = (0..4)
            .map(|r| {
                vec![Arr {
                    shape: vec![2],
                    data: vec![r as f64, 10.0 * r as f64],
                    elem: Elem::F32,
                }]
            })
            .collect();
        let run = run(&m, "f", &inputs).unwrap();
        // Ranks 0 and 2 sum (axis 0): (2, 20); ranks 1 and 3: (4, 40); then gathered along axis 1.
        for r in 0..4 {
            assert_eq!(
                run.outputs[r][0].data,
                vec![2.0, 20.0, 4.0, 40.0],
                "rank {r}"
            );
        }
        assert_eq!(run.collectives.len(), 2);
        // all_reduce: 4 ranks x 2 x 1/2 x 8 bytes; all_gather: 4 ranks x 1/2 x 16 bytes.
        assert_eq!(run.collectives[0].bytes, 32.0);
        assert_eq!(run.collectives[1].bytes, 32.0);
        let e = super::run(&m, "g", &inputs).unwrap_err();
        assert!(e.to_string().contains("@g"), "{e}");
    }
}
