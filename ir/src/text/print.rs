//! The printer: a graph to the text of `docs/ir-format.md`.

use super::{format_float, is_bare_name, is_bare_string, name_text, quote};
use crate::attr::{Attr, Attrs, Const};
use crate::graph::{Graph, Init, Node, Operand, Param, ParamKind};
use crate::types::{ShapeDisplay, TensorType, Type};
use std::fmt::Write;

/// Prints a graph in the dump grammar of `docs/ir-format.md` (see the module documentation
/// for the decisions the grammar leaves open). Never panics, even on an invalid graph (an
/// operand naming a missing parameter prints as `%paraK_"<missing>"`).
pub fn print_graph(g: &Graph) -> String {
    let mut out = String::new();
    let graph_name = name_text(&g.name);
    let _ = writeln!(out, "#IR entry      : @{graph_name}");
    let _ = writeln!(out, "#Total params  : {}", g.params.len());
    out.push('\n');
    for (k, p) in g.params.iter().enumerate() {
        print_param(&mut out, k, p);
    }
    out.push('\n');
    let _ = write!(out, "subgraph @{graph_name}(");
    for (k, p) in g.params.iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        out.push_str(&param_ref(k, &p.name));
    }
    out.push_str(") {\n");
    for (i, node) in g.nodes.iter().enumerate() {
        print_node(&mut out, g, i, node);
    }
    out.push_str("  Return(");
    for (i, o) in g.outputs.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        print_operand(&mut out, g, o);
    }
    out.push_str(")\n}\n");
    out
}

/// `%para{k+1}_{name}`.
fn param_ref(k: usize, name: &str) -> String {
    format!("%para{}_{}", k + 1, name_text(name))
}

fn print_param(out: &mut String, k: usize, p: &Param) {
    let _ = write!(out, "{} : ", param_ref(k, &p.name));
    match &p.kind {
        ParamKind::Input => {
            let _ = writeln!(out, "{}", p.ty);
        }
        ParamKind::Weight {
            init,
            requires_grad,
        } => {
            let _ = write!(
                out,
                "{}  :  has_default  init: {}",
                ref_type(&p.ty, &p.name),
                init_text(init)
            );
            if !requires_grad {
                out.push_str("  requires_grad: false");
            }
            out.push('\n');
        }
    }
}

/// `<Ref[Tensor(F32)], (32, 16), ref_key=:w>`.
fn ref_type(ty: &TensorType, name: &str) -> String {
    format!(
        "<Ref[Tensor({})], {}, ref_key=:{}>",
        ty.dtype.short_name(),
        ShapeDisplay(&ty.shape),
        name_text(name)
    )
}

fn init_text(init: &Init) -> String {
    match init {
        Init::Normal { sigma, mean, seed } => {
            if *mean == 0.0 {
                format!("normal(sigma={}, seed={seed})", format_float(*sigma))
            } else {
                format!(
                    "normal(sigma={}, mean={}, seed={seed})",
                    format_float(*sigma),
                    format_float(*mean)
                )
            }
        }
        Init::Uniform { scale, seed } => {
            format!("uniform(scale={}, seed={seed})", format_float(*scale))
        }
        Init::Zeros => "zeros".to_string(),
        Init::Ones => "ones".to_string(),
        Init::Constant { value } => format!("constant(value={})", format_float(*value)),
        Init::XavierUniform { gain, seed } => {
            format!("xavier_uniform(gain={}, seed={seed})", format_float(*gain))
        }
        Init::HeNormal { seed } => format!("he_normal(seed={seed})"),
        Init::Block {
            of,
            global_shape,
            offset,
        } => format!(
            "{} block {} of {}",
            init_text(of),
            ShapeDisplay(offset),
            ShapeDisplay(global_shape)
        ),
    }
}

/// Whether a string can be written raw between delimiters, where `stops` end the raw text.
fn raw_safe(s: &str, stops: &[char]) -> bool {
    !s.is_empty()
        && s.trim() == s
        && !s.starts_with('"')
        && !s.chars().any(|c| c.is_control() || stops.contains(&c))
}

