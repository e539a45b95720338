//! Elementwise fusion: runs of consecutive elementwise nodes of one shape and float type become
//! one generated kernel, each element loaded once, every intermediate in a register, and only
//! the values read outside the run (or returned) stored.
//!
//! A run is a maximal sequence of consecutive nodes in program order whose op is a unary map
//! (`Neg` ... `Tanh`) or a binary one (`Add`, `Sub`, `Mul`, `RealDiv`, the activation
//! gradients, `DropoutGrad`), whose result is a Float32/Float64 tensor of the run's shape, and
//! whose operands are tensors of that type and shape, tensors that broadcast to it (numpy's
//! rules; `BiasAdd`'s bias along axis 1), or number constants. Runs of one node are left
//! alone. The kernel text uses the op templates of `kernels/elementwise.cu`
//! (so a fused op computes exactly what its own kernel computes) and is compiled once per
//! executor with [`crate::Device::load_kernels`].

use shardc_ir::{DType, Graph, OpKind, Operand, TensorType, Type};
use std::fmt::Write as _;

/// A run of fused nodes and its kernel.
#[derive(Clone, Debug)]
pub(crate) struct FusedRun {
    /// The nodes, in program order.
    pub nodes: Vec<usize>,
    /// The kernel's name: a placeholder until [`source`] names it after its code's hash.
    pub kernel: String,
    /// The operands read from memory, in kernel parameter order.
    pub inputs: Vec<Operand>,
    /// Per input: its element strides per dim of the run's shape when it is broadcast (a
    /// `Strided` kernel parameter after the outputs), None when it has the run's shape.
    pub strides: Vec<Option<Vec<i64>>>,
    /// The nodes whose values are stored, in kernel parameter order.
    pub outputs: Vec<usize>,
    /// Elements per tensor.
    pub elements: usize,
    /// Per node, in order: the op template it calls and where each operand comes from.
    pub steps: Vec<FusedStep>,
    /// `float` or `double`.
    pub c_type: &'static str,
}

/// One node of a run as the generated code computes it.
#[derive(Clone, Debug)]
pub(crate) struct FusedStep {
    /// The node.
    pub node: usize,
    /// The template of `kernels/elementwise.cu` it calls (`op_relu`, `bin_add`).
    pub template: String,
    /// Its operands.
    pub args: Vec<FusedRead>,
}

/// Where a fused operand comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FusedRead {
    /// The register of an earlier node of the run.
    Register(usize),
    /// Kernel input `j`, at the element (None strides) or at its broadcast offset.
    Input(usize),
    /// A constant.
    Const(f64),
}

fn unary_name(op: OpKind) -> Option<&'static str> {
    use OpKind::*;
    Some(match op {
        Neg => "neg",
        Square => "square",
        Sqrt => "sqrt",
        Exp => "exp",
        Log => "log",
        ReLU => "relu",
        Tanh => "tanh",
        GeLU => "gelu",
        Sigmoid => "sigmoid",
        SiLU => "silu",
        Erf => "erf",
        _ => return None,
    })
}

/// How operand `k` of a binary node of result type `ty` is read: None when it has `ty`'s shape,
/// else its strides per dim of `ty` (None of None: it cannot be read elementwise).
fn operand_strides(
    op: OpKind,
    k: usize,
    ty: &TensorType,
    x: &TensorType,
) -> Option<Option<Vec<i64>>> {
    if x.dtype != ty.dtype {
        return None;
    }
    if x.shape == ty.shape {
        return Some(None);
    }
    if op == OpKind::BiasAdd && k == 1 {
        if ty.shape.len() < 2 || x.shape != [ty.shape[1]] {
            return None;
        }
        let mut st = vec![0i64; ty.shape.len()];
        st[1] = 1;
        return Some(Some(st));
    }
    crate::kernels::broadcast_strides(&ty.shape, &x.shape).map(Some)
}

