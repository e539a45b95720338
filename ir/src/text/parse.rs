//! The parser: text in the grammar of `docs/ir-format.md` to a graph.
//!
//! A hand-written recursive-descent parser over a byte cursor. It never panics, recurses only
//! into nested attribute values (at most [`MAX_NESTING`] deep) and does linear work per input
//! byte (lookups go through hash maps).

use super::{classify_word, is_word_char, Word, MAX_NESTING};
use crate::attr::{Attr, Const, Strategy};
use crate::graph::{Graph, Init, Node, Operand, Param, ParamId, ParamKind};
use crate::op::OpKind;
use crate::types::{DType, Shape, TensorType, Type};
use std::collections::{HashMap, HashSet};

/// A syntax or reference error in a text IR file. Displays as
/// `file:line:column: expected <what>, found <what>` (1-based line and column, the column
/// counted in characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: expected {expected}, found {found}")]
pub struct ParseError {
    /// The file name given to [`parse_graph`].
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// What the parser expected there.
    pub expected: String,
    /// What it found: a quoted token, `end of line` or `end of file`.
    pub found: String,
}

type R<T> = Result<T, ParseError>;

/// Parses a graph from its text form. `file` names the source in error messages.
///
/// Nodes without a type line get `ty = Type::Tuple(vec![])` ("not inferred yet"); run
/// `shardc_passes::infer::infer_graph` to fill them in. See the [module
/// documentation](super) for the grammar's details (constants, strategies, comments,
/// MindSpore's `Load`).
pub fn parse_graph(src: &str, file: &str) -> Result<Graph, ParseError> {
    Parser {
        src,
        pos: 0,
        file,
        params: Vec::new(),
        param_keys: HashMap::new(),
        declared: Vec::new(),
        monads: HashSet::new(),
        nodes: Vec::new(),
        ids: HashMap::new(),
    }
    .file()
}

/// Where comment and type lines go: the last node, or nowhere (after a `Load`).
#[derive(Clone, Copy)]
enum Attach {
    /// Before the first node: comments are ignored, type lines are errors.
    Nothing,
    /// The node at this index.
    Node {
        index: usize,
        typed: bool,
        commented: bool,
    },
    /// A `Load` alias or the `Return`: type line and comments are read and dropped.
    Dropped { typed: bool, commented: bool },
}

/// A parsed parameter type.
enum ParamType {
    Input(TensorType),
    Ref(TensorType, String, usize),
    /// MindSpore's `<UMonad>` / `<IOMonad>` plumbing parameters: read and ignored.
    Monad,
}

/// One `key: value` entry of an attribute map.
struct Entry {
    key: String,
    quoted: bool,
    key_pos: usize,
    value: Attr,
    value_pos: usize,
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    file: &'a str,
    params: Vec<Param>,
    /// `(number, name)` of `%para{number}_{name}` to the parameter.
    param_keys: HashMap<(String, String), ParamId>,
    /// The keys in order of declaration.
    declared: Vec<(String, String)>,
    /// Monad parameters (`%para12_u : <UMonad>`), ignored wherever they appear.
    monads: HashSet<(String, String)>,
    nodes: Vec<Node>,
    /// `%N` in the file to what it means (a node, or for a `Load`, its first operand).
    ids: HashMap<u64, Operand>,
}

impl<'a> Parser<'a> {
    // ---------------------------------------------------------------- cursor primitives

    fn peek(&self) -> Option<u8> {
        self.src.as_bytes().get(self.pos).copied()
    }

    fn peek_char(&self) -> Option<char> {
        self.src.get(self.pos..).and_then(|s| s.chars().next())
    }

