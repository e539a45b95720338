//! Gradient accumulation reduced once: the micro-batches' gradient terms of a weight, each
//! reduced by the partition on its way into the accumulation's `Add` (a `mirror_grad_*`
//! AllReduce over the weight's replicas, or with the parallel optimizer a ReduceScatter into
//! the rank's shard, each possibly scaled by `gradients_mean = false`'s constant), are summed
//! first and reduced once:
//!
//! ```text
//! Add(R(a), R(b))  →  R(Add(a, b))      R = a sum collective, or Mul(a sum collective, c)
//! ```
//!
//! for two reductions with the same collective (op, attributes, group on every rank, type)
//! and the same scale, each read only by that `Add`: the sum of the reductions is the
//! reduction of the sum. A chain of accumulations `Add(Add(R(g0), R(g1)), R(g2))` becomes one
//! reduction of the summed terms, one collective per weight and step instead of one per
//! micro-batch.
//!
//! With `keep_scattered` (the parallel optimizer's `gradient_accumulation_shard = true`,
//! MindSpore's default) ReduceScatters are left per micro-batch: each micro-batch's term is
//! reduce-scattered and only the rank's shard is accumulated, so the rank never holds the
//! whole accumulated gradient; AllReduces are still folded (they hold the whole value either
//! way).

use super::MICRO_ATTR;
use shardc_ir::spmd::Patch;
use shardc_ir::{Attr, Graph, Node, NodeId, OpKind, Operand};
use std::collections::{HashMap, HashSet};

/// A reduction of one value: a sum collective, optionally scaled by a constant after it.
#[derive(Clone, Copy, Debug)]
struct Reduction {
    collective: usize,
    scale: Option<usize>,
}

impl Reduction {
    fn nodes(self) -> impl Iterator<Item = usize> {
        std::iter::once(self.collective).chain(self.scale)
    }
}

/// One rewrite: `Add` node `add` over reductions `a` and `b`.
struct Fold {
    add: usize,
    a: Reduction,
    b: Reduction,
}

/// Whether node `i` is a sum-reduction collective of one operand (`AllReduce` or
/// `ReduceScatter` with `op: sum`).
fn summed_collective(t: &Graph, i: usize) -> bool {
    let n = &t.nodes[i];
    matches!(n.op, OpKind::AllReduce | OpKind::ReduceScatter)
        && n.attrs.get("op").and_then(Attr::as_str).unwrap_or("sum") == "sum"
        && n.inputs.len() == 1
}

/// Folds every accumulation of reduced terms in `t` (see the module documentation); the
/// patches follow the nodes.
pub fn reduce_once(
    mut t: Graph,
    mut patches: Vec<Patch>,
    keep_scattered: bool,
) -> (Graph, Vec<Patch>) {
    loop {
        let folds = find_folds(&t, &patches, keep_scattered);
        if folds.is_empty() {
            return (t, patches);
        }
        (t, patches) = apply(t, patches, &folds);
    }
}