fn binary_name(op: OpKind) -> Option<&'static str> {
    use OpKind::*;
    Some(match op {
        Add => "add",
        Sub => "sub",
        Mul | DropoutGrad => "mul",
        BiasAdd => "add",
        RealDiv => "div",
        ReluGrad => "relu_grad",
        SigmoidGrad => "sigmoid_grad",
        TanhGrad => "tanh_grad",
        SqrtGrad => "sqrt_grad",
        GeLUGrad => "gelu_grad",
        SiLUGrad => "silu_grad",
        _ => return None,
    })
}

fn operand_type<'g>(g: &'g Graph, o: &Operand) -> Option<&'g TensorType> {
    match o {
        Operand::Param(p) => Some(&g.params[p.index()].ty),
        Operand::Node(n) => match &g.nodes[n.index()].ty {
            Type::Tensor(t) => Some(t),
            Type::Tuple(_) => None,
        },
        Operand::Const(_) => None,
    }
}

/// The shape and dtype node `i` runs elementwise over, when it can be fused.
pub(crate) fn fusable(g: &Graph, i: usize) -> Option<&TensorType> {
    let node = &g.nodes[i];
    let arity = if unary_name(node.op).is_some() {
        1
    } else if binary_name(node.op).is_some() {
        2
    } else {
        return None;
    };
    let Type::Tensor(ty) = &node.ty else {
        return None;
    };
    if !matches!(ty.dtype, DType::Float32 | DType::Float64) || ty.num_elements() == 0 {
        return None;
    }
    // GeLUGrad(dy, x, y) reads dy and x only.
    for (k, o) in node.inputs.iter().take(arity).enumerate() {
        match o {
            Operand::Const(c) => {
                if !c.as_f64().is_some_and(f64::is_finite) || arity == 1 {
                    return None;
                }
            }
            _ => {
                let x = operand_type(g, o)?;
                // A unary op, or a gradient op, reads operands of its own shape only.
                let broadcastable = arity == 2
                    && matches!(
                        node.op,
                        OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::RealDiv | OpKind::BiasAdd
                    );
                match operand_strides(node.op, k, ty, x)? {
                    Some(_) if !broadcastable => return None,
                    _ => {}
                }
            }
        }
    }
    if node.inputs.len() < arity {
        return None;
    }
    Some(ty)
}

/// The fused kernels of a graph with nothing excluded: (their source, their names), as an
/// executor would load them (for checking that NVRTC compiles them).
pub fn generated_kernels(g: &Graph) -> (String, Vec<String>) {
    let mut runs = plan(g, &vec![false; g.nodes.len()]);
    let text = source(&mut runs);
    (text, runs.into_iter().map(|r| r.kernel).collect())
}

/// Every run of the graph (see the module doc), the nodes in `excluded` never part of one.
pub(crate) fn plan(g: &Graph, excluded: &[bool]) -> Vec<FusedRun> {
    // Who reads each node, and whether it is returned.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for o in &n.inputs {
            if let Operand::Node(id) = o {
                readers[id.index()].push(i);
            }
        }
    }
    let mut returned = vec![false; g.nodes.len()];
    for o in &g.outputs {
        if let Operand::Node(id) = o {
            returned[id.index()] = true;
        }
    }
    let mut runs = Vec::new();
    let mut i = 0;
    while i < g.nodes.len() {
        let Some(ty) = fusable(g, i).filter(|_| !excluded[i]) else {
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < g.nodes.len() && !excluded[j] && fusable(g, j) == Some(ty) {
            j += 1;
        }
        if j - i >= 2 {
            let nodes: Vec<usize> = (i..j).collect();
            let outputs: Vec<usize> = nodes
                .iter()
                .copied()
                .filter(|&n| returned[n] || readers[n].iter().any(|&r| r < i || r >= j))
                .collect();
            let mut inputs: Vec<Operand> = Vec::new();
            let mut strides: Vec<Option<Vec<i64>>> = Vec::new();
            let mut steps = Vec::with_capacity(nodes.len());
            for &n in &nodes {
                let node = &g.nodes[n];
                let (template, arity) = match (unary_name(node.op), binary_name(node.op)) {
                    (Some(u), _) => (format!("op_{u}"), 1),
                    (_, Some(b)) => (format!("bin_{b}"), 2),
                    _ => break,
                };
                let mut args = Vec::with_capacity(arity);
                for (k, o) in node.inputs.iter().take(arity).enumerate() {
                    let read = match o {
                        Operand::Const(c) => FusedRead::Const(c.as_f64().unwrap_or(0.0)),
                        Operand::Node(id) if id.index() >= i => FusedRead::Register(id.index()),
                        _ => {
                            let st = operand_type(g, o)
                                .and_then(|x| operand_strides(node.op, k, ty, x))
                                .flatten();
                            let j = match inputs
                                .iter()
                                .zip(&strides)
                                .position(|(x, s)| x == o && *s == st)
                            {
                                Some(j) => j,
                                None => {
                                    inputs.push(o.clone());
                                    strides.push(st);
                                    inputs.len() - 1
                                }
                            };
                            FusedRead::Input(j)
                        }
                    };
                    args.push(read);
                }
                steps.push(FusedStep {
                    node: n,
                    template,
                    args,
                });
            }
            let (suffix, c_type) = if ty.dtype == DType::Float32 {
                ("f32", "float")
            } else {
                ("f64", "double")
            };
            runs.push(FusedRun {
                kernel: format!("fused_{i}_{suffix}"),
                nodes,
                inputs,
                strides,
                outputs,
                elements: ty.num_elements(),
                steps,
                c_type,
            });
        }
        i = j;
    }
    runs
}

