//! MLIR itself, through melior (feature `mlir`): verify exported text, run MLIR's
//! `sharding-propagation` + `shard-partition` + `canonicalize` on it, and read a module into
//! the evaluator's [`crate::eval::ir::Module`].
//!
//! Every call builds its own [`Context`] with every upstream dialect and extension
//! registered (`mlirRegisterAllDialects` appends the extensions, among them the sharding
//! interface models of `linalg`, `tensor` and `arith` that `shard-partition` needs) and
//! collects MLIR's diagnostics, which an error carries.

use crate::eval::ir::{Block, Func, Module as EvalModule, Op, Ty};
use melior::dialect::DialectRegistry;
use melior::ir::block::BlockLike;
use melior::ir::operation::OperationLike;
use melior::ir::{BlockRef, Module, RegionLike, ValueLike};
use melior::pass::{self, PassManager};
use melior::utility::register_all_dialects;
use melior::Context;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use thiserror::Error;

/// MLIR rejected something; its diagnostics say what.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{stage}: {}", if diagnostics.is_empty() { "no diagnostic".to_string() } else { diagnostics.join("; ") })]
pub struct MlirError {
    /// What failed: `parse`, `verify`, `shard-partition`, `read`.
    pub stage: String,
    /// MLIR's diagnostics (location: message), in order.
    pub diagnostics: Vec<String>,
}

/// A context with every dialect and extension, and the sink its diagnostics go to.
fn context() -> (Context, Arc<Mutex<Vec<String>>>) {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let context = Context::new();
    context.append_dialect_registry(&registry);
    context.load_all_available_dialects();
    let sink = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&sink);
    context.attach_diagnostic_handler(move |d| {
        if let Ok(mut v) = s.lock() {
            v.push(format!("{}: {d}", d.location()));
        }
        true
    });
    (context, sink)
}

/// The diagnostics so far.
fn take(sink: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
    sink.lock()
        .map(|mut v| std::mem::take(&mut *v))
        .unwrap_or_default()
}

fn fail(stage: &str, sink: &Arc<Mutex<Vec<String>>>) -> MlirError {
    MlirError {
        stage: stage.to_string(),
        diagnostics: take(sink),
    }
}

/// Parses `text` and verifies it.
fn parse<'c>(
    context: &'c Context,
    sink: &Arc<Mutex<Vec<String>>>,
    text: &str,
) -> Result<Module<'c>, MlirError> {
    let module = Module::parse(context, text).ok_or_else(|| fail("parse", sink))?;
    if !module.as_operation().verify() {
        return Err(fail("verify", sink));
    }
    Ok(module)
}

/// Parses and verifies `text` with MLIR's verifier.
pub fn verify(text: &str) -> Result<(), MlirError> {
    let (context, sink) = context();
    parse(&context, &sink, text).map(|_| ())
}

/// Runs `sharding-propagation`, `shard-partition` and `canonicalize` on every function of
/// `text` through melior's `PassManager`; returns the partitioned module's text.
pub fn partition(text: &str) -> Result<String, MlirError> {
    let (context, sink) = context();
    let mut module = parse(&context, &sink, text)?;
    run_partition(&context, &sink, &mut module)?;
    Ok(module.as_operation().to_string())
}

fn run_partition(
    context: &Context,
    sink: &Arc<Mutex<Vec<String>>>,
    module: &mut Module<'_>,
) -> Result<(), MlirError> {
    let pm = PassManager::new(context);
    let f = pm.nested_under("func.func");
    f.add_pass(pass::shard::create_sharding_propagation());
    f.add_pass(pass::shard::create_partition());
    f.add_pass(pass::transform::create_canonicalizer());
    pm.run(module).map_err(|_| fail("shard-partition", sink))?;
    if !module.as_operation().verify() {
        return Err(fail("verify after shard-partition", sink));
    }
    Ok(())
}

/// Parses, verifies and reads `text` for the evaluator.
pub fn read(text: &str) -> Result<EvalModule, MlirError> {
    let (context, sink) = context();
    let module = parse(&context, &sink, text)?;
    read_module(&module).map_err(|reason| MlirError {
        stage: "read".into(),
        diagnostics: vec![reason],
    })
}

/// Numbers values by their identity in MLIR.
struct Ids(HashMap<usize, usize>);

impl Ids {
    fn of<'c>(&mut self, v: &impl ValueLike<'c>) -> usize {
        let key = v.to_raw().ptr as usize;
        let n = self.0.len();
        *self.0.entry(key).or_insert(n)
    }
}

fn read_block(b: &BlockRef<'_, '_>, ids: &mut Ids) -> Result<Block, String> {
    let mut args = Vec::with_capacity(b.argument_count());
    for i in 0..b.argument_count() {
        let a = b.argument(i).map_err(|e| e.to_string())?;
        args.push((ids.of(&a), Ty::parse(&a.r#type().to_string())));
    }
    let mut ops = Vec::new();
    let mut cur = b.first_operation();
    while let Some(op) = cur {
        ops.push(read_op(&op, ids)?);
        cur = op.next_in_block();
    }
    Ok(Block { args, ops })
}

fn read_op<'c: 'a, 'a>(op: &impl OperationLike<'c, 'a>, ids: &mut Ids) -> Result<Op, String> {
    let name = op
        .name()
        .as_string_ref()
        .as_str()
        .map_err(|e| e.to_string())?
        .to_string();
    let operands = op.operands().map(|v| ids.of(&v)).collect();
    let results = op
        .results()
        .map(|r| (ids.of(&r), Ty::parse(&r.r#type().to_string())))
        .collect();
    let mut attrs = std::collections::BTreeMap::new();
    for (k, v) in op.attributes() {
        let k = k
            .as_string_ref()
            .as_str()
            .map_err(|e| e.to_string())?
            .to_string();
        attrs.insert(k, v.to_string());
    }
    let mut regions = Vec::new();
    for r in op.regions() {
        match r.first_block() {
            Some(b) => {
                if b.next_in_region().is_some() {
                    return Err(format!("{name}: a region of several blocks"));
                }
                regions.push(read_block(&b, ids)?);
            }
            None => regions.push(Block::default()),
        }
    }
    Ok(Op {
        name,
        operands,
        results,
        attrs,
        regions,
    })
}

/// The evaluator's module of a parsed MLIR module: the grid `@grid0` and every function
/// with a body.
fn read_module(module: &Module<'_>) -> Result<EvalModule, String> {
    let mut ids = Ids(HashMap::new());
    let body = read_block(&module.body(), &mut ids)?;
    let mut out = EvalModule::default();
    for op in body.ops {
        match op.name.as_str() {
            "shard.grid" => {
                let shape = op
                    .attrs
                    .get("shape")
                    .and_then(|s| crate::eval::attr::ints(s))
                    .ok_or("shard.grid without a readable shape")?;
                if !out.grid.is_empty() {
                    return Err("more than one shard.grid".into());
                }
                out.grid = shape
                    .iter()
                    .map(|&s| usize::try_from(s).map_err(|_| "a dynamic grid".to_string()))
                    .collect::<Result<_, _>>()?;
            }
            "func.func" => {
                let name = op
                    .attrs
                    .get("sym_name")
                    .map(|s| s.trim_matches('"').to_string())
                    .ok_or("func.func without sym_name")?;
                if let Some(body) = op.regions.into_iter().next() {
                    if !body.ops.is_empty() {
                        out.funcs.push(Func { name, body });
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}