fn print_node(out: &mut String, g: &Graph, i: usize, node: &Node) {
    let name = if node.name.is_empty() || raw_safe(&node.name, &[')']) {
        node.name.clone()
    } else {
        quote(&node.name)
    };
    let _ = write!(out, "  %{}({name}) = {}(", i + 1, node.op.name());
    for (j, o) in node.inputs.iter().enumerate() {
        if j > 0 {
            out.push_str(", ");
        }
        print_operand(out, g, o);
    }
    out.push(')');
    if !node.instance.is_empty() {
        let inst = if raw_safe(&node.instance, &['{', '}']) {
            node.instance.clone()
        } else {
            quote(&node.instance)
        };
        let _ = write!(out, " {{instance name: {inst}}}");
    }
    if !node.attrs.is_empty() || node.in_strategy.is_some() || node.out_strategy.is_some() {
        out.push_str(" primitive_attrs: {");
        let mut first = true;
        print_attr_entries(out, &node.attrs, &mut first);
        for (key, s) in [
            ("in_strategy", &node.in_strategy),
            ("out_strategy", &node.out_strategy),
        ] {
            if let Some(s) = s {
                if !first {
                    out.push_str(", ");
                }
                first = false;
                let _ = write!(out, "{key}: {s}");
            }
        }
        out.push('}');
    }
    if !node.cnode_attrs.is_empty() {
        out.push_str(" cnode_attrs: {");
        print_attr_entries(out, &node.cnode_attrs, &mut true);
        out.push('}');
    }
    if let Some(s) = &node.in_strategy {
        let _ = write!(out, " {{in_strategy: {s}}}");
    }
    out.push('\n');

    if !matches!(&node.ty, Type::Tuple(v) if v.is_empty()) {
        out.push_str("      : (");
        for (j, o) in node.inputs.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(&operand_type(g, o));
        }
        let _ = writeln!(out, ") -> ({})", type_text(&node.ty));
    }
    let first_comment_is_scope_like = node.comments.first().is_some_and(|c| {
        let c = sanitize(c);
        c.starts_with("scope: (") && c.ends_with(')')
    });
    if !node.scope.is_empty() || first_comment_is_scope_like {
        let _ = writeln!(out, "      # scope: ({})", sanitize(&node.scope));
    }
    for c in &node.comments {
        let _ = writeln!(out, "      # {}", sanitize(c));
    }
}

/// Comment text as it can stand on one line and read back the same.
fn sanitize(s: &str) -> String {
    s.replace('\n', " ").trim_end_matches('\r').to_string()
}

/// Attribute entries `k: v, ...`; keys the parser would take for strategies are quoted.
fn print_attr_entries(out: &mut String, attrs: &Attrs, first: &mut bool) {
    for (k, v) in attrs.iter() {
        if !*first {
            out.push_str(", ");
        }
        *first = false;
        if is_bare_name(k) && k != "in_strategy" && k != "out_strategy" {
            out.push_str(k);
        } else {
            out.push_str(&quote(k));
        }
        out.push_str(": ");
        print_attr(out, v);
    }
}

/// An attribute value prints as in the text form: `(2, 4)`, `sum`, `0.5`, `"a b"`.
impl std::fmt::Display for Attr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = String::new();
        print_attr(&mut s, self);
        f.write_str(&s)
    }
}

fn print_attr(out: &mut String, a: &Attr) {
    match a {
        Attr::None => out.push_str("None"),
        Attr::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Attr::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Attr::Float(f) => out.push_str(&format_float(*f)),
        Attr::Str(s) => {
            if is_bare_string(s) {
                out.push_str(s);
            } else {
                out.push_str(&quote(s));
            }
        }
        Attr::Tuple(xs) | Attr::List(xs) => {
            let (open, close) = if matches!(a, Attr::Tuple(_)) {
                ('(', ')')
            } else {
                ('[', ']')
            };
            out.push(open);
            for (i, x) in xs.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                print_attr(out, x);
            }
            out.push(close);
        }
    }
}

fn print_operand(out: &mut String, g: &Graph, o: &Operand) {
    match o {
        Operand::Node(n) => {
            let _ = write!(out, "%{}", u64::from(n.0) + 1);
        }
        Operand::Param(p) => {
            let name = g
                .params
                .get(p.index())
                .map_or("<missing>", |p| p.name.as_str());
            out.push_str(&param_ref(p.index(), name));
        }
        Operand::Const(c) => print_const(out, c),
    }
}

fn print_const(out: &mut String, c: &Const) {
    match c {
        Const::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Const::Float(f) => out.push_str(&format_float(*f)),
        Const::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Const::Ints(v) => {
            out.push('(');
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let _ = write!(out, "{x}");
            }
            out.push(')');
        }
    }
}

/// The type of an operand as printed left of `->`.
fn operand_type(g: &Graph, o: &Operand) -> String {
    match o {
        Operand::Node(n) => g
            .nodes
            .get(n.index())
            .map_or_else(|| "<Tuple[]>".to_string(), |n| type_text(&n.ty)),
        Operand::Param(p) => match g.params.get(p.index()) {
            Some(p) if p.is_weight() => ref_type(&p.ty, &p.name),
            Some(p) => p.ty.to_string(),
            None => "<Tuple[]>".to_string(),
        },
        Operand::Const(c) => c.type_text(),
    }
}

/// `<Tensor[Float32], (8, 16)>` or `<Tuple[<Tensor[..], (..)>, ...]>`.
fn type_text(t: &Type) -> String {
    match t {
        Type::Tensor(t) => t.to_string(),
        Type::Tuple(ts) => {
            let parts: Vec<String> = ts.iter().map(TensorType::to_string).collect();
            format!("<Tuple[{}]>", parts.join(", "))
        }
    }
}