/// The folds that can be made at once: each `Add` whose operands are two matching
/// reductions, none sharing a node with another fold.
fn find_folds(t: &Graph, patches: &[Patch], keep_scattered: bool) -> Vec<Fold> {
    let mut groups: HashMap<usize, (&[usize], &[usize])> = HashMap::new();
    let mut variant_nodes: HashSet<usize> = HashSet::new();
    for p in patches {
        match p {
            Patch::Group { node, primes, axes } => {
                groups.insert(*node as usize, (primes, axes));
            }
            Patch::Variants { nodes, .. } => {
                variant_nodes.extend(nodes.iter().map(|&n| n as usize))
            }
            _ => {}
        }
    }
    let users = t.users();
    let outputs: HashSet<usize> = t
        .outputs
        .iter()
        .filter_map(|o| match o {
            Operand::Node(x) => Some(x.index()),
            _ => None,
        })
        .collect();
    let only_reader = |x: usize, i: usize| {
        users[x].len() == 1 && users[x][0].index() == i && !outputs.contains(&x)
    };
    // The reduction whose result is node `x`, if it is one.
    let reduction = |x: usize| -> Option<Reduction> {
        if summed_collective(t, x) {
            return Some(Reduction {
                collective: x,
                scale: None,
            });
        }
        let n = &t.nodes[x];
        match (n.op, n.inputs.as_slice()) {
            (OpKind::Mul, [Operand::Node(c), Operand::Const(_)])
                if summed_collective(t, c.index()) && only_reader(c.index(), x) =>
            {
                Some(Reduction {
                    collective: c.index(),
                    scale: Some(x),
                })
            }
            _ => None,
        }
    };
    // Attributes but the micro-batch (each term is of its own).
    let attrs_match = |x: &Node, y: &Node| {
        let strip = |n: &Node| {
            let mut a = n.attrs.clone();
            a.remove(MICRO_ATTR);
            a
        };
        strip(x) == strip(y)
    };
    let same = |a: Reduction, b: Reduction| {
        let (ca, cb) = (&t.nodes[a.collective], &t.nodes[b.collective]);
        let scales_match = match (a.scale, b.scale) {
            (None, None) => true,
            (Some(x), Some(y)) => {
                let (x, y) = (&t.nodes[x], &t.nodes[y]);
                x.inputs[1] == y.inputs[1] && attrs_match(x, y) && x.ty == y.ty
            }
            _ => false,
        };
        ca.op == cb.op
            && attrs_match(ca, cb)
            && ca.ty == cb.ty
            && groups.contains_key(&a.collective)
            && groups.get(&a.collective) == groups.get(&b.collective)
            && scales_match
    };
    let mut claimed: HashSet<usize> = HashSet::new();
    let mut folds = Vec::new();
    for (i, n) in t.nodes.iter().enumerate() {
        let (OpKind::Add, [Operand::Node(a), Operand::Node(b)]) = (n.op, n.inputs.as_slice())
        else {
            continue;
        };
        let (a, b) = (a.index(), b.index());
        if a == b || !only_reader(a, i) || !only_reader(b, i) {
            continue;
        }
        let (Some(ra), Some(rb)) = (reduction(a), reduction(b)) else {
            continue;
        };
        if !same(ra, rb) || (keep_scattered && t.nodes[ra.collective].op == OpKind::ReduceScatter) {
            continue;
        }
        // The nodes the fold rewrites or reads, kept apart from every other fold of this
        // round; none may be a per-rank variant.
        let raw = |r: Reduction| match t.nodes[r.collective].inputs[0] {
            Operand::Node(x) => Some(x.index()),
            _ => None,
        };
        let mut touched: Vec<usize> = vec![i];
        touched.extend(ra.nodes().chain(rb.nodes()));
        touched.extend(raw(ra).into_iter().chain(raw(rb)));
        touched.extend(users[i].iter().map(|u| u.index()));
        if touched
            .iter()
            .any(|x| claimed.contains(x) || variant_nodes.contains(x))
        {
            continue;
        }
        claimed.extend(touched);
        folds.push(Fold {
            add: i,
            a: ra,
            b: rb,
        });
    }
    folds
}

