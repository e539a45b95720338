//! How a checkpoint's tensor names become a model's parameter names, for `--init-from` and
//! `load_param_into_net`.
//!
//! A name is first looked up as it is. A model parameter the checkpoint lacks is then found
//! through:
//!
//! 1. **The user's rules** (`--name-map FILE`): one rule per line, `checkpoint name = model
//!    name`, `#` starting a comment. A rule whose two sides end in `*` maps a prefix
//!    (`backbone.* = *` drops a prefix, `fc.* = head.fc.*` renames one).
//! 2. **The frameworks' conventions**, where unambiguous: MindSpore names a normalisation's
//!    scale and shift `gamma` and `beta` and its statistics `moving_mean` and
//!    `moving_variance`, an embedding's table `embedding_table`; PyTorch (and the ONNX files
//!    it exports) names them `weight`, `bias`, `running_mean`, `running_var` and `weight`.
//!    A model's `bn.gamma` is read from a file's `bn.weight` (and the reverse) when the file
//!    has no `bn.gamma` and the model no `bn.weight`.
//!
//! A rule that matches no tensor of the file, and two parameters resolved to one tensor, are
//! faults, listed with the checkpoint's other faults.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// One rule: exact (`a = b`) or a prefix (`a.* = b.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    from: String,
    to: String,
    prefix: bool,
    line: usize,
}

/// The user's renaming rules (empty: only exact names and the conventions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NameMap {
    rules: Vec<Rule>,
}

/// The frameworks' names for one thing: (MindSpore's suffix, PyTorch's suffix).
const CONVENTIONS: &[(&str, &str)] = &[
    (".gamma", ".weight"),
    (".beta", ".bias"),
    (".moving_mean", ".running_mean"),
    (".moving_variance", ".running_var"),
    (".embedding_table", ".weight"),
];

impl NameMap {
    /// Parses rules (see the module doc); errors name the line.
    pub fn parse(text: &str) -> Result<NameMap, String> {
        let mut rules = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let Some((from, to)) = line.split_once('=') else {
                return Err(format!(
                    "line {}: `{line}` is not a rule `checkpoint name = model name`",
                    i + 1
                ));
            };
            let (from, to) = (from.trim(), to.trim());
            let (fp, tp) = (from.ends_with('*'), to.ends_with('*'));
            if fp != tp {
                return Err(format!(
                    "line {}: `{line}`: a prefix rule ends in `*` on both sides",
                    i + 1
                ));
            }
            let strip = |s: &str| s.strip_suffix('*').unwrap_or(s).to_string();
            if from.is_empty() || (!fp && to.is_empty()) || from.contains(char::is_whitespace) {
                return Err(format!(
                    "line {}: `{line}` has an empty or spaced name",
                    i + 1
                ));
            }
            rules.push(Rule {
                from: strip(from),
                to: strip(to),
                prefix: fp,
                line: i + 1,
            });
        }
        Ok(NameMap { rules })
    }

    /// Reads and parses a rules file.
    pub fn read(path: &Path) -> Result<NameMap, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        NameMap::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The file tensor each model parameter reads (only parameters found), by model name; or
    /// every fault: a rule matching nothing, two parameters on one tensor.
    pub fn resolve(
        &self,
        file: &BTreeSet<String>,
        model: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, String>, Vec<String>> {
        let mut faults = Vec::new();
        // Each tensor under the name the rules give it (its own where none applies).
        let renamed: BTreeMap<String, String> = file
            .iter()
            .map(|f| (self.rename(f).unwrap_or_else(|| f.clone()), f.clone()))
            .collect();
        let names: BTreeSet<String> = renamed.keys().cloned().collect();
        let mut out = BTreeMap::new();
        for p in model {
            let found = if names.contains(p) {
                Some(p.clone())
            } else {
                by_convention(p, &names, model)
            };
            if let Some(f) = found.and_then(|n| renamed.get(&n)) {
                out.insert(p.clone(), f.clone());
            }
        }
        for r in &self.rules {
            let used = file.iter().any(|f| {
                if r.prefix {
                    f.starts_with(&r.from)
                } else {
                    *f == r.from
                }
            });
            if !used {
                faults.push(format!(
                    "name map line {}: `{}{} = {}{}` matches no tensor of the checkpoint",
                    r.line,
                    r.from,
                    if r.prefix { "*" } else { "" },
                    r.to,
                    if r.prefix { "*" } else { "" }
                ));
            }
        }
        let mut readers: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (p, f) in &out {
            readers.entry(f.as_str()).or_default().push(p.as_str());
        }
        for (f, ps) in readers {
            if ps.len() > 1 {
                faults.push(format!(
                    "the checkpoint's {f} would be read by {} parameters: {}",
                    ps.len(),
                    ps.join(", ")
                ));
            }
        }
        if faults.is_empty() {
            Ok(out)
        } else {
            Err(faults)
        }
    }

    /// The name the first matching rule gives a checkpoint's tensor `f`.
    fn rename(&self, f: &str) -> Option<String> {
        self.rules.iter().find_map(|r| {
            if r.prefix {
                Some(format!("{}{}", r.to, f.strip_prefix(r.from.as_str())?))
            } else {
                (r.from == f).then(|| r.to.clone())
            }
        })
    }
}

