//! Affine maps as MLIR prints them (`affine_map<(d0, d1)[s0] -> (d0 + s0, d1 floordiv 2)>`),
//! parsed and evaluated on integers.

/// An affine expression.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A constant.
    Const(i64),
    /// Dimension `k`.
    Dim(usize),
    /// Symbol `k`.
    Sym(usize),
    /// `a + b`.
    Add(Box<Expr>, Box<Expr>),
    /// `a * b`.
    Mul(Box<Expr>, Box<Expr>),
    /// `a floordiv b`.
    FloorDiv(Box<Expr>, Box<Expr>),
    /// `a ceildiv b`.
    CeilDiv(Box<Expr>, Box<Expr>),
    /// `a mod b`.
    Mod(Box<Expr>, Box<Expr>),
}

/// A map: dims, symbols, result expressions.
#[derive(Clone, Debug, PartialEq)]
pub struct Map {
    /// The number of dims.
    pub dims: usize,
    /// The number of symbols.
    pub syms: usize,
    /// The results.
    pub results: Vec<Expr>,
}

impl Expr {
    /// The value at `dims`, `syms`.
    pub fn eval(&self, dims: &[i64], syms: &[i64]) -> Option<i64> {
        Some(match self {
            Expr::Const(c) => *c,
            Expr::Dim(k) => *dims.get(*k)?,
            Expr::Sym(k) => *syms.get(*k)?,
            Expr::Add(a, b) => a.eval(dims, syms)? + b.eval(dims, syms)?,
            Expr::Mul(a, b) => a.eval(dims, syms)? * b.eval(dims, syms)?,
            Expr::FloorDiv(a, b) => {
                let d = b.eval(dims, syms)?;
                if d == 0 {
                    return None;
                }
                a.eval(dims, syms)?.div_euclid(d)
            }
            Expr::CeilDiv(a, b) => {
                let d = b.eval(dims, syms)?;
                if d == 0 {
                    return None;
                }
                let n = a.eval(dims, syms)?;
                -((-n).div_euclid(d))
            }
            Expr::Mod(a, b) => {
                let d = b.eval(dims, syms)?;
                if d == 0 {
                    return None;
                }
                a.eval(dims, syms)?.rem_euclid(d)
            }
        })
    }

    /// The dim this is, if a plain dim.
    pub fn as_dim(&self) -> Option<usize> {
        match self {
            Expr::Dim(k) => Some(*k),
            _ => None,
        }
    }
}

/// Tokens of the map grammar.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(i64),
    Id(String),
    P(char),
}

fn lex(s: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let cs: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let st = i;
            while i < cs.len() && cs[i].is_ascii_digit() {
                i += 1;
            }
            out.push(Tok::Num(cs[st..i].iter().collect::<String>().parse().ok()?));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let st = i;
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            out.push(Tok::Id(cs[st..i].iter().collect()));
        } else if c == '-' && cs.get(i + 1) == Some(&'>') {
            out.push(Tok::P('>'));
            i += 2;
        } else {
            out.push(Tok::P(c));
            i += 1;
        }
    }
    Some(out)
}

