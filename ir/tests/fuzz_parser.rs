//! Fuzzing the text parser: arbitrary strings, token soups and mutations of valid files must
//! never panic; whatever parses must print and parse back to the same graph; every error must
//! have the `file:line:column: expected ..., found ...` form.
//!
//! The proptests are quick (about 1,000 cases). `parser_survives_a_million_inputs` is the long
//! run (`cargo test -p shardc-ir --release --test fuzz_parser -- --ignored --nocapture`); the
//! cargo-fuzz harness in `fuzz/` does the same with coverage guidance on nightly.

mod common;

use proptest::prelude::*;
use shardc_ir::text::{parse_graph, print_graph};

/// A short MindSpore-style dump with `Load`, monads and verbose type annotations.
const MINDSPORE: &str = r#"%para1_x : <Tensor[Float32], (8, 8)>
%para2_w : <Ref[Tensor(F32)], (8, 16), ref_key=:w>  :  has_default
%para12_u : <UMonad>
subgraph @1_construct_wrapper.337(%para1_x, %para12_u, %para2_w) {
%11([CNode]471) = Load($(@1_construct_wrapper.337:para2_w), %para12_u)
    : (<Ref[Tensor(F32)], (8, 16), ref_key=:w>, <UMonad>) -> (<Tensor[Float32], (8, 16)>)
%12(equivout) = MatMul(%para1_x, %11) {instance name: matmul} primitive_attrs: {input_names: [x1, x2], out_strategy: None, in_strategy: ((2, 4), (4, 1))} {in_strategy: ((2, 4), (4, 1))}
    : (<Tensor[Float32], (8, 8)>, <Tensor[Float32], (8, 16)>) -> (<Tensor[Float32], (8, 16)>)
    # scope: (Default/network-WithLossCell/_backbone-Net)
%13(equiv[CNode]520) = AllReduce(%12) {instance name: forward_op_1} primitive_attrs: {group: 4-6301172352641561019, op: sum, rank_list: (0, 1, 2, 3)} cnode_attrs: {comm_reuse: true}
    : (<Tensor[Float32], (8, 16)>) -> (<Tuple[Tensor[Float32]*2], TupleShape((4, 16), (4, 16))>)
%14(s) = StridedSlice(%13, (0, 0), (8, 4), (1, 1)) primitive_attrs: {x: "a\"b\u{7f}"}
Return(%14)
}
"#;

/// Tokens the mutator inserts and the token-soup generator strings together.
const TOKENS: &[&str] = &[
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    "<",
    ">",
    ",",
    ":",
    "=",
    "%",
    "%1",
    "%2",
    "%99",
    "%para1_x",
    "%para2_w",
    "%para3_",
    "$(",
    "@",
    "\"",
    "\\",
    "\\u{",
    "#",
    "# scope: (",
    "\n",
    "\r\n",
    " ",
    "\t",
    "->",
    "-",
    "0",
    "1",
    "-1",
    "1.5",
    "1e308",
    "1e-400",
    "nan",
    "inf",
    "None",
    "true",
    "false",
    "é",
    "\u{0}",
    "subgraph",
    "@Net",
    "Return",
    "Load",
    "MatMul",
    "ReLU",
    "Split",
    "primitive_attrs",
    "cnode_attrs",
    "instance",
    "name",
    "in_strategy",
    "out_strategy",
    "{instance name: ",
    "<Tensor[Float32], (2, 3)>",
    "<Ref[Tensor(F32)], (2), ref_key=:w>",
    "<Tuple[",
    "Tensor",
    "Float32",
    "F32",
    "ref_key=:",
    "has_default",
    "init:",
    "normal(",
    "sigma=",
    "seed=",
    "requires_grad:",
    "zeros",
    "TupleShape(",
    "*2",
    "18446744073709551616",
    "((2, 4), (4, 1))",
    "((((((((((",
    "))))))))))",
];

fn seeds() -> Vec<String> {
    vec![
        print_graph(&common::full_graph()),
        print_graph(&common::small_graph()),
        common::quickstart_text(),
        MINDSPORE.to_string(),
    ]
}

