//! Finds module cycles in the workspace's crates: module A names an item of module B and B
//! names one of A, directly or through others. A cycle within a crate is what cargo cannot
//! forbid (crates cannot depend on each other in a loop; modules can).
//!
//! Built and run by `scripts/check-module-cycles.sh` with plain `rustc` (std only, no
//! dependencies), so that CI needs nothing beyond the toolchain.
//!
//! How the module graph is read, per crate (every `Cargo.toml` folder's `src/lib.rs` or
//! `src/main.rs` tree; tests, benches and examples are each their own crate and are skipped):
//!
//! - a module is a file (`a.rs`, `a/mod.rs`); inline modules (`mod tests { .. }`) belong to
//!   their file;
//! - an arrow A -> B is a path in A's code (comments and strings left out) that resolves into
//!   B: `crate::..`, `super::..`, `self::..`, a child module's name, or a name a `use` of A
//!   made stand for a module; the path ends in the deepest module that exists;
//! - `mod b;` is not an arrow, nor is a `pub use` in a module of its own descendants' items
//!   (the module's face, as a folder's `mod.rs` re-exporting its children), nor any path in
//!   a `#[cfg(test)] mod` block (unit tests stand above the code they test).
//!
//! Usage: `module_cycles ROOT` (exit 1 and every cycle with the names that tie it) or
//! `module_cycles --self-test` (shows the check finds a planted cycle and passes without it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside its crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// One crate's modules: path -> file.
struct Crate {
    name: String,
    modules: BTreeMap<ModPath, PathBuf>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.as_slice() {
        [flag] if flag == "--self-test" => self_test(),
        [root] => check(Path::new(root), true),
        _ => {
            eprintln!("usage: module_cycles ROOT | --self-test");
            2
        }
    };
    std::process::exit(code);
}

/// Checks every crate under `root`; prints the cycles; returns the exit status.
fn check(root: &Path, print: bool) -> i32 {
    let mut crates = Vec::new();
    find_crates(root, &mut crates);
    let mut found = 0;
    let mut modules = 0;
    for dir in &crates {
        for entry in ["src/lib.rs", "src/main.rs"] {
            let root_file = dir.join(entry);
            if !root_file.is_file() {
                continue;
            }
            let name = format!(
                "{}{}",
                dir.strip_prefix(root).unwrap_or(dir).display(),
                if entry.ends_with("main.rs") { " (bin)" } else { "" }
            );
            let krate = read_crate(&name, &root_file);
            modules += krate.modules.len();
            for cycle in cycles(&krate) {
                found += 1;
                if print {
                    println!("cycle {found} in {}:", krate.name);
                    for line in cycle {
                        println!("  {line}");
                    }
                }
            }
        }
    }
    if print {
        if found == 0 {
            println!("module cycles: none ({} crates, {modules} modules)", crates.len());
        } else {
            println!("module cycles: {found} (break each: move what both sides need into a module below them)");
        }
    }
    i32::from(found > 0)
}

/// Folders with a `Cargo.toml`, skipping build output and hidden folders.
fn find_crates(dir: &Path, out: &mut Vec<PathBuf>) {
    if dir.join("Cargo.toml").is_file() {
        out.push(dir.to_path_buf());
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut subdirs: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !n.starts_with('.') && n != "target" && n != "src" && n != "node_modules"
        })
        .collect();
    subdirs.sort();
    for d in subdirs {
        find_crates(&d, out);
    }
}

/// The modules of the crate rooted at `root_file`, following `mod x;` declarations.
fn read_crate(name: &str, root_file: &Path) -> Crate {
    let mut modules = BTreeMap::new();
    let mut todo = vec![(Vec::<String>::new(), root_file.to_path_buf())];
    while let Some((path, file)) = todo.pop() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let code = strip(&text);
        // Where this file's child modules live.
        let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let dir = file.parent().unwrap_or(Path::new("."));
        let child_dir = if path.is_empty() || stem == "mod" {
            dir.to_path_buf()
        } else {
            dir.join(stem)
        };
        for child in declared_modules(&code) {
            let mut p = path.clone();
            p.push(child.clone());
            let a = child_dir.join(format!("{child}.rs"));
            let b = child_dir.join(&child).join("mod.rs");
            if a.is_file() {
                todo.push((p, a));
            } else if b.is_file() {
                todo.push((p, b));
            }
        }
        modules.insert(path, file);
    }
    Crate {
        name: name.to_string(),
        modules,
    }
}