struct Parser {
    t: Vec<Tok>,
    i: usize,
    dims: Vec<String>,
    syms: Vec<String>,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.t.get(self.i)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::P(c)) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn ids(&mut self, close: char) -> Option<Vec<String>> {
        let mut v = Vec::new();
        if self.eat(close) {
            return Some(v);
        }
        loop {
            match self.t.get(self.i)? {
                Tok::Id(s) => v.push(s.clone()),
                _ => return None,
            }
            self.i += 1;
            if self.eat(close) {
                return Some(v);
            }
            if !self.eat(',') {
                return None;
            }
        }
    }
    fn sum(&mut self) -> Option<Expr> {
        let mut a = self.term()?;
        loop {
            if self.eat('+') {
                let b = self.term()?;
                a = Expr::Add(Box::new(a), Box::new(b));
            } else if self.eat('-') {
                let b = self.term()?;
                a = Expr::Add(
                    Box::new(a),
                    Box::new(Expr::Mul(Box::new(b), Box::new(Expr::Const(-1)))),
                );
            } else {
                return Some(a);
            }
        }
    }
    fn term(&mut self) -> Option<Expr> {
        let mut a = self.factor()?;
        loop {
            if self.eat('*') {
                let b = self.factor()?;
                a = Expr::Mul(Box::new(a), Box::new(b));
                continue;
            }
            let op = match self.peek() {
                Some(Tok::Id(s)) if s == "floordiv" || s == "ceildiv" || s == "mod" => s.clone(),
                _ => return Some(a),
            };
            self.i += 1;
            let b = self.factor()?;
            a = match op.as_str() {
                "floordiv" => Expr::FloorDiv(Box::new(a), Box::new(b)),
                "ceildiv" => Expr::CeilDiv(Box::new(a), Box::new(b)),
                _ => Expr::Mod(Box::new(a), Box::new(b)),
            };
        }
    }
    fn factor(&mut self) -> Option<Expr> {
        if self.eat('-') {
            let f = self.factor()?;
            return Some(Expr::Mul(Box::new(f), Box::new(Expr::Const(-1))));
        }
        if self.eat('(') {
            let e = self.sum()?;
            return if self.eat(')') { Some(e) } else { None };
        }
        let t = self.t.get(self.i)?.clone();
        self.i += 1;
        match t {
            Tok::Num(n) => Some(Expr::Const(n)),
            Tok::Id(s) => {
                if let Some(k) = self.dims.iter().position(|d| *d == s) {
                    Some(Expr::Dim(k))
                } else {
                    self.syms.iter().position(|d| *d == s).map(Expr::Sym)
                }
            }
            Tok::P(_) => None,
        }
    }
}

impl Map {
    /// Parses `affine_map<...>` or the bare `(d0) -> (d0)`.
    pub fn parse(s: &str) -> Option<Map> {
        let s = s.trim();
        let s = s
            .strip_prefix("affine_map<")
            .and_then(|r| r.strip_suffix('>'))
            .unwrap_or(s);
        let mut p = Parser {
            t: lex(s)?,
            i: 0,
            dims: Vec::new(),
            syms: Vec::new(),
        };
        if !p.eat('(') {
            return None;
        }
        p.dims = p.ids(')')?;
        if p.eat('[') {
            p.syms = p.ids(']')?;
        }
        if !p.eat('>') || !p.eat('(') {
            return None;
        }
        let mut results = Vec::new();
        if !p.eat(')') {
            loop {
                results.push(p.sum()?);
                if p.eat(')') {
                    break;
                }
                if !p.eat(',') {
                    return None;
                }
            }
        }
        if p.i != p.t.len() {
            return None;
        }
        Some(Map {
            dims: p.dims.len(),
            syms: p.syms.len(),
            results,
        })
    }

    /// Every result at `dims`, `syms`.
    pub fn eval(&self, dims: &[i64], syms: &[i64]) -> Option<Vec<i64>> {
        self.results.iter().map(|e| e.eval(dims, syms)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_parse_and_evaluate() {
        let m = Map::parse("affine_map<()[s0, s1, s2] -> (s0 * s1 + s2)>").unwrap();
        assert_eq!(m.eval(&[], &[1, 4, 3]), Some(vec![7]));
        let m = Map::parse("affine_map<(d0, d1, d2) -> (d2, d0)>").unwrap();
        assert_eq!(m.eval(&[5, 6, 7], &[]), Some(vec![7, 5]));
        assert_eq!(m.results[0].as_dim(), Some(2));
        let m =
            Map::parse("affine_map<(d0)[s0] -> (d0 floordiv 4 - s0, (d0 mod 3) * 2, 0)>").unwrap();
        assert_eq!(m.eval(&[9], &[1]), Some(vec![1, 0, 0]));
        let m = Map::parse("affine_map<(d0, d1) -> ()>").unwrap();
        assert!(m.results.is_empty());
        assert!(Map::parse("affine_map<(d0) -> (d9)>").is_none());
    }
}
