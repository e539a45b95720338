//! shardc graphs as MLIR text (no MLIR library needed).
//!
//! - [`logical_module`]: the logical graph as one `func.func` of `tensor` / `linalg` /
//!   `arith` / `math` ops (see `ops` for what each op becomes) and, given the plan, its
//!   sharding as `shard` annotations: a `shard.grid @grid0` refining every device matrix
//!   ([`Grid::for_layouts`]); every parameter annotated with its layout
//!   (`shard.shard %p to %s`); every operand of an op with a strategy annotated for its users
//!   with the layout the strategy wants (`annotate_for_users`); every result with the layout
//!   it is produced in; the returned values annotated replicated for the return (the logical
//!   function returns whole tensors). Where MLIR 22's `shard-partition` cannot reshard a
//!   value to its user's sharding in one step, the annotation for users is a chain of
//!   annotations it can ([`reshard`]). MLIR 22's `!shard.sharding` has no partial axes (they
//!   left with the `mesh` dialect), so a partial result is annotated with its split axes
//!   only — the sum it still owes is then completed where it is produced, as shardc's
//!   `forward_op` AllReduce does — and its partial axes are written in a comment.
//! - [`rank_module`]: one rank's graph (sliced shapes), with shardc's collectives as shard
//!   collectives on the grid (see `comm`).
//!
//! In both, a weight update (`Assign`) becomes an extra result of the function, after the
//! graph's outputs: the weight's new value. Ops with no equivalent are calls of private
//! external functions `@shardc.<OpName>` (suffixed `.1`, `.2`, ... for each further
//! signature) with the exact tensor types, their constant operands and instance name as
//! attributes, so that every graph exports and verifies.

mod comm;
pub mod emit;
mod ops;
pub mod reshard;

use crate::error::ExportError;
use crate::grid::{split_axes_text, Grid};
use comm::RankCx;
use emit::{tensor_ty, Emitter, Val};
use ops::Lowered;
use shardc_ir::{Const, Graph, Node, OpKind, Operand, TensorLayout};
use shardc_passes::parallel::assignment::Assignment;
use std::collections::BTreeMap;

/// The grid of a plan: the refinement of every layout's device matrix in it.
pub fn plan_grid(graph: &Graph, plan: &Assignment) -> Result<Grid, ExportError> {
    let mut layouts: Vec<&TensorLayout> = plan.param_layouts.iter().collect();
    for d in plan.decisions.iter().flatten() {
        layouts.extend(d.sharding.inputs.iter().flatten());
        layouts.extend(d.sharding.outputs.iter());
    }
    let n = layouts.first().map_or(1, |l| l.device_num());
    let _ = graph;
    Grid::for_layouts(n, layouts)
}

/// The logical graph as MLIR text; with `plan`, annotated with its sharding (module doc).
pub fn logical_module(graph: &Graph, plan: Option<&Assignment>) -> Result<String, ExportError> {
    let grid = match plan {
        Some(p) => Some(plan_grid(graph, p)?),
        None => None,
    };
    let ann = match (plan, &grid) {
        (Some(p), Some(g)) => Some((p, g)),
        _ => None,
    };
    Writer::new(graph, Mode::Logical(ann)).module(grid.as_ref())
}

/// Rank `rank`'s graph (a materialized rank graph of shardc's program) as MLIR text, its
/// collectives on `grid` (the plan's, [`plan_grid`], or [`Grid::for_devices`]).
pub fn rank_module(graph: &Graph, rank: usize, grid: &Grid) -> Result<String, ExportError> {
    if rank >= grid.device_num() {
        return Err(ExportError::Grid {
            reason: format!(
                "rank {rank} is outside the grid {} of {} devices",
                grid.text_shape(),
                grid.device_num()
            ),
        });
    }
    Writer::new(graph, Mode::Rank(RankCx { rank, grid })).module(Some(grid))
}

/// What is being written.
enum Mode<'a> {
    /// The logical graph, with its plan and grid when annotated.
    Logical(Option<(&'a Assignment, &'a Grid)>),
    /// A rank's graph.
    Rank(RankCx<'a>),
}

/// Writes one graph.
struct Writer<'a> {
    g: &'a Graph,
    mode: Mode<'a>,
    e: Emitter,
    shardings: BTreeMap<String, String>,
    /// The split axes of every value that is a `shard.shard` result, by name.
    split_of: BTreeMap<String, reshard::SplitAxes>,
}