/// `t` with every fold made: each `Add` reads its reductions' raw operands and a copy of
/// `a`'s reduction (collective, then scale) follows it, read by the `Add`'s readers; the
/// reductions' nodes are removed (`a`'s patches move to the copy, `b`'s are dropped).
fn apply(mut t: Graph, mut patches: Vec<Patch>, folds: &[Fold]) -> (Graph, Vec<Patch>) {
    let n = t.nodes.len();
    let mut removed = vec![false; n];
    let mut dropped: HashSet<u32> = HashSet::new();
    let mut at_add: HashMap<usize, &Fold> = HashMap::new();
    for f in folds {
        for x in f.a.nodes().chain(f.b.nodes()) {
            removed[x] = true;
        }
        dropped.extend(f.b.nodes().map(|x| x as u32));
        at_add.insert(f.add, f);
    }
    let old = std::mem::take(&mut t.nodes);
    let raw_of = |r: Reduction| old[r.collective].inputs[0].clone();
    // New index of every kept old node; a's reduction nodes map to their copies.
    let mut table = vec![u32::MAX; n];
    // Per folded Add (old index): the new index of the node its readers now read.
    let mut redirect: HashMap<usize, u32> = HashMap::new();
    let mut order: Vec<Node> = Vec::with_capacity(n);
    for (k, node) in old.iter().enumerate() {
        if removed[k] {
            continue;
        }
        table[k] = order.len() as u32;
        let Some(f) = at_add.get(&k) else {
            order.push(node.clone());
            continue;
        };
        let mut add = node.clone();
        add.inputs = vec![raw_of(f.a), raw_of(f.b)];
        add.ty = match &raw_of(f.a) {
            Operand::Node(x) => old[x.index()].ty.clone(),
            _ => add.ty,
        };
        order.push(add);
        let mut prev = table[k];
        for (j, x) in f.a.nodes().enumerate() {
            let mut copy = old[x].clone();
            // Inputs are old indices until the remap below: the collective reads the Add,
            // the scale still the collective.
            if j == 0 {
                copy.inputs[0] = Operand::Node(NodeId(k as u32));
            }
            match node.attrs.get(MICRO_ATTR) {
                Some(m) => copy.attrs.set(MICRO_ATTR, m.clone()),
                None => {
                    copy.attrs.remove(MICRO_ATTR);
                }
            }
            if j == 0 {
                copy.comments.push(
                    "gradient accumulation: the micro-batches' terms are summed first and reduced once"
                        .into(),
                );
            }
            prev = order.len() as u32;
            table[x] = prev;
            order.push(copy);
        }
        redirect.insert(k, prev);
    }
    // Remap every operand: a folded Add's readers read its reduction; the copies read their
    // predecessor (the Add, or the collective).
    let copies: HashSet<u32> = folds
        .iter()
        .flat_map(|f| f.a.nodes().map(|x| x as u32))
        .map(|x| table[x as usize])
        .collect();
    for (idx, node) in order.iter_mut().enumerate() {
        let is_copy = copies.contains(&(idx as u32));
        for o in &mut node.inputs {
            if let Operand::Node(x) = o {
                let old_x = x.index();
                x.0 = if is_copy {
                    // A copy reads the Add (old index) or the collective's copy.
                    table[old_x]
                } else {
                    redirect.get(&old_x).copied().unwrap_or(table[old_x])
                };
            }
        }
    }
    for o in &mut t.outputs {
        if let Operand::Node(x) = o {
            x.0 = redirect
                .get(&x.index())
                .copied()
                .unwrap_or(table[x.index()]);
        }
    }
    t.nodes = order;
    patches.retain(|p| p.node().is_none_or(|x| !dropped.contains(&x)));
    for p in &mut patches {
        p.renumber(&table);
    }
    (t, patches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::{Const, DType, TensorType, Type};

    fn ty(shape: &[usize]) -> Type {
        Type::Tensor(TensorType::new(DType::Float32, shape.to_vec()))
    }

    fn node(op: OpKind, inputs: Vec<Operand>, shape: &[usize], name: &str) -> Node {
        let mut n = Node::new(op, inputs);
        n.ty = ty(shape);
        n.instance = name.into();
        n
    }

    fn collective(op: OpKind, x: u32, shape: &[usize], name: &str) -> Node {
        let mut n = node(op, vec![Operand::Node(NodeId(x))], shape, name);
        n.attrs = n.attrs.with("op", Attr::Str("sum".into()));
        if op == OpKind::ReduceScatter {
            n.attrs = n.attrs.with("axis", Attr::Int(0));
        }
        n
    }

    fn group(node: u32) -> Patch {
        Patch::Group {
            node,
            primes: vec![2],
            axes: vec![0],
        }
    }

    /// Three micro-batches' terms `g0..g2` (Neg of a parameter: any node), each reduced by
    /// `op` (and scaled when `scale`), accumulated left-deep, read by an update (`Sub`).
    fn accumulation(op: OpKind, scale: bool) -> (Graph, Vec<Patch>) {
        let mut g = Graph::new("acc");
        let w = g.add_param(shardc_ir::Param {
            name: "w".into(),
            ty: TensorType::new(DType::Float32, vec![4, 2]),
            kind: shardc_ir::ParamKind::Input,
        });
        let out = if op == OpKind::ReduceScatter {
            [2, 2]
        } else {
            [4, 2]
        };
        let mut patches = Vec::new();
        let mut terms = Vec::new();
        for m in 0..3 {
            let gm = g.push_node(node(
                OpKind::Neg,
                vec![Operand::Param(w)],
                &[4, 2],
                &format!("g{m}"),
            ));
            let c = g.push_node(collective(op, gm.0, &out, &format!("r{m}")));
            patches.push(group(c.0));
            let top = if scale {
                g.push_node(node(
                    OpKind::Mul,
                    vec![Operand::Node(c), Operand::Const(Const::Float(2.0))],
                    &out,
                    &format!("s{m}"),
                ))
            } else {
                c
            };
            terms.push(top);
        }
        let a01 = g.push_node(node(
            OpKind::Add,
            vec![Operand::Node(terms[0]), Operand::Node(terms[1])],
            &out,
            "acc01",
        ));
        let a012 = g.push_node(node(
            OpKind::Add,
            vec![Operand::Node(a01), Operand::Node(terms[2])],
            &out,
            "acc012",
        ));
        let upd = g.push_node(node(OpKind::Neg, vec![Operand::Node(a012)], &out, "update"));
        g.outputs.push(Operand::Node(upd));
        (g, patches)
    }

    fn count(g: &Graph, op: OpKind) -> usize {
        g.nodes.iter().filter(|n| n.op == op).count()
    }

    /// Node indices are valid and every operand comes before its reader.
    fn well_formed(g: &Graph) {
        for (i, n) in g.nodes.iter().enumerate() {
            for o in &n.inputs {
                if let Operand::Node(x) = o {
                    assert!(x.index() < i, "{} reads a later node", n.instance);
                }
            }
        }
    }

    #[test]
    fn a_chain_of_reduced_terms_is_summed_then_reduced_once() {
        for scale in [false, true] {
            let (g, p) = accumulation(OpKind::AllReduce, scale);
            let (g, p) = reduce_once(g, p, false);
            well_formed(&g);
            assert_eq!(count(&g, OpKind::AllReduce), 1, "scale {scale}");
            assert_eq!(count(&g, OpKind::Mul), usize::from(scale));
            assert_eq!(p.len(), 1);
            let r = p[0].node().unwrap() as usize;
            assert_eq!(g.nodes[r].op, OpKind::AllReduce);
            // The reduction reads the last Add, over whole terms.
            let Operand::Node(add) = g.nodes[r].inputs[0] else {
                panic!("reads a node")
            };
            assert_eq!(g.nodes[add.index()].op, OpKind::Add);
            assert_eq!(g.nodes[add.index()].ty, ty(&[4, 2]));
            // The update reads the (scaled) reduction.
            let upd = g.nodes.iter().position(|n| n.instance == "update").unwrap();
            let Operand::Node(x) = g.nodes[upd].inputs[0] else {
                panic!("reads a node")
            };
            let want = if scale {
                OpKind::Mul
            } else {
                OpKind::AllReduce
            };
            assert_eq!(g.nodes[x.index()].op, want);
        }
    }

    #[test]
    fn reduce_scatters_fold_unless_the_shards_are_accumulated() {
        let (g, p) = accumulation(OpKind::ReduceScatter, false);
        let (folded, _) = reduce_once(g.clone(), p.clone(), false);
        well_formed(&folded);
        assert_eq!(count(&folded, OpKind::ReduceScatter), 1);
        let (kept, kp) = reduce_once(g, p, true);
        assert_eq!(count(&kept, OpKind::ReduceScatter), 3);
        assert_eq!(kp.len(), 3);
    }

    #[test]
    fn different_groups_or_scales_do_not_fold() {
        let (g, mut p) = accumulation(OpKind::AllReduce, false);
        if let Patch::Group { axes, primes, .. } = &mut p[1] {
            *primes = vec![2, 2];
            *axes = vec![1];
        }
        let (g2, _) = reduce_once(g, p, false);
        // r0 and r1 differ; only nothing can fold (acc012 reads an Add).
        assert_eq!(count(&g2, OpKind::AllReduce), 3);
        let (mut g, p) = accumulation(OpKind::AllReduce, true);
        let s1 = g.nodes.iter().position(|n| n.instance == "s1").unwrap();
        g.nodes[s1].inputs[1] = Operand::Const(Const::Float(4.0));
        let (g3, _) = reduce_once(g, p, false);
        assert_eq!(count(&g3, OpKind::AllReduce), 3);
    }
}