    /// Advances over one character.
    fn bump(&mut self) {
        if let Some(c) = self.peek_char() {
            self.pos += c.len_utf8();
        }
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r')) {
            self.pos += 1;
        }
    }

    fn at_eol(&self) -> bool {
        matches!(self.peek(), None | Some(b'\n'))
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> R<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.err(format!("'{}'", c as char)))
        }
    }

    /// Skips trailing blanks and the end of the line.
    fn expect_eol(&mut self) -> R<()> {
        self.skip_ws();
        match self.peek() {
            None => Ok(()),
            Some(b'\n') => {
                self.pos += 1;
                Ok(())
            }
            Some(_) => Err(self.err("end of line")),
        }
    }

    /// The maximal run of word characters at the cursor (possibly empty).
    fn word(&mut self) -> &'a str {
        let start = self.pos;
        let bytes = self.src.as_bytes();
        while self.pos < bytes.len() && is_word_char(bytes[self.pos] as char) {
            self.pos += 1;
        }
        self.src.get(start..self.pos).unwrap_or("")
    }

    /// Consumes `kw` if it stands at the cursor as a whole word.
    fn eat_keyword(&mut self, kw: &str) -> bool {
        let rest = self.src.get(self.pos..).unwrap_or("");
        if let Some(after) = rest.strip_prefix(kw) {
            if !after.starts_with(is_word_char) {
                self.pos += kw.len();
                return true;
            }
        }
        false
    }

    /// The rest of the line (without the newline, which is consumed).
    fn rest_of_line(&mut self) -> &'a str {
        let rest = self.src.get(self.pos..).unwrap_or("");
        let len = rest.find('\n').unwrap_or(rest.len());
        self.pos += len;
        if self.peek() == Some(b'\n') {
            self.pos += 1;
        }
        rest.get(..len).unwrap_or("")
    }

    fn err(&self, expected: impl Into<String>) -> ParseError {
        self.err_at(self.pos, expected)
    }

    fn err_at(&self, pos: usize, expected: impl Into<String>) -> ParseError {
        let pos = pos.min(self.src.len());
        let before = self.src.get(..pos).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before.get(line_start..).unwrap_or("").chars().count() + 1;
        ParseError {
            file: self.file.to_string(),
            line,
            column,
            expected: expected.into(),
            found: self.found_at(pos),
        }
    }

    /// Describes the token at `pos` for an error message.
    fn found_at(&self, pos: usize) -> String {
        let rest = self.src.get(pos..).unwrap_or("");
        let Some(c) = rest.chars().next() else {
            return "end of file".to_string();
        };
        if c == '\n' || rest.starts_with("\r\n") {
            return "end of line".to_string();
        }
        let prefix = usize::from(c == '%' || c == '@');
        let word_len = rest
            .get(prefix..)
            .unwrap_or("")
            .find(|ch: char| !is_word_char(ch))
            .unwrap_or(rest.len() - prefix);
        if word_len > 0 {
            let token: String = rest.chars().take((prefix + word_len).min(40)).collect();
            return format!("'{token}'");
        }
        format!("{c:?}")
    }

    // ---------------------------------------------------------------- the file

    fn file(mut self) -> R<Graph> {
        // Header comments and parameter lines.
        loop {
            self.skip_ws();
            match self.peek() {
                None => return Err(self.err("a parameter line or 'subgraph'")),
                Some(b'\n') => self.pos += 1,
                Some(b'#') => {
                    self.rest_of_line();
                }
                Some(b'%') => self.param_decl()?,
                _ if self.eat_keyword("subgraph") => break,
                _ => return Err(self.err("a parameter line or 'subgraph'")),
            }
        }

        // `subgraph @Net(%para1_x, ...) {`
        self.skip_ws();
        self.expect(b'@')?;
        let name = self.name("a graph name")?;
        self.skip_ws();
        self.expect(b'(')?;
        self.subgraph_params()?;
        self.skip_ws();
        self.expect(b'{')?;
        self.expect_eol()?;

        // Nodes, up to `Return(...)`.
        let mut attach = Attach::Nothing;
        let outputs = loop {
            self.skip_ws();
            match self.peek() {
                None => return Err(self.err("a node, a comment or 'Return'")),
                Some(b'\n') => self.pos += 1,
                Some(b'#') => self.comment(&mut attach),
                Some(b':') => self.type_line(&mut attach)?,
                Some(b'%') => attach = self.node()?,
                _ if self.eat_keyword("Return") => {
                    self.skip_ws();
                    self.expect(b'(')?;
                    let outputs = self.operands()?;
                    self.expect_eol()?;
                    break outputs;
                }
                _ => return Err(self.err("a node, a comment or 'Return'")),
            }
        };

        // MindSpore prints a type line and a scope under `Return`; then `}`.
        let mut attach = Attach::Dropped {
            typed: false,
            commented: false,
        };
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'\n') => self.pos += 1,
                Some(b'#') => self.comment(&mut attach),
                Some(b':') => self.type_line(&mut attach)?,
                Some(b'}') => {
                    self.pos += 1;
                    self.expect_eol()?;
                    break;
                }
                _ => return Err(self.err("'}'")),
            }
        }
        loop {
            self.skip_ws();
            match self.peek() {
                None => break,
                Some(b'\n') => self.pos += 1,
                Some(b'#') => {
                    self.rest_of_line();
                }
                _ => return Err(self.err("end of file")),
            }
        }

        Ok(Graph {
            name,
            params: self.params,
            nodes: self.nodes,
            outputs,
        })
    }

    /// A name: a bare word or a quoted string.
    fn name(&mut self, what: &str) -> R<String> {
        if self.peek() == Some(b'"') {
            return self.quoted();
        }
        let w = self.word();
        if w.is_empty() {
            return Err(self.err(what));
        }
        Ok(w.to_string())
    }

    /// The parameter list of `subgraph @Net(...)`: the declared parameters, in order.
    fn subgraph_params(&mut self) -> R<()> {
        let expected = |key: &(String, String)| {
            format!(
                "%para{}_{} (the declared parameters, in order)",
                key.0,
                super::name_text(&key.1)
            )
        };
        let mut k = 0;
        let mut first = true;
        loop {
            self.skip_ws();
            let start = self.pos;
            if self.eat(b')') {
                return match self.declared.get(k) {
                    Some(key) => Err(self.err_at(start, expected(key))),
                    None => Ok(()),
                };
            }
            if !first {
                self.expect(b',')?;
                self.skip_ws();
            }
            first = false;
            let start = self.pos;
            let key = self.param_token()?;
            if self.monads.contains(&key) {
                continue;
            }
            match self.declared.get(k) {
                Some(d) if *d == key => k += 1,
                Some(d) => return Err(self.err_at(start, expected(d))),
                None => return Err(self.err_at(start, "')' (no more declared parameters)")),
            }
        }
    }

    // ---------------------------------------------------------------- parameters

    /// `%para{n}_{name}` (the name bare or quoted): returns `(n, name)`.
    fn param_token(&mut self) -> R<(String, String)> {
        let start = self.pos;
        let what = "a parameter such as %para1_x";
        if !self.eat(b'%') {
            return Err(self.err(what));
        }
        let w = self.word();
        let Some(rest) = w.strip_prefix("para") else {
            return Err(self.err_at(start, what));
        };
        let digits_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (digits, after) = rest.split_at(digits_len);
        let Some(name) = after.strip_prefix('_') else {
            return Err(self.err_at(start, what));
        };
        if digits.is_empty() {
            return Err(self.err_at(start, what));
        }
        let name = if name.is_empty() {
            if self.peek() == Some(b'"') {
                self.quoted()?
            } else {
                return Err(self.err("a parameter name"));
            }
        } else {
            name.to_string()
        };
        Ok((digits.to_string(), name))
    }

    /// `%para1_x : <Tensor[Float32], (16, 32)>` or
    /// `%para3_w : <Ref[Tensor(F32)], (32, 16), ref_key=:w>  :  has_default  init: ...`.
    fn param_decl(&mut self) -> R<()> {
        let start = self.pos;
        let key = self.param_token()?;
        if self.param_keys.contains_key(&key) || self.monads.contains(&key) {
            return Err(self.err_at(start, "a new parameter name"));
        }
        self.skip_ws();
        self.expect(b':')?;
        self.skip_ws();
        let (ty, kind) = match self.param_type()? {
            ParamType::Monad => {
                self.expect_eol()?;
                self.monads.insert(key);
                return Ok(());
            }
            ParamType::Input(ty) => (ty, ParamKind::Input),
            ParamType::Ref(ty, ref_key, key_pos) => {
                if ref_key != key.1 {
                    let name = super::name_text(&key.1);
                    return Err(self.err_at(key_pos, format!("ref_key=:{name}")));
                }
                let mut init = None;
                let mut requires_grad = None;
                self.skip_ws();
                if self.eat(b':') {
                    loop {
                        self.skip_ws();
                        if self.at_eol() {
                            break;
                        }
                        if self.eat_keyword("has_default") {
                            continue;
                        }
                        let item = self.pos;
                        if init.is_none() && self.eat_keyword("init") {
                            self.skip_ws();
                            self.expect(b':')?;
                            self.skip_ws();
                            init = Some(self.init()?);
                        } else if requires_grad.is_none() && self.eat_keyword("requires_grad") {
                            self.skip_ws();
                            self.expect(b':')?;
                            self.skip_ws();
                            let v = self.pos;
                            requires_grad = Some(match self.word() {
                                "true" => true,
                                "false" => false,
                                _ => return Err(self.err_at(v, "true or false")),
                            });
                        } else {
                            return Err(self.err_at(
                                item,
                                "has_default, init: or requires_grad: or end of line",
                            ));
                        }
                    }
                }
                (
                    ty,
                    ParamKind::Weight {
                        init: init.unwrap_or(Init::Zeros),
                        requires_grad: requires_grad.unwrap_or(true),
                    },
                )
            }
        };
        self.expect_eol()?;
        let id = ParamId(
            u32::try_from(self.params.len()).map_err(|_| self.err_at(start, "fewer parameters"))?,
        );
        self.params.push(Param {
            name: key.1.clone(),
            ty,
            kind,
        });
        self.param_keys.insert(key.clone(), id);
        self.declared.push(key);
        Ok(())
    }

    /// `<Tensor[Float32], (16, 32)>` or `<Ref[Tensor(F32)], (32, 16), ref_key=:w>`.
    fn param_type(&mut self) -> R<ParamType> {
        self.expect(b'<')?;
        let start = self.pos;
        match self.word() {
            "Tensor" => {
                let ty = self.tensor_rest()?;
                Ok(ParamType::Input(ty))
            }
            "Ref" => {
                let (ty, key, key_pos) = self.ref_rest()?;
                Ok(ParamType::Ref(ty, key, key_pos))
            }
            "UMonad" | "IOMonad" => {
                self.expect(b'>')?;
                Ok(ParamType::Monad)
            }
            _ => Err(self.err_at(start, "Tensor or Ref")),
        }
    }

    /// After `<Tensor`: `[Float32], (8, 16)>`.
    fn tensor_rest(&mut self) -> R<TensorType> {
        self.expect(b'[')?;
        let dtype = self.dtype()?;
        self.expect(b']')?;
        self.skip_ws();
        self.expect(b',')?;
        self.skip_ws();
        let shape = self.shape()?;
        self.skip_ws();
        self.expect(b'>')?;
        Ok(TensorType { dtype, shape })
    }

    /// After `<Ref`: `[Tensor(F32)], (32, 16), ref_key=:w>`; returns the key and its position.
    fn ref_rest(&mut self) -> R<(TensorType, String, usize)> {
        self.expect(b'[')?;
        if !self.eat_keyword("Tensor") {
            return Err(self.err("Tensor"));
        }
        self.expect(b'(')?;
        let dtype = self.dtype()?;
        self.expect(b')')?;
        self.expect(b']')?;
        self.skip_ws();
        self.expect(b',')?;
        self.skip_ws();
        let shape = self.shape()?;
        self.skip_ws();
        self.expect(b',')?;
        self.skip_ws();
        if !self.eat_keyword("ref_key") {
            return Err(self.err("ref_key=:NAME"));
        }
        self.expect(b'=')?;
        self.expect(b':')?;
        let key_pos = self.pos;
        let key = self.name("a parameter name")?;
        self.skip_ws();
        self.expect(b'>')?;
        Ok((TensorType { dtype, shape }, key, key_pos))
    }

    fn dtype(&mut self) -> R<DType> {
        let start = self.pos;
        let w = self.word();
        DType::from_name(w).ok_or_else(|| self.err_at(start, "an element type such as Float32"))
    }

    /// `(8, 16)`, `(8)`, `()`.
    fn shape(&mut self) -> R<Shape> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            let start = self.pos;
            let w = self.word();
            let d = w
                .parse::<usize>()
                .map_err(|_| self.err_at(start, "a dimension size"))?;
            dims.push(d);
            self.skip_ws();
            if self.eat(b')') {
                return Ok(dims);
            }
            if !self.eat(b',') {
                return Err(self.err("',' or ')'"));
            }
        }
    }

    /// `normal(sigma=0.01, seed=1)`, `zeros`, ... (MindSpore's defaults for absent
    /// arguments: sigma 0.01, mean 0, scale 0.07, gain 1, seed 0).
    fn init(&mut self) -> R<Init> {
        let base = self.base_init()?;
        let save = self.pos;
        self.skip_ws();
        if !self.eat_keyword("block") {
            self.pos = save;
            return Ok(base);
        }
        self.skip_ws();
        let offset = self.shape()?;
        self.skip_ws();
        if !self.eat_keyword("of") {
            return Err(self.err("'of' and the whole tensor's shape"));
        }
        self.skip_ws();
        let global_shape = self.shape()?;
        Ok(Init::Block {
            of: Box::new(base),
            global_shape,
            offset,
        })
    }

    /// An initializer without a `block` clause.
    fn base_init(&mut self) -> R<Init> {
        let start = self.pos;
        let what =
            "an initializer (normal, uniform, zeros, ones, constant, xavier_uniform, he_normal)";
        let kind = self.word();
        let allowed: &[&str] = match kind {
            "zeros" => return Ok(Init::Zeros),
            "ones" => return Ok(Init::Ones),
            "normal" => &["sigma", "mean", "seed"],
            "uniform" => &["scale", "seed"],
            "constant" => &["value"],
            "xavier_uniform" => &["gain", "seed"],
            "he_normal" => &["seed"],
            _ => return Err(self.err_at(start, what)),
        };
        self.expect(b'(')?;
        let mut args: Vec<(&str, &str, usize)> = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                break;
            }
            let key_pos = self.pos;
            let key = self.word();
            if !allowed.contains(&key) {
                return Err(self.err_at(key_pos, format!("one of {}", allowed.join(", "))));
            }
            if args.iter().any(|(k, _, _)| *k == key) {
                return Err(self.err_at(key_pos, "an argument not given before"));
            }
            self.skip_ws();
            self.expect(b'=')?;
            self.skip_ws();
            let value_pos = self.pos;
            let value = self.word();
            if value.is_empty() {
                return Err(self.err("a number"));
            }
            args.push((key, value, value_pos));
            self.skip_ws();
            if self.eat(b')') {
                break;
            }
            if !self.eat(b',') {
                return Err(self.err("',' or ')'"));
            }
        }
        let float = |p: &Self, key: &str, default: Option<f64>| -> R<f64> {
            match args.iter().find(|(k, _, _)| *k == key) {
                Some((_, v, pos)) => match classify_word(v) {
                    Word::Int(i) => Ok(i as f64),
                    Word::Float(f) => Ok(f),
                    _ => Err(p.err_at(*pos, "a number")),
                },
                None => default.ok_or_else(|| p.err_at(start, format!("{kind}(...) with {key}="))),
            }
        };
        let seed = |p: &Self| -> R<u64> {
            match args.iter().find(|(k, _, _)| *k == "seed") {
                Some((_, v, pos)) => v
                    .parse::<u64>()
                    .map_err(|_| p.err_at(*pos, "a seed (a non-negative integer)")),
                None => Ok(0),
            }
        };
        Ok(match kind {
            "normal" => Init::Normal {
                sigma: float(self, "sigma", Some(0.01))?,
                mean: float(self, "mean", Some(0.0))?,
                seed: seed(self)?,
            },
            "uniform" => Init::Uniform {
                scale: float(self, "scale", Some(0.07))?,
                seed: seed(self)?,
            },
            "constant" => Init::Constant {
                value: float(self, "value", None)?,
            },
            "xavier_uniform" => Init::XavierUniform {
                gain: float(self, "gain", Some(1.0))?,
                seed: seed(self)?,
            },
            _ => Init::HeNormal { seed: seed(self)? },
        })
    }

    // ---------------------------------------------------------------- nodes

    /// A node line; returns where its type line and comments go.
    fn node(&mut self) -> R<Attach> {
        let start = self.pos;
        self.expect(b'%')?;
        let w = self.word();
        if w.is_empty() || !w.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.err_at(start, "a node id such as %1"));
        }
        let id: u64 = w
            .parse()
            .map_err(|_| self.err_at(start, "a node id such as %1"))?;
        if self.ids.contains_key(&id) {
            return Err(self.err_at(start, "a node id not used before"));
        }
        self.expect(b'(')?;
        let name = if self.peek() == Some(b'"') {
            self.quoted()?
        } else {
            let rest = self.src.get(self.pos..).unwrap_or("");
            let len = rest.find([')', '\n']).unwrap_or(rest.len());
            self.pos += len;
            rest.get(..len).unwrap_or("").to_string()
        };
        self.expect(b')')?;
        self.skip_ws();
        self.expect(b'=')?;
        self.skip_ws();
        let op_pos = self.pos;
        let op_name = self.word();
        if op_name == "Load" {
            let target = self.load()?;
            let mut scratch = Node::new(OpKind::MatMul, Vec::new());
            self.sections(&mut scratch)?;
            self.expect_eol()?;
            self.ids.insert(id, target);
            return Ok(Attach::Dropped {
                typed: false,
                commented: false,
            });
        }
        let Some(op) = OpKind::from_name(op_name) else {
            return Err(self.err_at(op_pos, "an op name such as MatMul"));
        };
        self.skip_ws();
        self.expect(b'(')?;
        let inputs = self.operands()?;
        let mut node = Node::new(op, inputs);
        node.name = name;
        self.sections(&mut node)?;
        self.expect_eol()?;
        let index = self.nodes.len();
        let node_id = u32::try_from(index).map_err(|_| self.err_at(start, "fewer nodes"))?;
        self.nodes.push(node);
        self.ids
            .insert(id, Operand::Node(crate::graph::NodeId(node_id)));
        Ok(Attach::Node {
            index,
            typed: false,
            commented: false,
        })
    }

    /// After `Load`: `(X, ...)`; returns X. The other operands (MindSpore's monads) are
    /// skipped without being resolved.
    fn load(&mut self) -> R<Operand> {
        self.skip_ws();
        self.expect(b'(')?;
        self.skip_ws();
        let target = self.operand()?;
        if matches!(target, Operand::Const(_)) {
            return Err(self.err("a node or a parameter as the operand of Load"));
        }
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(target);
            }
            self.expect(b',')?;
            self.skip_ws();
            match self.peek() {
                Some(b'%') => {
                    self.pos += 1;
                    self.word();
                    if self.peek() == Some(b'"') {
                        self.quoted()?;
                    }
                }
                Some(b'$') => {
                    self.dollar_ref()?;
                }
                Some(c) if is_word_char(c as char) => {
                    self.word();
                }
                _ => return Err(self.err("an operand")),
            }
        }
    }

    /// `$(@1_construct_wrapper.337:para4_w2)`: MindSpore's reference to a parameter of an
    /// enclosing graph; returns the `(n, name)` key of `%para{n}_{name}`.
    fn dollar_ref(&mut self) -> R<(String, String)> {
        let start = self.pos;
        self.expect(b'$')?;
        self.expect(b'(')?;
        let rest = self.src.get(self.pos..).unwrap_or("");
        let len = rest.find([')', '\n']).unwrap_or(rest.len());
        let inner = rest.get(..len).unwrap_or("");
        self.pos += len;
        self.expect(b')')?;
        let what = "a parameter reference such as $(@graph:para1_x)";
        let last = inner.rsplit(':').next().unwrap_or("");
        let rest = last
            .strip_prefix("para")
            .ok_or_else(|| self.err_at(start, what))?;
        let digits_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (digits, after) = rest.split_at(digits_len);
        match after.strip_prefix('_') {
            Some(name) if !digits.is_empty() && !name.is_empty() => {
                Ok((digits.to_string(), name.to_string()))
            }
            _ => Err(self.err_at(start, what)),
        }
    }

    /// The optional parts after a node's operands: `{instance name: X}`,
    /// `primitive_attrs: {...}`, `cnode_attrs: {...}` and `{in_strategy: ...}`, each at most
    /// once.
    fn sections(&mut self, node: &mut Node) -> R<()> {
        let (mut instance, mut prim, mut cnode, mut trailing) = (false, false, false, false);
        loop {
            self.skip_ws();
            if self.at_eol() {
                return Ok(());
            }
            let start = self.pos;
            if !prim && self.eat_keyword("primitive_attrs") {
                prim = true;
                self.skip_ws();
                self.expect(b':')?;
                self.skip_ws();
                self.expect(b'{')?;
                let mut seen = HashSet::new();
                for e in self.attr_map()? {
                    let is_strategy =
                        !e.quoted && (e.key == "in_strategy" || e.key == "out_strategy");
                    if !seen.insert((is_strategy, e.key.clone())) {
                        return Err(self.err_at(e.key_pos, "an attribute name not used before"));
                    }
                    if is_strategy {
                        let slot = if e.key == "in_strategy" {
                            &mut node.in_strategy
                        } else {
                            &mut node.out_strategy
                        };
                        self.set_strategy(slot, &e)?;
                    } else {
                        node.attrs.0.push((e.key, e.value));
                    }
                }
            } else if !cnode && self.eat_keyword("cnode_attrs") {
                cnode = true;
                self.skip_ws();
                self.expect(b':')?;
                self.skip_ws();
                self.expect(b'{')?;
                let mut seen = HashSet::new();
                for e in self.attr_map()? {
                    if !seen.insert(e.key.clone()) {
                        return Err(self.err_at(e.key_pos, "an attribute name not used before"));
                    }
                    node.cnode_attrs.0.push((e.key, e.value));
                }
            } else if self.eat(b'{') {
                self.skip_ws();
                if !instance && self.eat_keyword("instance") {
                    instance = true;
                    self.skip_ws();
                    if !self.eat_keyword("name") {
                        return Err(self.err("'name'"));
                    }
                    self.skip_ws();
                    self.expect(b':')?;
                    self.skip_ws();
                    node.instance = if self.peek() == Some(b'"') {
                        self.quoted()?
                    } else {
                        let rest = self.src.get(self.pos..).unwrap_or("");
                        let len = rest.find(['}', '\n']).unwrap_or(rest.len());
                        self.pos += len;
                        rest.get(..len).unwrap_or("").trim_end().to_string()
                    };
                    self.skip_ws();
                    self.expect(b'}')?;
                } else if !trailing {
                    trailing = true;
                    let mut seen = HashSet::new();
                    for e in self.attr_map()? {
                        let slot = match (e.quoted, e.key.as_str()) {
                            (false, "in_strategy") => &mut node.in_strategy,
                            (false, "out_strategy") => &mut node.out_strategy,
                            _ => return Err(self.err_at(e.key_pos, "in_strategy or out_strategy")),
                        };
                        if !seen.insert(e.key.clone()) {
                            return Err(self.err_at(e.key_pos, "a key not used before"));
                        }
                        self.set_strategy(slot, &e)?;
                    }
                } else {
                    return Err(self.err_at(start, "end of line"));
                }
            } else {
                return Err(self.err("'{', 'primitive_attrs', 'cnode_attrs' or end of line"));
            }
        }
    }

    /// Sets a strategy from an entry; `None` leaves it unset, and a strategy given twice
    /// (in `primitive_attrs` and in the trailing braces) must be the same both times.
    fn set_strategy(&self, slot: &mut Option<Strategy>, e: &Entry) -> R<()> {
        let Some(s) = self.strategy(e)? else {
            return Ok(());
        };
        if let Some(before) = slot {
            if *before != s {
                return Err(self.err_at(
                    e.value_pos,
                    format!("the same {} as before, {before}", e.key),
                ));
            }
        }
        *slot = Some(s);
        Ok(())
    }

    /// A strategy value: `((2, 4), (4, 1))` or `None`.
    fn strategy(&self, e: &Entry) -> R<Option<Strategy>> {
        let bad = || self.err_at(e.value_pos, "a strategy such as ((2, 4), (4, 1)) or None");
        match &e.value {
            Attr::None => Ok(None),
            Attr::Tuple(xs) | Attr::List(xs) => {
                let mut dims = Vec::with_capacity(xs.len());
                for x in xs {
                    match x {
                        Attr::Tuple(ys) | Attr::List(ys) => {
                            let d: Option<Vec<i64>> = ys.iter().map(Attr::as_int).collect();
                            dims.push(d.ok_or_else(bad)?);
                        }
                        _ => return Err(bad()),
                    }
                }
                Ok(Some(Strategy(dims)))
            }
            _ => Err(bad()),
        }
    }

    /// The entries of `{k: v, ...}` after its `{`.
    fn attr_map(&mut self) -> R<Vec<Entry>> {
        let mut entries = Vec::new();
        self.skip_ws();
        if self.eat(b'}') {
            return Ok(entries);
        }
        loop {
            self.skip_ws();
            let key_pos = self.pos;
            let (key, quoted) = if self.peek() == Some(b'"') {
                (self.quoted()?, true)
            } else {
                let w = self.word();
                if w.is_empty() {
                    return Err(self.err("an attribute name"));
                }
                (w.to_string(), false)
            };
            self.skip_ws();
            self.expect(b':')?;
            self.skip_ws();
            let value_pos = self.pos;
            let value = self.attr(0)?;
            entries.push(Entry {
                key,
                quoted,
                key_pos,
                value,
                value_pos,
            });
            self.skip_ws();
            if self.eat(b'}') {
                return Ok(entries);
            }
            if !self.eat(b',') {
                return Err(self.err("',' or '}'"));
            }
        }
    }

    /// An attribute value; `depth` counts the enclosing tuples and lists.
    fn attr(&mut self, depth: usize) -> R<Attr> {
        match self.peek() {
            Some(open @ (b'(' | b'[')) => {
                if depth >= MAX_NESTING {
                    return Err(self.err(format!(
                        "at most {MAX_NESTING} levels of nested tuples and lists"
                    )));
                }
                self.pos += 1;
                let close = if open == b'(' { b')' } else { b']' };
                let mut items = Vec::new();
                loop {
                    self.skip_ws();
                    if self.eat(close) {
                        break;
                    }
                    items.push(self.attr(depth + 1)?);
                    self.skip_ws();
                    if self.eat(close) {
                        break;
                    }
                    if !self.eat(b',') {
                        return Err(self.err(format!("',' or '{}'", close as char)));
                    }
                }
                Ok(if open == b'(' {
                    Attr::Tuple(items)
                } else {
                    Attr::List(items)
                })
            }
            Some(b'"') => Ok(Attr::Str(self.quoted()?)),
            Some(c) if is_word_char(c as char) => {
                let w = self.word();
                Ok(match classify_word(w) {
                    Word::None => Attr::None,
                    Word::Bool(b) => Attr::Bool(b),
                    Word::Int(i) => Attr::Int(i),
                    Word::Float(f) => Attr::Float(f),
                    Word::Str => Attr::Str(w.to_string()),
                })
            }
            _ => Err(self.err("a value")),
        }
    }

    /// A double-quoted string with escapes; strings do not span lines.
    fn quoted(&mut self) -> R<String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let Some(c) = self.peek_char() else {
                return Err(self.err("'\"'"));
            };
            match c {
                '\n' => return Err(self.err("'\"'")),
                '"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                '\\' => {
                    self.pos += 1;
                    let esc_pos = self.pos;
                    let what = "an escape (\\n, \\t, \\r, \\0, \\\", \\\\ or \\u{7f})";
                    let Some(e) = self.peek_char() else {
                        return Err(self.err(what));
                    };
                    self.bump();
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        '"' => out.push('"'),
                        '\\' => out.push('\\'),
                        'u' => {
                            self.expect(b'{')?;
                            let rest = self.src.get(self.pos..).unwrap_or("");
                            let len = rest
                                .find(|c: char| !c.is_ascii_hexdigit())
                                .unwrap_or(rest.len());
                            let hex = rest.get(..len).unwrap_or("");
                            let ch = if (1..=6).contains(&len) {
                                u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)
                            } else {
                                None
                            };
                            let Some(ch) = ch else {
                                return Err(self.err_at(esc_pos, what));
                            };
                            self.pos += len;
                            self.expect(b'}')?;
                            out.push(ch);
                        }
                        _ => return Err(self.err_at(esc_pos, what)),
                    }
                }
                c => {
                    out.push(c);
                    self.bump();
                }
            }
        }
    }

    /// Operands after `(`, through the closing `)`.
    fn operands(&mut self) -> R<Vec<Operand>> {
        let mut ops = Vec::new();
        self.skip_ws();
        if self.eat(b')') {
            return Ok(ops);
        }
        loop {
            self.skip_ws();
            ops.push(self.operand()?);
            self.skip_ws();
            if self.eat(b')') {
                return Ok(ops);
            }
            if !self.eat(b',') {
                return Err(self.err("',' or ')'"));
            }
        }
    }

    /// `%3`, `%para1_x`, `$(@g:para1_x)`, `3`, `0.5`, `true`, `(0, 1)`.
    fn operand(&mut self) -> R<Operand> {
        let start = self.pos;
        let what = "an operand (%ID, %paraN_name or a constant)";
        match self.peek() {
            Some(b'%') => {
                let rest = self.src.get(self.pos + 1..).unwrap_or("");
                if rest.starts_with(|c: char| c.is_ascii_digit()) {
                    self.pos += 1;
                    let w = self.word();
                    let id = w
                        .parse::<u64>()
                        .ok()
                        .filter(|_| w.bytes().all(|b| b.is_ascii_digit()));
                    match id.and_then(|id| self.ids.get(&id)) {
                        Some(op) => Ok(op.clone()),
                        None => Err(self.err_at(start, "a node id defined above")),
                    }
                } else {
                    let key = self.param_token()?;
                    self.param_ref(&key, start)
                }
            }
            Some(b'$') => {
                let key = self.dollar_ref()?;
                self.param_ref(&key, start)
            }
            Some(b'(') => {
                self.pos += 1;
                let mut v = Vec::new();
                loop {
                    self.skip_ws();
                    if self.eat(b')') {
                        break;
                    }
                    let at = self.pos;
                    let w = self.word();
                    let i = w
                        .parse::<i64>()
                        .map_err(|_| self.err_at(at, "an integer"))?;
                    v.push(i);
                    self.skip_ws();
                    if self.eat(b')') {
                        break;
                    }
                    if !self.eat(b',') {
                        return Err(self.err("',' or ')'"));
                    }
                }
                Ok(Operand::Const(Const::Ints(v)))
            }
            Some(c) if is_word_char(c as char) => {
                let w = self.word();
                match classify_word(w) {
                    Word::Int(i) => Ok(Operand::Const(Const::Int(i))),
                    Word::Float(f) => Ok(Operand::Const(Const::Float(f))),
                    Word::Bool(b) => Ok(Operand::Const(Const::Bool(b))),
                    Word::None | Word::Str => Err(self.err_at(start, what)),
                }
            }
            _ => Err(self.err(what)),
        }
    }

    fn param_ref(&self, key: &(String, String), start: usize) -> R<Operand> {
        self.param_keys
            .get(key)
            .map(|&p| Operand::Param(p))
            .ok_or_else(|| self.err_at(start, "a declared parameter"))
    }

    // ---------------------------------------------------------------- comments and types

    /// A `#` line under a node: the first may set the scope, the others are comments.
    fn comment(&mut self, attach: &mut Attach) {
        self.pos += 1; // '#'
        let line = self.rest_of_line();
        let text = line
            .strip_prefix(' ')
            .unwrap_or(line)
            .trim_end_matches('\r');
        match attach {
            Attach::Nothing => {}
            Attach::Dropped { commented, .. } => *commented = true,
            Attach::Node {
                index, commented, ..
            } => {
                let first = !*commented;
                *commented = true;
                let Some(node) = self.nodes.get_mut(*index) else {
                    return;
                };
                let scope = text
                    .strip_prefix("scope: (")
                    .and_then(|s| s.strip_suffix(')'));
                match scope {
                    Some(scope) if first => node.scope = scope.to_string(),
                    _ => node.comments.push(text.to_string()),
                }
            }
        }
    }

    /// `: (<in types>) -> (<out type>)` directly under a node (before its comments). The input
    /// types are skipped (they only need balanced parentheses); the output type is the node's
    /// type.
    fn type_line(&mut self, attach: &mut Attach) -> R<()> {
        let (typed, commented) = match attach {
            Attach::Node {
                typed, commented, ..
            }
            | Attach::Dropped { typed, commented } => (typed, commented),
            Attach::Nothing => return Err(self.err("a node, a comment or 'Return'")),
        };
        if *typed || *commented {
            return Err(self.err("a node, a comment or 'Return'"));
        }
        *typed = true;
        self.expect(b':')?;
        self.skip_ws();
        self.expect(b'(')?;
        let mut depth = 1usize;
        while depth > 0 {
            match self.peek() {
                None | Some(b'\n') => return Err(self.err("')'")),
                Some(b'(') => {
                    depth += 1;
                    self.pos += 1;
                }
                Some(b')') => {
                    depth -= 1;
                    self.pos += 1;
                }
                Some(b'"') => {
                    self.quoted()?;
                }
                Some(_) => self.bump(),
            }
        }
        self.skip_ws();
        if !self.src.get(self.pos..).unwrap_or("").starts_with("->") {
            return Err(self.err("'->'"));
        }
        self.pos += 2;
        self.skip_ws();
        self.expect(b'(')?;
        self.skip_ws();
        let ty = self.value_type()?;
        self.skip_ws();
        self.expect(b')')?;
        self.expect_eol()?;
        if let Attach::Node { index, .. } = *attach {
            if let Some(node) = self.nodes.get_mut(index) {
                node.ty = ty;
            }
        }
        Ok(())
    }

    /// A result type: `<Tensor[Float32], (8, 16)>`, `<Tuple[<Tensor[..], (..)>, ...]>`,
    /// MindSpore's `<Tuple[Tensor[Float32]*2], TupleShape((8), (8))>`, or a `Ref` (a tensor).
    fn value_type(&mut self) -> R<Type> {
        self.expect(b'<')?;
        let start = self.pos;
        match self.word() {
            "Tensor" => Ok(Type::Tensor(self.tensor_rest()?)),
            "Ref" => Ok(Type::Tensor(self.ref_rest()?.0)),
            "Tuple" => {
                self.expect(b'[')?;
                self.skip_ws();
                let mut elems = Vec::new();
                if self.eat(b']') {
                    self.skip_ws();
                    self.expect(b'>')?;
                    return Ok(Type::Tuple(elems));
                }
                if self.peek() == Some(b'<') {
                    loop {
                        self.skip_ws();
                        self.expect(b'<')?;
                        if !self.eat_keyword("Tensor") {
                            return Err(self.err("Tensor"));
                        }
                        elems.push(self.tensor_rest()?);
                        self.skip_ws();
                        if self.eat(b']') {
                            break;
                        }
                        if !self.eat(b',') {
                            return Err(self.err("',' or ']'"));
                        }
                    }
                    self.skip_ws();
                    self.expect(b'>')?;
                    return Ok(Type::Tuple(elems));
                }
                self.mindspore_tuple()
            }
            _ => Err(self.err_at(start, "Tensor, Ref or Tuple")),
        }
    }

    /// After `<Tuple[`: `Tensor[Float32]*2, Tensor[Int32]], TupleShape((8), (8), (4))>`.
    fn mindspore_tuple(&mut self) -> R<Type> {
        let mut dtypes = Vec::new();
        loop {
            self.skip_ws();
            if !self.eat_keyword("Tensor") {
                return Err(self.err("Tensor"));
            }
            self.expect(b'[')?;
            let dtype = self.dtype()?;
            self.expect(b']')?;
            let mut count = 1usize;
            if self.eat(b'*') {
                let at = self.pos;
                count = self
                    .word()
                    .parse::<usize>()
                    .map_err(|_| self.err_at(at, "a count"))?;
            }
            if dtypes.len().saturating_add(count) > self.src.len() {
                return Err(self.err("a smaller count"));
            }
            dtypes.extend(std::iter::repeat_n(dtype, count));
            self.skip_ws();
            if self.eat(b']') {
                break;
            }
            if !self.eat(b',') {
                return Err(self.err("',' or ']'"));
            }
        }
        self.skip_ws();
        self.expect(b',')?;
        self.skip_ws();
        if !self.eat_keyword("TupleShape") {
            return Err(self.err("TupleShape"));
        }
        self.expect(b'(')?;
        let mut elems = Vec::with_capacity(dtypes.len());
        loop {
            self.skip_ws();
            let at = self.pos;
            if self.eat(b')') {
                if elems.len() != dtypes.len() {
                    return Err(self.err_at(at, format!("{} shapes", dtypes.len())));
                }
                break;
            }
            if !elems.is_empty() {
                self.expect(b',')?;
                self.skip_ws();
            }
            let at = self.pos;
            let shape = self.shape()?;
            let Some(&dtype) = dtypes.get(elems.len()) else {
                return Err(self.err_at(at, format!("')' after {} shapes", dtypes.len())));
            };
            elems.push(TensorType { dtype, shape });
        }
        self.skip_ws();
        self.expect(b'>')?;
        Ok(Type::Tuple(elems))
    }
}