/// The printed name of node `i`: `%3(out)`.
fn value_name(g: &Graph, i: usize) -> String {
    let name = g.nodes.get(i).map_or("", |n| n.name.as_str());
    format!("{}({name})", i + 1)
}

/// A constant as the IR prints it.
fn const_text(c: &Const) -> String {
    match c {
        Const::Int(i) => i.to_string(),
        Const::Float(f) => format!("{f:?}"),
        Const::Bool(b) => b.to_string(),
        Const::Ints(v) => {
            let p: Vec<String> = v.iter().map(|x| x.to_string()).collect();
            format!("({})", p.join(", "))
        }
    }
}

/// A string attribute literal.
fn str_attr(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A symbol name usable bare: letters, digits, `_`, `.`, `$`, `-` (others become `_`).
fn symbol(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.$-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !out.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        out.insert(0, '_');
    }
    out
}

impl<'a> Writer<'a> {
    fn new(g: &'a Graph, mode: Mode<'a>) -> Writer<'a> {
        Writer {
            g,
            mode,
            e: Emitter::default(),
            shardings: BTreeMap::new(),
            split_of: BTreeMap::new(),
        }
    }

    fn op_err(&self, i: usize, reason: String) -> ExportError {
        let n = &self.g.nodes[i];
        ExportError::Op {
            op: n.op.name().to_string(),
            instance: n.instance.clone(),
            value: value_name(self.g, i),
            reason,
        }
    }

    /// The `shard.sharding` of `layout` (one op per distinct sharding).
    fn sharding(&mut self, axes: &[Vec<usize>]) -> String {
        let text = split_axes_text(axes);
        if let Some(n) = self.shardings.get(&text) {
            return n.clone();
        }
        let name = format!("%sh{}", self.shardings.len());
        self.e.line(format!(
            "{name} = shard.sharding @grid0 split_axes = {text} : !shard.sharding"
        ));
        self.shardings.insert(text, name.clone());
        name
    }

    /// `v` annotated with `axes`: one `shard.shard` op.
    fn shard_op(&mut self, v: &Val, axes: &[Vec<usize>], for_users: bool) -> Val {
        let s = self.sharding(axes);
        let name = self.e.fresh();
        self.e.line(format!(
            "{name} = shard.shard {} to {s}{} : {}",
            v.name,
            if for_users { " annotate_for_users" } else { "" },
            tensor_ty(&v.ty)
        ));
        self.split_of.insert(name.clone(), axes.to_vec());
        Val {
            name,
            ty: v.ty.clone(),
        }
    }

    /// `v` annotated with `layout` (for its users when `for_users`); rank-0 values stay.
    /// When `v` is itself annotated and MLIR 22 cannot reshard its sharding to `layout`'s in
    /// one step, the annotation for users is a chain of steps it can (see `reshard`).
    fn annotate(
        &mut self,
        grid: &Grid,
        v: &Val,
        layout: &TensorLayout,
        for_users: bool,
    ) -> Result<Val, ExportError> {
        if v.ty.shape.is_empty() {
            return Ok(v.clone());
        }
        let axes = grid.split_axes(layout)?;
        if !for_users && layout.is_partial() {
            let axes = grid.partial_axes(layout)?;
            self.e.line(format!(
                "// {} is partial ({}) over grid axes {axes:?}",
                v.name, layout.partial_op
            ));
        }
        let mut cur = v.clone();
        if for_users {
            if let Some(src) = self.split_of.get(&v.name).cloned() {
                let steps = reshard::chain(&src, &axes, v.ty.shape.len(), grid.shape.len());
                for step in steps.unwrap_or_default() {
                    self.e.line(format!(
                        "// {} {} -> {}: one step of MLIR's resharding",
                        v.name,
                        split_axes_text(&src),
                        split_axes_text(&axes)
                    ));
                    cur = self.shard_op(&cur, &step, true);
                }
            }
        }
        Ok(self.shard_op(&cur, &axes, for_users))
    }

    /// The annotation context of the logical mode with a plan.
    fn plan(&self) -> Option<(&'a Assignment, &'a Grid)> {
        match self.mode {
            Mode::Logical(p) => p,
            Mode::Rank(_) => None,
        }
    }

    /// The call of the external function of `node`.
    fn external(
        &mut self,
        i: usize,
        node: &Node,
        ins: &[Option<Val>],
    ) -> Result<Vec<Val>, ExportError> {
        let args: Vec<&Val> = ins.iter().flatten().collect();
        let results = node.ty.tensors().to_vec();
        let arg_tys: Vec<String> = args.iter().map(|v| tensor_ty(&v.ty)).collect();
        let res_tys: Vec<String> = results.iter().map(tensor_ty).collect();
        let sig = format!("({}) -> ({})", arg_tys.join(", "), res_tys.join(", "));
        let base = format!("shardc.{}", node.op.name());
        let mut sym = base.clone();
        let mut k = 0;
        while let Some(s) = self.e.externs.get(&sym) {
            if *s == sig {
                break;
            }
            k += 1;
            sym = format!("{base}.{k}");
        }
        self.e.externs.insert(sym.clone(), sig.clone());
        let consts: Vec<String> = node
            .inputs
            .iter()
            .filter_map(Operand::as_const)
            .map(const_text)
            .collect();
        let mut attrs = vec![format!("shardc.instance = {}", str_attr(&node.instance))];
        if !consts.is_empty() {
            attrs.push(format!("shardc.consts = {}", str_attr(&consts.join(", "))));
        }
        let name = format!("%n{i}");
        let lhs = match results.len() {
            0 => String::new(),
            1 => format!("{name} = "),
            r => format!("{name}:{r} = "),
        };
        let names: Vec<&str> = args.iter().map(|v| v.name.as_str()).collect();
        self.e.line(format!(
            "{lhs}func.call @{sym}({}) {{{}}} : {sig}",
            names.join(", "),
            attrs.join(", ")
        ));
        if results.is_empty() && node.ty.as_tensor().is_none() && node.ty.tensors().is_empty() {
            return Ok(Vec::new());
        }
        Ok(results
            .into_iter()
            .enumerate()
            .map(|(k, ty)| Val {
                name: if node.ty.as_tensor().is_some() {
                    name.clone()
                } else {
                    format!("{name}#{k}")
                },
                ty,
            })
            .collect())
    }

    fn module(mut self, grid: Option<&Grid>) -> Result<String, ExportError> {
        let g = self.g;
        let plan = self.plan();
        let mut params = Vec::with_capacity(g.params.len());
        let mut sig = Vec::with_capacity(g.params.len());
        for (k, p) in g.params.iter().enumerate() {
            let v = Val {
                name: format!("%p{k}"),
                ty: p.ty.clone(),
            };
            sig.push(format!("{}: {}", v.name, tensor_ty(&v.ty)));
            self.e.line(format!(
                "// {} = %para{}_{} ({})",
                v.name,
                k + 1,
                p.name,
                if p.is_weight() { "weight" } else { "input" }
            ));
            let v = match plan {
                Some((a, grid)) => match a.param_layouts.get(k) {
                    Some(l) => self.annotate(grid, &v, l, false)?,
                    None => v,
                },
                None => v,
            };
            params.push(v);
        }
        let mut vals: Vec<Vec<Val>> = Vec::with_capacity(g.nodes.len());
        let mut assigned: Vec<Val> = Vec::new();
        for (i, node) in g.nodes.iter().enumerate() {
            self.e.line(format!(
                "// %{} = {} '{}'",
                value_name(g, i),
                node.op.name(),
                node.instance
            ));
            let mut ins: Vec<Option<Val>> = Vec::with_capacity(node.inputs.len());
            for (k, o) in node.inputs.iter().enumerate() {
                ins.push(match o {
                    Operand::Const(_) => None,
                    Operand::Param(p) => Some(params.get(p.index()).cloned().ok_or_else(|| {
                        self.op_err(i, format!("operand {k} names no parameter"))
                    })?),
                    Operand::Node(n) => {
                        let src = vals.get(n.index()).ok_or_else(|| {
                            self.op_err(i, format!("operand {k} is no earlier node"))
                        })?;
                        if node.op == OpKind::TupleGetItem {
                            None
                        } else if src.len() == 1 {
                            Some(src[0].clone())
                        } else {
                            return Err(self.op_err(
                                i,
                                format!(
                                    "operand {k} is %{}, a tuple of {} tensors, used whole",
                                    value_name(g, n.index()),
                                    src.len()
                                ),
                            ));
                        }
                    }
                });
            }
            let decision = plan.and_then(|(a, grid)| {
                a.decisions
                    .get(i)
                    .and_then(|d| d.as_ref())
                    .map(|d| (d, grid))
            });
            if let Some((d, grid)) = decision {
                for (k, v) in ins.iter_mut().enumerate() {
                    if let (Some(val), Some(Some(l))) = (v.as_ref(), d.sharding.inputs.get(k)) {
                        *v = Some(self.annotate(grid, val, l, true)?);
                    }
                }
            }
            let results = match node.op {
                OpKind::TupleGetItem => {
                    let (Some(Operand::Node(t)), Some(idx)) = (
                        node.inputs.first(),
                        node.inputs
                            .get(1)
                            .and_then(Operand::as_const)
                            .and_then(Const::as_int),
                    ) else {
                        return Err(self.op_err(i, "expects (node, Int index)".into()));
                    };
                    let src = vals
                        .get(t.index())
                        .ok_or_else(|| self.op_err(i, "the tuple is no earlier node".into()))?;
                    let v = usize::try_from(idx)
                        .ok()
                        .and_then(|x| src.get(x))
                        .ok_or_else(|| {
                            self.op_err(i, format!("index {idx} of a {}-tuple", src.len()))
                        })?;
                    vec![v.clone()]
                }
                OpKind::Assign => {
                    let v = ins
                        .get(1)
                        .and_then(|v| v.clone())
                        .ok_or_else(|| self.op_err(i, "the value is not a tensor".into()))?;
                    assigned.push(v.clone());
                    vec![v]
                }
                _ => {
                    let lowered = match &self.mode {
                        Mode::Rank(cx) => comm::lower(&mut self.e, node, &ins, cx)
                            .map_err(|r| self.op_err(i, r))?,
                        Mode::Logical(_) => None,
                    };
                    match lowered {
                        Some(v) => v,
                        None if node.op.is_communication() => self.external(i, node, &ins)?,
                        None => match ops::lower(&mut self.e, g, node, &ins)
                            .map_err(|r| self.op_err(i, r))?
                        {
                            Lowered::Values(v) => v,
                            Lowered::External => self.external(i, node, &ins)?,
                        },
                    }
                }
            };
            let results = match decision {
                Some((d, grid)) if node.op != OpKind::TupleGetItem && node.op != OpKind::Assign => {
                    let mut out = Vec::with_capacity(results.len());
                    for (k, v) in results.iter().enumerate() {
                        out.push(match d.sharding.outputs.get(k) {
                            Some(l) => self.annotate(grid, v, l, false)?,
                            None => v.clone(),
                        });
                    }
                    out
                }
                _ => results,
            };
            vals.push(results);
        }
        let mut rets: Vec<Val> = Vec::with_capacity(g.outputs.len() + assigned.len());
        for (k, o) in g.outputs.iter().enumerate() {
            let v = match o {
                Operand::Param(p) => params.get(p.index()).cloned(),
                Operand::Node(n) => vals.get(n.index()).and_then(|v| {
                    if v.len() == 1 {
                        v.first().cloned()
                    } else {
                        None
                    }
                }),
                Operand::Const(_) => None,
            };
            rets.push(v.ok_or_else(|| ExportError::Param {
                name: format!("output {k}"),
                reason: "not a single tensor (a constant or a whole tuple)".into(),
            })?);
        }
        rets.extend(assigned);
        if let Some((_, grid)) = plan {
            for r in rets.iter_mut() {
                let whole = TensorLayout::replicated(&r.ty.shape, grid.device_num());
                *r = self.annotate(grid, r, &whole, true)?;
            }
        }
        let ret_tys: Vec<String> = rets.iter().map(|v| tensor_ty(&v.ty)).collect();
        let ret_names: Vec<&str> = rets.iter().map(|v| v.name.as_str()).collect();
        if rets.is_empty() {
            self.e.line("return".into());
        } else {
            self.e.line(format!(
                "return {} : {}",
                ret_names.join(", "),
                ret_tys.join(", ")
            ));
        }
        let mut out = String::from("module {\n");
        if let Some(grid) = grid {
            out.push_str(&format!(
                "  shard.grid @grid0(shape = {})\n",
                grid.text_shape()
            ));
        }
        for (sym, sig) in &self.e.externs {
            let (args, res) = sig.split_once(" -> ").unwrap_or((sig.as_str(), "()"));
            out.push_str(&format!("  func.func private @{sym}{args} -> {res}\n"));
        }
        out.push_str(&format!(
            "  func.func @{}({}) -> ({}) {{\n",
            symbol(&g.name),
            sig.join(", "),
            ret_tys.join(", ")
        ));
        for l in &self.e.lines {
            out.push_str(l);
            out.push('\n');
        }
        out.push_str("  }\n}\n");
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::text::parse_graph;

    fn graph(body: &str, params: &str) -> Graph {
        let src = format!("{params}\nsubgraph @Net({}) {{\n{body}\n}}\n", {
            let names: Vec<String> = params
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect();
            names.join(", ")
        });
        let mut g = parse_graph(&src, "t.ir").unwrap();
        shardc_passes::infer::infer_graph(&mut g).unwrap();
        g
    }

    #[test]
    fn ops_lower_to_generics_and_externals() {
        let g = graph(
            "  %1(out) = MatMul(%para1_x, %para2_w) {instance name: mm} primitive_attrs: {transpose_b: true}\n  %2(out) = Add(%1, %para3_b) {instance name: add}\n  %3(out) = ReduceMean(%2, (1)) {instance name: rm} primitive_attrs: {keep_dims: true}\n  %4(out) = Softmax(%3) {instance name: sm}\n  Return(%4)",
            "%para1_x : <Tensor[Float32], (4, 8)>\n%para2_w : <Tensor[Float32], (6, 8)>\n%para3_b : <Tensor[Float32], (1, 6)>",
        );
        let text = logical_module(&g, None).unwrap();
        assert!(
            text.contains("affine_map<(d0, d1, d2) -> (d1, d2)>"),
            "{text}"
        );
        assert!(
            text.contains("\"parallel\", \"parallel\", \"reduction\""),
            "{text}"
        );
        // The (1, 6) bias broadcasts: its size-1 dim is dropped first.
        assert!(
            text.contains(
                "tensor.extract_slice %p2[0, 0] [1, 6] [1, 1] : tensor<1x6xf32> to tensor<6xf32>"
            ),
            "{text}"
        );
        assert!(text.contains("tensor.expand_shape"), "{text}");
        assert!(
            text.contains(
                "func.func private @shardc.Softmax(tensor<4x1xf32>) -> (tensor<4x1xf32>)"
            ),
            "{text}"
        );
        assert!(text.contains("func.call @shardc.Softmax"), "{text}");
        assert!(!text.contains("shard."), "{text}");
    }

    #[test]
    fn a_tuple_used_whole_is_an_error_naming_the_op() {
        let mut g = graph(
            "  %1(out) = Split(%para1_x) {instance name: split} primitive_attrs: {axis: 0, output_num: 2}\n  %2(y) = TupleGetItem(%1, 0) {instance name: get}\n  Return(%2)",
            "%para1_x : <Tensor[Float32], (4, 8)>",
        );
        assert!(logical_module(&g, None)
            .unwrap()
            .contains("tensor.extract_slice"));
        g.nodes[1].op = OpKind::Neg;
        g.nodes[1].inputs.truncate(1);
        let e = logical_module(&g, None).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("Neg") && s.contains("get") && s.contains("tuple"),
            "{s}"
        );
    }

    #[test]
    fn collectives_need_their_group_on_the_grid() {
        let mut g = graph(
            "  %1(out) = AllReduce(%para1_x) {instance name: ar} primitive_attrs: {op: sum, rank_list: (0, 1, 2, 3)}\n  Return(%1)",
            "%para1_x : <Tensor[Float32], (4, 8)>",
        );
        let grid = Grid::for_devices(8);
        let text = rank_module(&g, 2, &grid).unwrap();
        assert!(
            text.contains("shard.all_reduce %p0 on @grid0 grid_axes = [1, 2] reduction = sum"),
            "{text}"
        );
        g.nodes[0]
            .attrs
            .set("rank_list", shardc_ir::Attr::ints(&[0, 3]));
        let e = rank_module(&g, 0, &grid).unwrap_err().to_string();
        assert!(
            e.contains("AllReduce") && e.contains("ar") && e.contains("[0, 3]"),
            "{e}"
        );
    }
}