/// The kernel text of `runs` (for [`crate::Device::load_kernels`], after
/// `kernels/elementwise.cu`, whose op templates it calls). Names each run's kernel after a
/// hash of its code (`fused_<hash>_<dtype>`): kernels of different graphs loaded into one
/// device never collide, and equal ones share a name.
pub(crate) fn source(runs: &mut [FusedRun]) -> String {
    let mut s = String::from(crate::kernels::ELEMENTWISE);
    let mut emitted: Vec<String> = Vec::new();
    for run in runs.iter_mut() {
        let code = kernel_code(run, "KERNEL");
        let digest = <sha2::Sha256 as sha2::Digest>::digest(code.as_bytes());
        let tag: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let suffix = if run.c_type == "float" { "f32" } else { "f64" };
        let name = format!("fused_{tag}_{suffix}");
        if !emitted.contains(&name) {
            s.push_str(&code.replace("KERNEL(", &format!("{name}(")));
            emitted.push(name.clone());
        }
        run.kernel = name;
    }
    s
}

/// One run's kernel, named `name`.
fn kernel_code(run: &FusedRun, name: &str) -> String {
    let mut s = String::new();
    let t = run.c_type;
    let mut params: Vec<String> = (0..run.inputs.len())
        .map(|k| format!("const {t}* __restrict__ in{k}"))
        .collect();
    params.extend((0..run.outputs.len()).map(|k| format!("{t}* __restrict__ out{k}")));
    for (k, st) in run.strides.iter().enumerate() {
        if st.is_some() {
            params.push(format!("Strided s{k}"));
        }
    }
    params.push("i64 n".into());
    let _ = writeln!(
        s,
        "extern \"C\" __global__ void {}({}) {{\n    GRID_STRIDE(i, n) {{",
        name,
        params.join(", ")
    );
    for (k, st) in run.strides.iter().enumerate() {
        if st.is_some() {
            let _ = writeln!(
                s,
                "        i64 o{k}, p{k};\n        strided_offsets(s{k}, i, &o{k}, &p{k});"
            );
        }
    }
    for step in &run.steps {
        let args: Vec<String> = step
            .args
            .iter()
            .map(|r| match r {
                FusedRead::Const(v) => format!("({t})({v:?})"),
                FusedRead::Register(n) => format!("v{n}"),
                FusedRead::Input(j) if run.strides[*j].is_some() => format!("in{j}[o{j}]"),
                FusedRead::Input(j) => format!("in{j}[i]"),
            })
            .collect();
        let _ = writeln!(
            s,
            "        {t} v{} = {}<{t}>({});",
            step.node,
            step.template,
            args.join(", ")
        );
    }
    for (k, &n) in run.outputs.iter().enumerate() {
        let _ = writeln!(s, "        out{k}[i] = v{n};");
    }
    s.push_str("    }\n}\n");
    s
}