/// The file name the conventions give model parameter `p`: its counterpart, present in the
/// file and not itself a parameter of the model.
fn by_convention(p: &str, file: &BTreeSet<String>, model: &BTreeSet<String>) -> Option<String> {
    let mut found = CONVENTIONS.iter().flat_map(|&(ms, pt)| {
        [(ms, pt), (pt, ms)]
            .into_iter()
            .filter_map(move |(have, other)| {
                let stem = p.strip_suffix(have)?;
                let name = format!("{stem}{other}");
                (file.contains(&name) && !model.contains(&name)).then_some(name)
            })
    });
    let first = found.next()?;
    // Ambiguous (`x.weight` could be `x.gamma` or `x.embedding_table`... only one may fit).
    match found.find(|n| *n != first) {
        Some(_) => None,
        None => Some(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn conventions_map_pytorch_names_to_mindspores_and_back() {
        let file = set(&[
            "bn.weight",
            "bn.bias",
            "bn.running_mean",
            "bn.running_var",
            "fc.weight",
        ]);
        let model = set(&[
            "bn.gamma",
            "bn.beta",
            "bn.moving_mean",
            "bn.moving_variance",
            "fc.weight",
        ]);
        let m = NameMap::default().resolve(&file, &model).expect("resolves");
        assert_eq!(m["bn.gamma"], "bn.weight");
        assert_eq!(m["bn.moving_variance"], "bn.running_var");
        assert_eq!(m["fc.weight"], "fc.weight");
        // And back: MindSpore's file into a model with PyTorch's names.
        let m = NameMap::default().resolve(&model, &file).expect("resolves");
        assert_eq!(m["bn.weight"], "bn.gamma");
        assert_eq!(m["bn.running_mean"], "bn.moving_mean");
    }

    #[test]
    fn user_rules_rename_exact_names_and_prefixes() {
        let map = NameMap::parse(
            "# the backbone's prefix is dropped\nbackbone.* = *\nold_head.w = head.weight\n",
        )
        .expect("parses");
        let file = set(&["backbone.conv.weight", "backbone.bn.gamma", "old_head.w"]);
        let model = set(&["conv.weight", "bn.gamma", "head.weight", "head.bias"]);
        let m = map.resolve(&file, &model).expect("resolves");
        assert_eq!(m["conv.weight"], "backbone.conv.weight");
        assert_eq!(m["bn.gamma"], "backbone.bn.gamma");
        assert_eq!(m["head.weight"], "old_head.w");
        assert!(!m.contains_key("head.bias"));
    }

    #[test]
    fn faults_are_listed() {
        let map = NameMap::parse("nothing.* = x.*\na = w\nb = w2").expect("parses");
        let model = set(&["w", "w2"]);
        let e = map
            .resolve(&set(&["a"]), &model)
            .expect_err("two rules match nothing");
        assert!(
            e.iter()
                .any(|f| f.contains("line 3: `b = w2` matches no tensor")),
            "{e:?}"
        );
        assert!(
            e.iter().any(|f| f.contains("line 1: `nothing.* = x.*`")),
            "{e:?}"
        );
        let map = NameMap::parse("a = w\nb = w2").expect("parses");
        assert_eq!(
            map.resolve(&set(&["a", "b"]), &model).expect("fits").len(),
            2
        );
        // Two parameters whose conventions lead to one tensor.
        let e = NameMap::default()
            .resolve(&set(&["x.weight"]), &set(&["x.gamma", "x.embedding_table"]))
            .expect_err("one tensor, two readers");
        assert!(
            e.iter().any(|f| f.contains("the checkpoint's x.weight would be read by 2 parameters: x.embedding_table, x.gamma")),
            "{e:?}"
        );
        for bad in ["a b = c", "a.* = b", "= x", "just words"] {
            assert!(NameMap::parse(bad).is_err(), "{bad}");
        }
    }
}