/// Parses `src`; on success checks the round trip, on failure the error's form.
fn check(src: &str) -> bool {
    match parse_graph(src, "fuzz.ir") {
        Ok(g) => {
            let text = print_graph(&g);
            let again = parse_graph(&text, "printed.ir").unwrap_or_else(|e| {
                panic!("printed text does not parse: {e}\n{text}\nfrom\n{src:?}")
            });
            assert_eq!(
                print_graph(&again),
                text,
                "print(parse(print)) differs for {src:?}"
            );
            // Debug, not PartialEq, so that NaN constants compare equal.
            assert_eq!(
                format!("{again:?}"),
                format!("{g:?}"),
                "parse(print(g)) != g for {src:?}"
            );
            true
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("fuzz.ir:"), "{msg}");
            assert!(
                msg.contains(": expected ") && msg.contains(", found "),
                "{msg}"
            );
            let lines = src.split('\n').count();
            assert!(
                e.line >= 1 && e.line <= lines,
                "line {} of {lines}: {msg}",
                e.line
            );
            let line_len = src
                .split('\n')
                .nth(e.line - 1)
                .map_or(0, |l| l.chars().count());
            assert!(
                e.column >= 1 && e.column <= line_len + 1,
                "{msg} (line has {line_len} chars)"
            );
            false
        }
    }
}