/// The names of `mod x;` declarations (out-of-line modules) in `code`.
fn declared_modules(code: &str) -> Vec<String> {
    let toks = tokens(code);
    let mut out = Vec::new();
    for i in 0..toks.len() {
        if toks[i] == "mod" && i + 2 < toks.len() && toks[i + 2] == ";" && is_ident(&toks[i + 1]) {
            out.push(toks[i + 1].clone());
        }
    }
    out
}

/// `text` with comments, string and char literals blanked (newlines kept).
fn strip(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == b'r' && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            // A raw string: r"..", r#".."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                if b[j] == b'\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            let end = if b.get(i + 1) == Some(&b'\\') {
                (i + 2..b.len().min(i + 12)).find(|&j| b[j] == b'\'')
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.push_str("' '");
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

/// Identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(code[s..i].to_string());
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push("::".into());
            i += 2;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                i += 1;
            }
        } else {
            out.push((c as char).to_string());
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
}

/// A path found in a module's code: its segments as written, where (which inline module), and
/// whether it is the target of a `pub use` or a glob (`use a::*`).
struct FoundPath {
    segments: Vec<String>,
    scope: ModPath,
    reexport: bool,
    glob: bool,
}

/// Every path in `code` (a file of module `file_mod`): `use` trees expanded, and paths in code.
fn paths_in(code: &str, file_mod: &ModPath) -> Vec<FoundPath> {
    let toks = tokens(code);
    let mut out = Vec::new();
    // Inline modules: (module path, brace depth at which it closes, whether it is a
    // `#[cfg(test)]` module, whose paths are skipped).
    let mut scopes: Vec<(ModPath, usize, bool)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let scope = scopes.last().map_or_else(|| file_mod.clone(), |s| s.0.clone());
        let in_test = scopes.iter().any(|s| s.2);
        let t = toks[i].as_str();
        match t {
            "{" => {
                depth += 1;
                i += 1;
            }
            "}" => {
                depth = depth.saturating_sub(1);
                while scopes.last().is_some_and(|s| s.1 > depth) {
                    scopes.pop();
                }
                i += 1;
            }
            "mod" if i + 2 < toks.len() && is_ident(&toks[i + 1]) && toks[i + 2] == "{" => {
                let mut m = scope.clone();
                m.push(toks[i + 1].clone());
                depth += 1;
                let cfg_test = ["#", "[", "cfg", "(", "test", ")", "]"];
                let is_test = i >= cfg_test.len()
                    && toks[i - cfg_test.len()..i]
                        .iter()
                        .zip(cfg_test)
                        .all(|(a, b)| a == b);
                scopes.push((m, depth, is_test));
                i += 3;
            }
            "use" => {
                let reexport = i > 0 && (toks[i - 1] == "pub" || toks[i - 1] == ")");
                let end = (i..toks.len()).find(|&j| toks[j] == ";").unwrap_or(toks.len());
                let mut leaves = Vec::new();
                use_tree(&toks[i + 1..end], &mut Vec::new(), &mut leaves);
                for (segments, glob) in leaves.into_iter().filter(|_| !in_test) {
                    out.push(FoundPath {
                        segments,
                        scope: scope.clone(),
                        reexport,
                        glob,
                    });
                }
                i = end + 1;
            }
            _ if is_ident(t) && toks.get(i + 1).is_some_and(|n| n == "::") => {
                // `a::b` continuing a path, or a method's turbofish (`x.parse::<T>()`).
                let prev_is_path = i > 0 && (toks[i - 1] == "::" || toks[i - 1] == ".");
                let mut segments = vec![t.to_string()];
                let mut j = i + 1;
                while j + 1 < toks.len() && toks[j] == "::" && is_ident(&toks[j + 1]) {
                    segments.push(toks[j + 1].clone());
                    j += 2;
                }
                if !prev_is_path && !in_test {
                    out.push(FoundPath {
                        segments,
                        scope,
                        reexport: false,
                        glob: false,
                    });
                }
                i = j;
            }
            _ => i += 1,
        }
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d as e, *}}`) into its leaf paths (glob or not).
fn use_tree(toks: &[String], prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, bool)>) {
    let mut i = 0;
    let mut path = prefix.clone();
    while i < toks.len() {
        let t = toks[i].as_str();
        match t {
            "::" => i += 1,
            "{" => {
                // Split the group at top-level commas.
                let mut level = 0;
                let mut start = i + 1;
                let mut j = i + 1;
                while j < toks.len() {
                    match toks[j].as_str() {
                        "{" => level += 1,
                        "}" if level == 0 => {
                            use_tree(&toks[start..j], &mut path.clone(), out);
                            break;
                        }
                        "}" => level -= 1,
                        "," if level == 0 => {
                            use_tree(&toks[start..j], &mut path.clone(), out);
                            start = j + 1;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                return;
            }
            "*" => {
                out.push((path, true));
                return;
            }
            "as" => break,
            "self" if !path.is_empty() => i += 1,
            _ if is_ident(t) => {
                path.push(t.to_string());
                i += 1;
            }
            _ => i += 1,
        }
    }
    if !path.is_empty() {
        out.push((path, false));
    }
}

/// The module a path of `scope` (inside the file of `file_mod`) resolves into, if one of
/// `krate`'s: the deepest existing module along it. `aliases` maps names a `use` bound to a
/// module.
fn resolve(
    segments: &[String],
    scope: &ModPath,
    krate: &Crate,
    aliases: &BTreeMap<String, ModPath>,
) -> Option<ModPath> {
    let first = segments.first()?.as_str();
    let (mut base, rest): (ModPath, &[String]) = match first {
        "crate" => (Vec::new(), &segments[1..]),
        "self" => (scope.clone(), &segments[1..]),
        "super" => {
            let mut b = scope.clone();
            let mut k = 0;
            while segments.get(k).is_some_and(|s| s == "super") {
                b.pop();
                k += 1;
            }
            (b, &segments[k..])
        }
        name => {
            let mut child = scope.clone();
            child.push(name.to_string());
            if krate.modules.contains_key(&child) {
                (child, &segments[1..])
            } else if let Some(m) = aliases.get(name) {
                (m.clone(), &segments[1..])
            } else {
                return None;
            }
        }
    };
    for s in rest {
        let mut next = base.clone();
        next.push(s.clone());
        if krate.modules.contains_key(&next) {
            base = next;
        } else {
            break;
        }
    }
    // Inline modules (`tests`) are their file's.
    while !krate.modules.contains_key(&base) {
        base.pop()?;
    }
    Some(base)
}

/// The arrows of `krate`: (from, to) -> the names used.
fn arrows(krate: &Crate) -> BTreeMap<(ModPath, ModPath), BTreeSet<String>> {
    let mut out: BTreeMap<(ModPath, ModPath), BTreeSet<String>> = BTreeMap::new();
    for (m, file) in &krate.modules {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let code = strip(&text);
        let found = paths_in(&code, m);
        // Names that `use` bound to modules of this crate.
        let mut aliases = BTreeMap::new();
        for f in &found {
            if f.glob {
                continue;
            }
            if let Some(target) = resolve(&f.segments, &f.scope, krate, &BTreeMap::new()) {
                let last = f.segments.last().map(String::as_str);
                let last = if last == Some("self") {
                    f.segments.iter().rev().nth(1).map(String::as_str)
                } else {
                    last
                };
                if let Some(l) = last {
                    if target.last().map(String::as_str) == Some(l) {
                        aliases.insert(l.to_string(), target);
                    }
                }
            }
        }
        for f in &found {
            let Some(target) = resolve(&f.segments, &f.scope, krate, &aliases) else {
                continue;
            };
            if &target == m {
                continue;
            }
            // A module's face: re-exporting its own descendants' items.
            if f.reexport && target.starts_with(m) {
                continue;
            }
            let name = f
                .segments
                .iter()
                .skip_while(|s| matches!(s.as_str(), "crate" | "super" | "self"))
                .cloned()
                .collect::<Vec<_>>()
                .join("::");
            out.entry((m.clone(), target)).or_default().insert(if f.glob {
                format!("{name}::*")
            } else {
                name
            });
        }
    }
    out
}

/// Every cycle (strongly connected set of more than one module) of `krate`, as lines
/// `a.rs -> b.rs: names`.
fn cycles(krate: &Crate) -> Vec<Vec<String>> {
    let edges = arrows(krate);
    let nodes: Vec<&ModPath> = krate.modules.keys().collect();
    let index: BTreeMap<&ModPath, usize> = nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let mut adj = vec![Vec::new(); nodes.len()];
    for (a, b) in edges.keys() {
        adj[index[a]].push(index[b]);
    }
    let comps = tarjan(&adj);
    let file = |m: &ModPath| krate.modules[m].display().to_string();
    comps
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let set: BTreeSet<usize> = c.iter().copied().collect();
            let mut lines = Vec::new();
            for ((a, b), names) in &edges {
                if set.contains(&index[a]) && set.contains(&index[b]) {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    lines.push(format!("{} -> {}: {}", file(a), file(b), names.join(", ")));
                }
            }
            lines
        })
        .collect()
}

/// Tarjan's strongly connected components.
fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for k in 0..s.adj[v].len() {
            let w = s.adj[v][k];
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                _ => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                comp.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let n = adj.len();
    let mut s = State {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Builds a small crate in a temporary folder: with a planted cycle the check must fail and
/// name both files; without it (and with the allowed shapes: a face re-export, a test module's
/// glob, a comment and a string naming the other module) it must pass.
fn self_test() -> i32 {
    let dir = std::env::temp_dir().join(format!("module_cycles_self_test_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("Cargo.toml", "[package]\nname = \"t\"\n");
    write(
        "src/lib.rs",
        "mod a;\nmod b;\npub mod group;\npub use group::Leaf;\n",
    );
    write(
        "src/a.rs",
        "use crate::b::B;\n/// see [`crate::b::x`]\npub struct A;\npub fn f() -> &'static str { \"crate::b::x\" }\n#[cfg(test)]\nmod tests { use super::*; use crate::b::B; }\n",
    );
    write("src/group/mod.rs", "mod leaf;\npub use leaf::Leaf;\npub struct Shared;\n");
    write("src/group/leaf.rs", "use super::Shared;\npub struct Leaf(pub Shared);\n");
    write("src/b.rs", "pub struct B;\n");
    let clean = check(&dir, false);
    write("src/b.rs", "pub struct B(crate::a::A);\n");
    let planted = check(&dir, false);
    // The planted cycle is named with both files.
    let k = read_crate("t", &dir.join("src/lib.rs"));
    let found = cycles(&k);
    let named = found.len() == 1
        && found[0].iter().any(|l| l.ends_with("src/a.rs -> ".to_string().as_str()) || l.contains("src/a.rs ->"))
        && found[0].iter().any(|l| l.contains("src/b.rs ->"));
    let _ = std::fs::remove_dir_all(&dir);
    if clean == 0 && planted == 1 && named {
        println!("module cycles self-test: a planted cycle (a.rs <-> b.rs) is found; the allowed shapes pass");
        0
    } else {
        eprintln!(
            "module cycles self-test FAILED: clean crate -> {clean} (want 0), planted cycle -> {planted} (want 1), named: {named}"
        );
        1
    }
}