/// A deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// Splits text into tokens: runs of word characters, and single other characters.
fn tokens(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut in_word = false;
    for (i, c) in s.char_indices() {
        let w = c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '%');
        if !(w && in_word) && i > start {
            out.push(&s[start..i]);
            start = i;
        }
        in_word = w;
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// Applies one random mutation.
fn mutate(src: &str, rng: &mut Rng) -> String {
    let bytes = src.as_bytes();
    match rng.below(9) {
        // Flip a bit of a byte (the result is made valid UTF-8 lossily).
        0 => {
            let mut b = bytes.to_vec();
            if !b.is_empty() {
                let i = rng.below(b.len());
                b[i] ^= 1 << rng.below(8);
            }
            String::from_utf8_lossy(&b).into_owned()
        }
        // Replace a byte by a random ASCII character.
        1 => {
            let mut b = bytes.to_vec();
            if !b.is_empty() {
                let i = rng.below(b.len());
                b[i] = (rng.below(95) + 32) as u8;
            }
            String::from_utf8_lossy(&b).into_owned()
        }
        // Truncate.
        2 => {
            let cut = rng.below(bytes.len() + 1);
            String::from_utf8_lossy(&bytes[..cut]).into_owned()
        }
        // Delete a range of bytes.
        3 => {
            let a = rng.below(bytes.len() + 1);
            let len = rng.below(16).min(bytes.len() - a);
            let mut b = bytes[..a].to_vec();
            b.extend_from_slice(&bytes[a + len..]);
            String::from_utf8_lossy(&b).into_owned()
        }
        // Swap two tokens.
        4 => {
            let mut t = tokens(src);
            if t.len() >= 2 {
                let (i, j) = (rng.below(t.len()), rng.below(t.len()));
                t.swap(i, j);
            }
            t.concat()
        }
        // Delete or duplicate a token.
        5 => {
            let mut t = tokens(src);
            if !t.is_empty() {
                let i = rng.below(t.len());
                if rng.below(2) == 0 {
                    t.remove(i);
                } else {
                    let tok = t[i];
                    t.insert(i, tok);
                }
            }
            t.concat()
        }
        // Insert a dictionary token at a token boundary.
        6 => {
            let mut t = tokens(src);
            let i = rng.below(t.len() + 1);
            t.insert(i, TOKENS[rng.below(TOKENS.len())]);
            t.concat()
        }
        // Replace a token with a dictionary token.
        7 => {
            let mut t = tokens(src);
            if !t.is_empty() {
                let i = rng.below(t.len());
                t[i] = TOKENS[rng.below(TOKENS.len())];
            }
            t.concat()
        }
        // Swap, duplicate or delete whole lines.
        _ => {
            let mut lines: Vec<&str> = src.split('\n').collect();
            let i = rng.below(lines.len());
            let j = rng.below(lines.len());
            match rng.below(3) {
                0 => lines.swap(i, j),
                1 => {
                    let l = lines[i];
                    lines.insert(j, l);
                }
                _ => {
                    lines.remove(i);
                }
            }
            lines.join("\n")
        }
    }
}

fn token_soup(rng: &mut Rng) -> String {
    let n = rng.below(60);
    (0..n).map(|_| TOKENS[rng.below(TOKENS.len())]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings_never_panic(s in ".{0,300}") {
        check(&s);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..300)) {
        check(&String::from_utf8_lossy(&b));
    }

    #[test]
    fn token_soups_never_panic(seed in any::<u64>()) {
        check(&token_soup(&mut Rng(seed)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn mutated_valid_files_never_panic_and_round_trip(which in 0usize..4, seed in any::<u64>(), n in 1usize..6) {
        let seeds = seeds();
        let mut rng = Rng(seed);
        let mut s = seeds[which % seeds.len()].clone();
        for _ in 0..n {
            s = mutate(&s, &mut rng);
        }
        check(&s);
    }
}

#[test]
fn unmutated_seeds_parse_and_round_trip() {
    for s in seeds() {
        assert!(check(&s), "{s}");
    }
}

#[test]
#[ignore = "long run: cargo test -p shardc-ir --release --test fuzz_parser -- --ignored --nocapture"]
fn parser_survives_a_million_inputs() {
    const N: usize = 1_000_000;
    let seeds = seeds();
    let mut rng = Rng(0x5EED_F00D);
    let start = std::time::Instant::now();
    let (mut parsed, mut bytes) = (0usize, 0usize);
    for i in 0..N {
        let input = match i % 10 {
            // One in ten: a token soup, unrelated to any valid file.
            0 => token_soup(&mut rng),
            _ => {
                let mut s = seeds[rng.below(seeds.len())].clone();
                for _ in 0..1 + rng.below(8) {
                    s = mutate(&s, &mut rng);
                }
                s
            }
        };
        bytes += input.len();
        if check(&input) {
            parsed += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "parser_survives_a_million_inputs: {N} inputs ({:.1} MB), {parsed} parsed and round-tripped, {} rejected with a well-formed error, {secs:.1} s",
        bytes as f64 / 1e6,
        N - parsed
    );
}

#[test]
fn large_inputs_parse() {
    // 20,000 chained nodes, and single lines of 1 MB of brackets, quotes and commas: each
    // parses or fails in one linear pass (a quadratic parser would take minutes here).
    let mut src = String::from(
        "%para1_x : <Tensor[Float32], (2)>\nsubgraph @G(%para1_x) {\n  %1(a) = Neg(%para1_x)\n",
    );
    for i in 2..=20_000 {
        src.push_str(&format!(
            "  %{i}(a) = Add(%{}, %para1_x) primitive_attrs: {{k: [1, 2.5, x]}}\n      # scope: (s)\n",
            i - 1
        ));
    }
    src.push_str("  Return(%20000)\n}\n");
    let g = parse_graph(&src, "big.ir").unwrap();
    assert_eq!(g.nodes.len(), 20_000);
    assert_eq!(parse_graph(&print_graph(&g), "big2.ir").unwrap(), g);

    let base = print_graph(&common::small_graph());
    for filler in ["(", ",", "\"", "[1, ", "%1, ", "é"] {
        let long = filler.repeat(1_000_000 / filler.len());
        for (from, to) in [
            ("{keep_dims: false}", format!("{{keep_dims: {long}}}")),
            ("(%1, (0, 1))", format!("(%1, {long})")),
            ("-> (<Tensor[Float32], ()>)", format!("-> ({long})")),
            ("# scope: (Default)", format!("# scope: ({long})")),
        ] {
            check(&base.replace(from, &to));
        }
    }
}
