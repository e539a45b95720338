//! The parallel context: MindSpore's `set_auto_parallel_context` options as one typed value.
//!
//! [`ParallelContext`] holds every option with MindSpore's defaults; [`ParallelSettings`] is the
//! same set with every option optional, for layering a TOML file under command-line flags.
//! A TOML file uses MindSpore's option names as keys:
//!
//! ```toml
//! parallel_mode = "semi_auto_parallel"
//! search_mode = "sharding_propagation"
//! device_num = 8
//! global_rank = 0
//! gradients_mean = true
//! dataset_strategy = [[4, 1], [4, 1]]   # or "data_parallel" / "full_batch" / "((4, 1), (4, 1))"
//! enable_alltoall = false
//! max_device_memory = "16GB"
//! enable_parallel_optimizer = false
//! auto_pipeline = false                 # auto_parallel only: the stage planner chooses stages,
//!                                       # micro_size, optimizer sharding and recompute
//!
//! [strategy_ckpt_config]
//! save_file = "strategy.ckpt"
//! only_trainable_params = true
//!
//! [comm_fusion.allreduce]
//! mode = "size"                          # "auto" | "size" | "index"
//! config = 32                            # MB for "size", [20, 35] for "index"
//!
//! [parallel_optimizer_config]            # with enable_parallel_optimizer = true above
//! parallel_optimizer_threshold = 64      # KB; smaller weights stay whole
//! optimizer_weight_shard_size = -1       # -1: the whole data-parallel group
//! gradient_accumulation_shard = true
//! ```
//!
//! Unknown keys are errors (a typo is never silently ignored), and every error names the key,
//! the value and the reason, with the line (and the file) it came from.
//!
//! ```
//! use shardc_compiler::parallel_context::{ParallelContext, ParallelMode};
//!
//! let ctx = ParallelContext::from_toml_str("parallel_mode = \"semi_auto_parallel\"\ndevice_num = 8")?;
//! assert_eq!(ctx.parallel_mode, ParallelMode::SemiAutoParallel);
//! assert!(ctx.is_parallel());
//! assert_eq!(ParallelContext::from_toml_str(&ctx.to_toml_string())?, ctx);
//! # Ok::<(), shardc_compiler::parallel_context::ParallelContextError>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use shardc_ir::Strategy;
use shardc_passes::pipeline::{PipelineOptions, Scheduler};
use thiserror::Error;

/// An error in a parallel context: a bad option value, a bad TOML key, or a file that cannot
/// be read. Each names the option, the value and the reason.
#[derive(Debug, Error)]
pub enum ParallelContextError {
    /// A name that is not one of the option's valid names.
    #[error("unknown {option} `{value}`{hint}; valid values: {valid}")]
    UnknownName {
        /// The option (`parallel_mode`, `search_mode`, ...).
        option: String,
        /// The name given.
        value: String,
        /// The valid names, comma-separated.
        valid: String,
        /// ` (did you mean `x`?)` when a valid name is close, else empty.
        hint: String,
    },
    /// A value of the right type that the option does not accept.
    #[error("invalid {option} `{value}`: {reason}")]
    Invalid {
        /// The option, as its TOML key path (`comm_fusion.allreduce.config`).
        option: String,
        /// The value given, as text.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A TOML key that is not an option.
    #[error("unknown key `{key}`{hint}; valid keys: {valid}")]
    UnknownKey {
        /// The key path (`strategy_ckpt_config.svae_file`).
        key: String,
        /// The valid keys at that level, comma-separated.
        valid: String,
        /// ` (did you mean `x`?)` when a valid key is close, else empty.
        hint: String,
    },
    /// A TOML key whose value has the wrong type.
    #[error("key `{key}`: expected {expected}, found {found}")]
    WrongType {
        /// The key path.
        key: String,
        /// What the key takes.
        expected: String,
        /// The TOML type found (`string`, `integer`, `table`, ...).
        found: String,
    },
    /// A TOML key that is required by another one but absent.
    #[error("missing key `{key}`: {reason}")]
    MissingKey {
        /// The key path.
        key: String,
        /// Why it is required.
        reason: String,
    },
    /// The text is not TOML.
    #[error("{0}")]
    Syntax(toml::de::Error),
    /// A configuration file that cannot be read.
    #[error("cannot read {}: {error}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// An error located in a TOML file: `file:line: error`, `file: error` or `line N: error`.
    #[error("{}", located(file.as_deref(), *line, error))]
    Located {
        /// The file, when read from one.
        file: Option<PathBuf>,
        /// The 1-based line of the offending key, when known.
        line: Option<usize>,
        /// The error.
        error: Box<ParallelContextError>,
    },
}

fn located(file: Option<&Path>, line: Option<usize>, source: &ParallelContextError) -> String {
    match (file, line) {
        (Some(f), Some(l)) => format!("{}:{l}: {source}", f.display()),
        (Some(f), None) => format!("{}: {source}", f.display()),
        (None, Some(l)) => format!("line {l}: {source}"),
        (None, None) => source.to_string(),
    }
}

impl ParallelContextError {
    /// The error itself, without the file and line it was found at.
    pub fn root(&self) -> &ParallelContextError {
        match self {
            ParallelContextError::Located { error, .. } => error.root(),
            other => other,
        }
    }

    /// The TOML key path or option this error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self.root() {
            ParallelContextError::UnknownName { option, .. }
            | ParallelContextError::Invalid { option, .. } => Some(option),
            ParallelContextError::UnknownKey { key, .. }
            | ParallelContextError::WrongType { key, .. }
            | ParallelContextError::MissingKey { key, .. } => Some(key),
            _ => None,
        }
    }

    fn invalid(option: &str, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        ParallelContextError::Invalid {
            option: option.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    fn unknown_name(option: &str, value: &str, valid: &[&str]) -> Self {
        ParallelContextError::UnknownName {
            option: option.to_string(),
            value: value.to_string(),
            valid: valid.join(", "),
            hint: did_you_mean(value, valid),
        }
    }
}

/// ` (did you mean `x`?)` for the closest valid name within a small edit distance.
fn did_you_mean(value: &str, valid: &[&str]) -> String {
    let best = valid
        .iter()
        .map(|v| (edit_distance(value, v), *v))
        .min_by_key(|(d, _)| *d);
    match best {
        Some((d, v)) if d > 0 && d <= 2.max(value.len() / 4) => format!(" (did you mean `{v}`?)"),
        _ => String::new(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $name:ident, option = $option:literal {
            $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in MindSpore's documentation order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The MindSpore name of every value, in the order of [`Self::ALL`].
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The MindSpore name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParallelContextError;
            /// Parses the MindSpore name; an unknown name errors listing the valid ones.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(ParallelContextError::unknown_name($option, s, Self::NAMES)),
                }
            }
        }
    };
}

named_enum! {
    /// How the graph is distributed (MindSpore's `parallel_mode`).
    ParallelMode, option = "parallel_mode" {
        /// `stand_alone`: one device, no parallelism (MindSpore's default).
        #[default]
        StandAlone => "stand_alone",
        /// `data_parallel`: the batch is split, parameters are replicated, gradients all-reduced.
        DataParallel => "data_parallel",
        /// `semi_auto_parallel`: the user's `shard` strategies, the rest propagated.
        SemiAutoParallel => "semi_auto_parallel",
        /// `auto_parallel`: strategies searched by [`SearchMode`].
        AutoParallel => "auto_parallel",
    }
}

named_enum! {
    /// How `auto_parallel` searches strategies (MindSpore's `search_mode`).
    SearchMode, option = "search_mode" {
        /// `sharding_propagation`: from the configured ops' strategies outwards (the default).
        #[default]
        ShardingPropagation => "sharding_propagation",
        /// `dynamic_programming`: cost-model search over the whole graph.
        DynamicProgramming => "dynamic_programming",
        /// `recursive_programming`: the fast symbolic search.
        RecursiveProgramming => "recursive_programming",
        /// `ilp`: integer linear programming over the op strategies.
        Ilp => "ilp",
    }
}

/// How the dataset's inputs are split over devices (MindSpore's `dataset_strategy`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum DatasetStrategy {
    /// `data_parallel`: each device reads its slice of the batch (the default).
    #[default]
    DataParallel,
    /// `full_batch`: each device reads the whole batch.
    FullBatch,
    /// An explicit strategy per input, `((2, 1), (2, 1))`.
    Explicit(Strategy),
}

impl DatasetStrategy {
    const NAMES: &'static [&'static str] = &[
        "data_parallel",
        "full_batch",
        "a strategy such as ((2, 1), (2, 1))",
    ];
}

impl fmt::Display for DatasetStrategy {
    /// `data_parallel`, `full_batch` or `((2, 1), (2, 1))`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetStrategy::DataParallel => f.write_str("data_parallel"),
            DatasetStrategy::FullBatch => f.write_str("full_batch"),
            DatasetStrategy::Explicit(s) => write!(f, "{s}"),
        }
    }
}

impl FromStr for DatasetStrategy {
    type Err = ParallelContextError;
    /// Parses `data_parallel`, `full_batch`, or a strategy `((2, 1), (2, 1))` (brackets `[]`
    /// also read, a trailing comma is allowed as in Python's `((2, 1),)`). Split counts are
    /// checked by [`ParallelContext::validate`], not here.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        match t {
            "data_parallel" => Ok(DatasetStrategy::DataParallel),
            "full_batch" => Ok(DatasetStrategy::FullBatch),
            _ if t.starts_with('(') || t.starts_with('[') => parse_strategy(t)
                .map(DatasetStrategy::Explicit)
                .map_err(|reason| ParallelContextError::invalid("dataset_strategy", s, reason)),
            _ => Err(ParallelContextError::unknown_name(
                "dataset_strategy",
                s,
                Self::NAMES,
            )),
        }
    }
}

/// Parses `((2, 1), (2, 1))`; the error is the reason, with the 1-based column.
fn parse_strategy(text: &str) -> Result<Strategy, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut p = StrategyParser { chars, pos: 0 };
    let close = p.open()?;
    let mut inputs = Vec::new();
    loop {
        p.skip_ws();
        if p.eat(close) {
            break;
        }
        let inner_close = p.open()?;
        let mut dims = Vec::new();
        loop {
            p.skip_ws();
            if p.eat(inner_close) {
                break;
            }
            dims.push(p.int()?);
            p.skip_ws();
            if p.eat(inner_close) {
                break;
            }
            p.expect(',')?;
        }
        inputs.push(dims);
        p.skip_ws();
        if p.eat(close) {
            break;
        }
        p.expect(',')?;
    }
    p.skip_ws();
    if p.pos < p.chars.len() {
        return Err(p.unexpected("end of text"));
    }
    Ok(Strategy(inputs))
}

struct StrategyParser {
    chars: Vec<char>,
    pos: usize,
}

impl StrategyParser {
    fn skip_ws(&mut self) {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.chars.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn unexpected(&self, what: &str) -> String {
        match self.chars.get(self.pos) {
            Some(c) => format!("expected {what}, found `{c}` at column {}", self.pos + 1),
            None => format!("expected {what}, found end of text"),
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{c}`")))
        }
    }

    /// Reads `(` or `[` and returns the matching closer.
    fn open(&mut self) -> Result<char, String> {
        self.skip_ws();
        if self.eat('(') {
            Ok(')')
        } else if self.eat('[') {
            Ok(']')
        } else {
            Err(self.unexpected("`(`"))
        }
    }

    fn int(&mut self) -> Result<i64, String> {
        let start = self.pos;
        if self.chars.get(self.pos) == Some(&'-') {
            self.pos += 1;
        }
        while self.chars.get(self.pos).is_some_and(char::is_ascii_digit) {
            self.pos += 1;
        }
        let digits: String = self.chars[start..self.pos].iter().collect();
        digits.parse::<i64>().map_err(|_| {
            self.pos = start;
            self.unexpected("an integer")
        })
    }
}

/// Where the strategy checkpoint is saved and loaded (MindSpore's `strategy_ckpt_config`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrategyCkptConfig {
    /// Where to save the searched strategies, if anywhere.
    pub save_file: Option<PathBuf>,
    /// Where to load strategies from, if anywhere.
    pub load_file: Option<PathBuf>,
    /// Whether only trainable parameters' strategies are saved (default true).
    pub only_trainable_params: bool,
}

impl Default for StrategyCkptConfig {
    fn default() -> Self {
        StrategyCkptConfig {
            save_file: None,
            load_file: None,
            only_trainable_params: true,
        }
    }
}

/// Gradient all-reduce fusion (MindSpore's `comm_fusion={"allreduce": {"mode": .., "config":
/// ..}}`). Text form (flags): `auto`, `size:32`, `index:20,35`.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum CommFusion {
    /// `auto`: fuse into buckets of [`CommFusion::AUTO_BUCKET_MB`] MB (the default).
    #[default]
    Auto,
    /// `size`: fuse into buckets of this many MB (> 0).
    Size(f64),
    /// `index`: split the parameter list before each of these strictly increasing indices.
    Index(Vec<usize>),
}

impl CommFusion {
    /// The bucket size of [`CommFusion::Auto`], in MB.
    pub const AUTO_BUCKET_MB: f64 = 64.0;
    const MODES: &'static [&'static str] = &["auto", "size", "index"];

    /// The mode name: `auto`, `size` or `index`.
    pub fn mode(&self) -> &'static str {
        match self {
            CommFusion::Auto => "auto",
            CommFusion::Size(_) => "size",
            CommFusion::Index(_) => "index",
        }
    }

    fn config_text(&self) -> String {
        match self {
            CommFusion::Auto => String::new(),
            CommFusion::Size(mb) => mb.to_string(),
            CommFusion::Index(ix) => ix
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    fn validate(&self) -> Result<(), ParallelContextError> {
        const KEY: &str = "comm_fusion.allreduce.config";
        match self {
            CommFusion::Auto => Ok(()),
            CommFusion::Size(mb) if !(mb.is_finite() && *mb > 0.0) => Err(
                ParallelContextError::invalid(KEY, mb, "fusion size in MB must be greater than 0"),
            ),
            CommFusion::Size(_) => Ok(()),
            CommFusion::Index(ix) if ix.is_empty() => Err(ParallelContextError::invalid(
                KEY,
                "[]",
                "index mode needs at least one parameter index",
            )),
            CommFusion::Index(ix) => match ix.windows(2).find(|w| w[1] <= w[0]) {
                Some(w) => Err(ParallelContextError::invalid(
                    KEY,
                    format!("{ix:?}"),
                    format!(
                        "parameter indices must be strictly increasing, but {} follows {}",
                        w[1], w[0]
                    ),
                )),
                None => Ok(()),
            },
        }
    }
}

impl fmt::Display for CommFusion {
    /// `auto`, `size:32`, `index:20,35`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommFusion::Auto => f.write_str("auto"),
            _ => write!(f, "{}:{}", self.mode(), self.config_text()),
        }
    }
}

impl FromStr for CommFusion {
    type Err = ParallelContextError;
    /// Parses `auto`, `size:MB` or `index:I,J,...`, and validates the result.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        const KEY: &str = "comm_fusion.allreduce.config";
        let (mode, config) = match s.split_once(':') {
            Some((m, c)) => (m.trim(), Some(c.trim())),
            None => (s.trim(), None),
        };
        let fusion = match (mode, config) {
            ("auto", None) => CommFusion::Auto,
            ("auto", Some(c)) => {
                return Err(ParallelContextError::invalid(
                    KEY,
                    c,
                    "mode `auto` takes no config (it fuses 64 MB buckets)",
                ))
            }
            ("size", Some(c)) => CommFusion::Size(c.parse::<f64>().map_err(|_| {
                ParallelContextError::invalid(KEY, c, "expected a size in MB, as in `size:32`")
            })?),
            ("index", Some(c)) => CommFusion::Index(
                c.split(',')
                    .map(|x| x.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| {
                        ParallelContextError::invalid(
                            KEY,
                            c,
                            "expected non-negative parameter indices, as in `index:20,35`",
                        )
                    })?,
            ),
            ("size" | "index", None) => {
                return Err(ParallelContextError::invalid(
                    "comm_fusion",
                    s,
                    format!("mode `{mode}` needs a config, as in `size:32` or `index:20,35`"),
                ))
            }
            _ => {
                return Err(ParallelContextError::unknown_name(
                    "comm_fusion.allreduce.mode",
                    mode,
                    Self::MODES,
                ))
            }
        };
        fusion.validate()?;
        Ok(fusion)
    }
}

const KIB: u64 = 1024;
const UNITS: &[(&str, u64)] = &[
    ("TB", KIB * KIB * KIB * KIB),
    ("GB", KIB * KIB * KIB),
    ("MB", KIB * KIB),
    ("KB", KIB),
    ("B", 1),
];

/// Parses a memory size such as `16GB`, `512MB`, `3.5GB` or `1024` (bytes) into bytes. Units
/// are binary as in MindSpore (`1GB` = 2^30 bytes), case-insensitive (`KB`, `MB`, `GB`, `TB`,
/// also `KiB`..`TiB`, `B`); the size must be greater than 0.
pub fn parse_memory_size(text: &str) -> Result<u64, ParallelContextError> {
    const KEY: &str = "max_device_memory";
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let unit_upper = unit.to_ascii_uppercase().replace("IB", "B");
    let multiplier = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit_upper)
            .map(|(_, m)| *m)
            .ok_or_else(|| {
                ParallelContextError::invalid(
                    KEY,
                    text,
                    format!("unknown unit `{unit}`; valid units: B, KB, MB, GB, TB"),
                )
            })?
    };
    let bad_number =
        || ParallelContextError::invalid(KEY, text, "expected a size such as `16GB` or `512MB`");
    let bytes = if number.contains('.') {
        let x: f64 = number.parse().map_err(|_| bad_number())?;
        let b = (x * multiplier as f64).round();
        if !(b.is_finite() && b < u64::MAX as f64) {
            return Err(ParallelContextError::invalid(KEY, text, "size too large"));
        }
        b as u64
    } else {
        let n: u64 = number.parse().map_err(|_| bad_number())?;
        n.checked_mul(multiplier)
            .ok_or_else(|| ParallelContextError::invalid(KEY, text, "size too large"))?
    };
    if bytes == 0 {
        return Err(ParallelContextError::invalid(
            KEY,
            text,
            "must be greater than 0",
        ));
    }
    Ok(bytes)
}

/// Formats bytes in the largest unit that divides them exactly: `16GB`, `3584MB`, `100B`.
/// [`parse_memory_size`] reads the result back to the same number.
pub fn format_memory_size(bytes: u64) -> String {
    for (unit, m) in UNITS {
        if bytes > 0 && bytes % m == 0 {
            return format!("{}{unit}", bytes / m);
        }
    }
    format!("{bytes}B")
}

/// MindSpore's `set_auto_parallel_context` options. [`Default`] is MindSpore's default:
/// `stand_alone` on one device, rank 0, `gradients_mean` false.
#[derive(Clone, Debug, PartialEq)]
pub struct ParallelContext {
    /// How the graph is distributed.
    pub parallel_mode: ParallelMode,
    /// How `auto_parallel` searches strategies.
    pub search_mode: SearchMode,
    /// The number of devices (at least 1).
    pub device_num: usize,
    /// This process's rank, below `device_num`.
    pub global_rank: usize,
    /// Whether the all-reduced gradients are averaged (true) or summed (false).
    pub gradients_mean: bool,
    /// How the dataset's inputs are split.
    pub dataset_strategy: DatasetStrategy,
    /// Where strategies are saved and loaded.
    pub strategy_ckpt_config: StrategyCkptConfig,
    /// Whether redistribution may use AllToAll.
    pub enable_alltoall: bool,
    /// Gradient all-reduce fusion.
    pub comm_fusion: CommFusion,
    /// The device memory limit in bytes, if any.
    pub max_device_memory: Option<u64>,
    /// `pipeline_stages` (1: no pipeline), `micro_size` (MindSpore's
    /// `PipelineCell(net, micro_size)`) and `pipeline_config.pipeline_scheduler`.
    pub pipeline: PipelineOptions,
    /// MindSpore's parallel optimizer: split weights and optimizer state over their
    /// data-parallel group (ZeRO-1; default false).
    pub enable_parallel_optimizer: bool,
    /// Its settings (`parallel_optimizer_config`).
    pub parallel_optimizer_config: ParallelOptimizerConfig,
    /// `auto_pipeline` (Alpa's `stage_option="auto"`; default false): in `auto_parallel`, the
    /// stage planner chooses the pipeline stages and the layer split, the micro-batches,
    /// optimizer sharding and recompute (`crate::auto_pipeline`). Excludes an explicit
    /// `pipeline_stages` / `micro_size` other than 1 and `enable_parallel_optimizer`.
    pub auto_pipeline: bool,
}

/// MindSpore's `parallel_optimizer_config`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParallelOptimizerConfig {
    /// `gradient_accumulation_shard` (default true): keep accumulated gradients split too
    /// (only matters with gradient accumulation over micro-batches).
    pub gradient_accumulation_shard: bool,
    /// `parallel_optimizer_threshold`: weights under this many KB stay whole (default 64).
    pub parallel_optimizer_threshold: u64,
    /// `optimizer_weight_shard_size`: -1 (default) splits over the whole data-parallel group,
    /// else over this many devices of it (more than 1, dividing the group).
    pub optimizer_weight_shard_size: i64,
}

impl Default for ParallelOptimizerConfig {
    fn default() -> Self {
        ParallelOptimizerConfig {
            gradient_accumulation_shard: true,
            parallel_optimizer_threshold: 64,
            optimizer_weight_shard_size: -1,
        }
    }
}

impl Default for ParallelContext {
    fn default() -> Self {
        ParallelContext {
            parallel_mode: ParallelMode::StandAlone,
            search_mode: SearchMode::ShardingPropagation,
            device_num: 1,
            global_rank: 0,
            gradients_mean: false,
            dataset_strategy: DatasetStrategy::DataParallel,
            strategy_ckpt_config: StrategyCkptConfig::default(),
            enable_alltoall: false,
            comm_fusion: CommFusion::Auto,
            max_device_memory: None,
            enable_parallel_optimizer: false,
            parallel_optimizer_config: ParallelOptimizerConfig::default(),
            pipeline: PipelineOptions::default(),
            auto_pipeline: false,
        }
    }
}

/// The top-level TOML keys.
pub const TOP_LEVEL_KEYS: &[&str] = &[
    "parallel_mode",
    "search_mode",
    "device_num",
    "global_rank",
    "gradients_mean",
    "dataset_strategy",
    "enable_alltoall",
    "max_device_memory",
    "strategy_ckpt_config",
    "comm_fusion",
    "enable_parallel_optimizer",
    "parallel_optimizer_config",
    "pipeline_stages",
    "micro_size",
    "pipeline_config",
    "auto_pipeline",
];
const PARALLEL_OPTIMIZER_KEYS: &[&str] = &[
    "gradient_accumulation_shard",
    "parallel_optimizer_threshold",
    "optimizer_weight_shard_size",
];
const PIPELINE_CONFIG_KEYS: &[&str] = &["pipeline_scheduler"];
const CKPT_KEYS: &[&str] = &["save_file", "load_file", "only_trainable_params"];
const COMM_FUSION_KEYS: &[&str] = &["allreduce"];
const ALLREDUCE_KEYS: &[&str] = &["mode", "config"];

impl ParallelContext {
    /// Whether the graph is distributed: any mode but `stand_alone` (`stand_alone` with
    /// `device_num > 1` is allowed, and runs the same graph on every device).
    pub fn is_parallel(&self) -> bool {
        self.parallel_mode != ParallelMode::StandAlone
    }

    /// Checks the options together: `device_num >= 1`, `global_rank < device_num`, an explicit
    /// dataset strategy has at least one input and only positive splits, the fusion size is
    /// positive, fusion indices strictly increase, the memory limit is positive; the pipeline
    /// options as [`PipelineOptions::validate`] (several stages need a parallel mode, divide
    /// `device_num`, and `micro_size >= pipeline_stages`); `auto_pipeline` only in
    /// `auto_parallel`, without an explicit pipeline or `enable_parallel_optimizer`.
    pub fn validate(&self) -> Result<(), ParallelContextError> {
        if self.device_num == 0 {
            return Err(ParallelContextError::invalid(
                "device_num",
                0,
                "must be at least 1",
            ));
        }
        if self.global_rank >= self.device_num {
            return Err(ParallelContextError::invalid(
                "global_rank",
                self.global_rank,
                format!("must be less than device_num ({})", self.device_num),
            ));
        }
        if let DatasetStrategy::Explicit(s) = &self.dataset_strategy {
            if s.0.is_empty() {
                return Err(ParallelContextError::invalid(
                    "dataset_strategy",
                    s,
                    "an explicit strategy needs at least one input",
                ));
            }
            for (i, dims) in s.0.iter().enumerate() {
                if let Some((d, v)) = dims.iter().enumerate().find(|(_, v)| **v <= 0) {
                    return Err(ParallelContextError::invalid(
                        "dataset_strategy",
                        s,
                        format!("split {v} of input {i}, dimension {d} is not positive"),
                    ));
                }
            }
        }
        self.comm_fusion.validate()?;
        if self.max_device_memory == Some(0) {
            return Err(ParallelContextError::invalid(
                "max_device_memory",
                "0B",
                "must be greater than 0",
            ));
        }
        let size = self.parallel_optimizer_config.optimizer_weight_shard_size;
        if size != -1 && (size <= 1 || self.device_num % size as usize != 0) {
            return Err(ParallelContextError::invalid(
                "parallel_optimizer_config.optimizer_weight_shard_size",
                size,
                format!(
                    "must be -1 (the whole data-parallel group) or a divisor of device_num ({}) \
                     greater than 1",
                    self.device_num
                ),
            ));
        }
        if self.auto_pipeline {
            self.validate_auto_pipeline()?;
        }
        let devices = self.is_parallel().then_some(self.device_num);
        self.pipeline.validate(devices).map_err(|e| {
            let key = if e.reason.starts_with("micro_size") {
                ("micro_size", self.pipeline.micro_size)
            } else {
                ("pipeline_stages", self.pipeline.stages)
            };
            ParallelContextError::invalid(key.0, key.1, e.reason)
        })?;
        Ok(())
    }

    /// `auto_pipeline = true` needs `parallel_mode = "auto_parallel"` and leaves the
    /// pipeline and optimizer sharding to the planner: an explicit `pipeline_stages` or
    /// `micro_size` other than 1, or `enable_parallel_optimizer`, is an error naming both keys.
    fn validate_auto_pipeline(&self) -> Result<(), ParallelContextError> {
        if self.parallel_mode != ParallelMode::AutoParallel {
            return Err(ParallelContextError::invalid(
                "auto_pipeline",
                true,
                format!(
                    "needs parallel_mode `auto_parallel`, not `{}` (the stage planner chooses \
                     the pipeline only in auto_parallel)",
                    self.parallel_mode
                ),
            ));
        }
        for (key, value) in [
            ("pipeline_stages", self.pipeline.stages),
            ("micro_size", self.pipeline.micro_size),
        ] {
            if value != 1 {
                return Err(ParallelContextError::invalid(
                    "auto_pipeline",
                    true,
                    format!(
                        "the stage planner chooses {key}, so {key} must be left at 1, not \
                         {value}"
                    ),
                ));
            }
        }
        if self.enable_parallel_optimizer {
            return Err(ParallelContextError::invalid(
                "auto_pipeline",
                true,
                "the stage planner chooses optimizer sharding, so enable_parallel_optimizer \
                 must be left false, not true",
            ));
        }
        Ok(())
    }

    /// Reads and validates a context from TOML text; absent keys keep MindSpore's defaults.
    /// Errors carry the line of the offending key.
    pub fn from_toml_str(text: &str) -> Result<ParallelContext, ParallelContextError> {
        let ctx = ParallelSettings::from_toml_str(text)?.resolve();
        ctx.validate().map_err(|e| locate(text, None, e))?;
        Ok(ctx)
    }

    /// Reads and validates a context from a TOML file; errors carry the file name and line.
    pub fn from_toml_file(path: &Path) -> Result<ParallelContext, ParallelContextError> {
        let text = read_file(path)?;
        let ctx = ParallelSettings::parse(&text, Some(path))?.resolve();
        ctx.validate().map_err(|e| locate(&text, Some(path), e))?;
        Ok(ctx)
    }

    /// Writes every option as TOML (absent files and memory limit, and the pipeline options
    /// when they are the defaults, are left out);
    /// [`ParallelContext::from_toml_str`] reads it back to an equal context. Paths that are
    /// not UTF-8 are written lossily.
    pub fn to_toml_string(&self) -> String {
        use toml::Value;
        let s = |x: &str| Value::String(x.to_string()).to_string();
        let int = |x: usize| Value::Integer(i64::try_from(x).unwrap_or(i64::MAX)).to_string();
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k} = {v}\n"));
        line("parallel_mode", s(self.parallel_mode.as_str()));
        line("search_mode", s(self.search_mode.as_str()));
        line("device_num", int(self.device_num));
        line("global_rank", int(self.global_rank));
        line("gradients_mean", self.gradients_mean.to_string());
        let dataset = match &self.dataset_strategy {
            DatasetStrategy::Explicit(st) => Value::Array(
                st.0.iter()
                    .map(|d| Value::Array(d.iter().map(|&x| Value::Integer(x)).collect()))
                    .collect(),
            )
            .to_string(),
            other => s(&other.to_string()),
        };
        line("dataset_strategy", dataset);
        line("enable_alltoall", self.enable_alltoall.to_string());
        if let Some(m) = self.max_device_memory {
            line("max_device_memory", s(&format_memory_size(m)));
        }
        line(
            "enable_parallel_optimizer",
            self.enable_parallel_optimizer.to_string(),
        );
        if self.auto_pipeline {
            line("auto_pipeline", "true".into());
        }
        if self.pipeline != PipelineOptions::default() {
            line("pipeline_stages", int(self.pipeline.stages));
            line("micro_size", int(self.pipeline.micro_size));
        }
        out.push_str("\n[strategy_ckpt_config]\n");
        let ckpt = &self.strategy_ckpt_config;
        for (key, file) in [
            ("save_file", &ckpt.save_file),
            ("load_file", &ckpt.load_file),
        ] {
            if let Some(p) = file {
                out.push_str(&format!("{key} = {}\n", s(&p.to_string_lossy())));
            }
        }
        out.push_str(&format!(
            "only_trainable_params = {}\n",
            ckpt.only_trainable_params
        ));
        out.push_str("\n[comm_fusion.allreduce]\n");
        out.push_str(&format!("mode = {}\n", s(self.comm_fusion.mode())));
        match &self.comm_fusion {
            CommFusion::Auto => {}
            CommFusion::Size(mb) => {
                out.push_str(&format!("config = {}\n", Value::Float(*mb)));
            }
            CommFusion::Index(ix) => {
                let list = ix.iter().map(|&i| int(i)).collect::<Vec<_>>().join(", ");
                out.push_str(&format!("config = [{list}]\n"));
            }
        }
        let po = &self.parallel_optimizer_config;
        out.push_str(&format!(
            "\n[parallel_optimizer_config]\ngradient_accumulation_shard = {}\n\
             parallel_optimizer_threshold = {}\noptimizer_weight_shard_size = {}\n",
            po.gradient_accumulation_shard,
            po.parallel_optimizer_threshold,
            po.optimizer_weight_shard_size
        ));
        if self.pipeline != PipelineOptions::default() {
            out.push_str("\n[pipeline_config]\n");
            out.push_str(&format!(
                "pipeline_scheduler = {}\n",
                s(self.pipeline.scheduler.name())
            ));
        }
        out
    }
}

/// Every option of a [`ParallelContext`], each optional: what one source (a TOML file, the
/// command line) sets. Layer sources with [`ParallelSettings::override_with`], then
/// [`ParallelSettings::resolve`] onto the defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ParallelSettings {
    /// `parallel_mode`.
    pub parallel_mode: Option<ParallelMode>,
    /// `search_mode`.
    pub search_mode: Option<SearchMode>,
    /// `device_num`.
    pub device_num: Option<usize>,
    /// `global_rank`.
    pub global_rank: Option<usize>,
    /// `gradients_mean`.
    pub gradients_mean: Option<bool>,
    /// `dataset_strategy`.
    pub dataset_strategy: Option<DatasetStrategy>,
    /// `enable_alltoall`.
    pub enable_alltoall: Option<bool>,
    /// `max_device_memory`, in bytes.
    pub max_device_memory: Option<u64>,
    /// `strategy_ckpt_config.save_file`.
    pub strategy_ckpt_save_file: Option<PathBuf>,
    /// `strategy_ckpt_config.load_file`.
    pub strategy_ckpt_load_file: Option<PathBuf>,
    /// `strategy_ckpt_config.only_trainable_params`.
    pub strategy_ckpt_only_trainable_params: Option<bool>,
    /// `comm_fusion.allreduce`.
    pub comm_fusion: Option<CommFusion>,
    /// `enable_parallel_optimizer`.
    pub enable_parallel_optimizer: Option<bool>,
    /// `parallel_optimizer_config.gradient_accumulation_shard`.
    pub gradient_accumulation_shard: Option<bool>,
    /// `parallel_optimizer_config.parallel_optimizer_threshold` (KB).
    pub parallel_optimizer_threshold: Option<u64>,
    /// `parallel_optimizer_config.optimizer_weight_shard_size`.
    pub optimizer_weight_shard_size: Option<i64>,
    /// `pipeline_stages`.
    pub pipeline_stages: Option<usize>,
    /// `micro_size`.
    pub micro_size: Option<usize>,
    /// `pipeline_config.pipeline_scheduler`.
    pub pipeline_scheduler: Option<Scheduler>,
    /// `auto_pipeline`.
    pub auto_pipeline: Option<bool>,
}

impl ParallelSettings {
    /// Reads the options a TOML text sets (not validated together: see
    /// [`ParallelContext::validate`]). Errors carry the line of the offending key.
    pub fn from_toml_str(text: &str) -> Result<ParallelSettings, ParallelContextError> {
        Self::parse(text, None)
    }

    /// Reads the options a TOML file sets; errors carry the file name and line.
    pub fn from_toml_file(path: &Path) -> Result<ParallelSettings, ParallelContextError> {
        let text = read_file(path)?;
        Self::parse(&text, Some(path))
    }

    fn parse(text: &str, file: Option<&Path>) -> Result<ParallelSettings, ParallelContextError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let e = ParallelContextError::Syntax(e);
            match file {
                Some(_) => ParallelContextError::Located {
                    file: file.map(Path::to_path_buf),
                    line: None,
                    error: Box::new(e),
                },
                None => e,
            }
        })?;
        Self::from_table(&table).map_err(|e| locate(text, file, e))
    }

    fn from_table(table: &toml::Table) -> Result<ParallelSettings, ParallelContextError> {
        let mut s = ParallelSettings::default();
        for (key, value) in table {
            match key.as_str() {
                "parallel_mode" => s.parallel_mode = Some(str_of(key, value)?.parse()?),
                "search_mode" => s.search_mode = Some(str_of(key, value)?.parse()?),
                "device_num" => s.device_num = Some(usize_of(key, value)?),
                "global_rank" => s.global_rank = Some(usize_of(key, value)?),
                "gradients_mean" => s.gradients_mean = Some(bool_of(key, value)?),
                "enable_alltoall" => s.enable_alltoall = Some(bool_of(key, value)?),
                "dataset_strategy" => s.dataset_strategy = Some(dataset_of(key, value)?),
                "max_device_memory" => s.max_device_memory = Some(memory_of(key, value)?),
                "strategy_ckpt_config" => {
                    for (k, v) in table_of(key, value, CKPT_KEYS)? {
                        let path = format!("{key}.{k}");
                        match k.as_str() {
                            "save_file" => {
                                s.strategy_ckpt_save_file = Some(str_of(&path, v)?.into())
                            }
                            "load_file" => {
                                s.strategy_ckpt_load_file = Some(str_of(&path, v)?.into())
                            }
                            _ => s.strategy_ckpt_only_trainable_params = Some(bool_of(&path, v)?),
                        }
                    }
                }
                "comm_fusion" => {
                    if let Some(v) = table_of(key, value, COMM_FUSION_KEYS)?.get("allreduce") {
                        let path = format!("{key}.allreduce");
                        s.comm_fusion =
                            Some(comm_fusion_of(&path, table_of(&path, v, ALLREDUCE_KEYS)?)?);
                    }
                }
                "enable_parallel_optimizer" => {
                    s.enable_parallel_optimizer = Some(bool_of(key, value)?)
                }
                "parallel_optimizer_config" => {
                    for (k, v) in table_of(key, value, PARALLEL_OPTIMIZER_KEYS)? {
                        let path = format!("{key}.{k}");
                        match k.as_str() {
                            "gradient_accumulation_shard" => {
                                s.gradient_accumulation_shard = Some(bool_of(&path, v)?)
                            }
                            "parallel_optimizer_threshold" => {
                                s.parallel_optimizer_threshold = Some(usize_of(&path, v)? as u64)
                            }
                            _ => {
                                s.optimizer_weight_shard_size =
                                    Some(v.as_integer().ok_or_else(|| {
                                        wrong_type(&path, "an integer (-1 or a group size)", v)
                                    })?)
                            }
                        }
                    }
                }
                "pipeline_stages" => s.pipeline_stages = Some(usize_of(key, value)?),
                "micro_size" => s.micro_size = Some(usize_of(key, value)?),
                "auto_pipeline" => s.auto_pipeline = Some(bool_of(key, value)?),
                "pipeline_config" => {
                    if let Some(v) =
                        table_of(key, value, PIPELINE_CONFIG_KEYS)?.get("pipeline_scheduler")
                    {
                        let path = format!("{key}.pipeline_scheduler");
                        let name = str_of(&path, v)?;
                        s.pipeline_scheduler =
                            Some(Scheduler::from_name(name).ok_or_else(|| {
                                ParallelContextError::invalid(&path, name, "expected 1f1b or gpipe")
                            })?);
                    }
                }
                _ => return Err(unknown_key(key, TOP_LEVEL_KEYS)),
            }
        }
        Ok(s)
    }

    /// `self` with every option that `over` sets replaced by `over`'s value.
    pub fn override_with(self, over: ParallelSettings) -> ParallelSettings {
        ParallelSettings {
            parallel_mode: over.parallel_mode.or(self.parallel_mode),
            search_mode: over.search_mode.or(self.search_mode),
            device_num: over.device_num.or(self.device_num),
            global_rank: over.global_rank.or(self.global_rank),
            gradients_mean: over.gradients_mean.or(self.gradients_mean),
            dataset_strategy: over.dataset_strategy.or(self.dataset_strategy),
            enable_alltoall: over.enable_alltoall.or(self.enable_alltoall),
            max_device_memory: over.max_device_memory.or(self.max_device_memory),
            strategy_ckpt_save_file: over
                .strategy_ckpt_save_file
                .or(self.strategy_ckpt_save_file),
            strategy_ckpt_load_file: over
                .strategy_ckpt_load_file
                .or(self.strategy_ckpt_load_file),
            strategy_ckpt_only_trainable_params: over
                .strategy_ckpt_only_trainable_params
                .or(self.strategy_ckpt_only_trainable_params),
            comm_fusion: over.comm_fusion.or(self.comm_fusion),
            enable_parallel_optimizer: over
                .enable_parallel_optimizer
                .or(self.enable_parallel_optimizer),
            gradient_accumulation_shard: over
                .gradient_accumulation_shard
                .or(self.gradient_accumulation_shard),
            parallel_optimizer_threshold: over
                .parallel_optimizer_threshold
                .or(self.parallel_optimizer_threshold),
            optimizer_weight_shard_size: over
                .optimizer_weight_shard_size
                .or(self.optimizer_weight_shard_size),
            pipeline_stages: over.pipeline_stages.or(self.pipeline_stages),
            micro_size: over.micro_size.or(self.micro_size),
            pipeline_scheduler: over.pipeline_scheduler.or(self.pipeline_scheduler),
            auto_pipeline: over.auto_pipeline.or(self.auto_pipeline),
        }
    }

    /// The context: MindSpore's defaults with every option set here applied (not validated).
    pub fn resolve(&self) -> ParallelContext {
        let d = ParallelContext::default();
        let ckpt = StrategyCkptConfig::default();
        ParallelContext {
            parallel_mode: self.parallel_mode.unwrap_or(d.parallel_mode),
            search_mode: self.search_mode.unwrap_or(d.search_mode),
            device_num: self.device_num.unwrap_or(d.device_num),
            global_rank: self.global_rank.unwrap_or(d.global_rank),
            gradients_mean: self.gradients_mean.unwrap_or(d.gradients_mean),
            dataset_strategy: self.dataset_strategy.clone().unwrap_or(d.dataset_strategy),
            strategy_ckpt_config: StrategyCkptConfig {
                save_file: self.strategy_ckpt_save_file.clone(),
                load_file: self.strategy_ckpt_load_file.clone(),
                only_trainable_params: self
                    .strategy_ckpt_only_trainable_params
                    .unwrap_or(ckpt.only_trainable_params),
            },
            enable_alltoall: self.enable_alltoall.unwrap_or(d.enable_alltoall),
            comm_fusion: self.comm_fusion.clone().unwrap_or(d.comm_fusion),
            max_device_memory: self.max_device_memory.or(d.max_device_memory),
            enable_parallel_optimizer: self
                .enable_parallel_optimizer
                .unwrap_or(d.enable_parallel_optimizer),
            parallel_optimizer_config: ParallelOptimizerConfig {
                gradient_accumulation_shard: self
                    .gradient_accumulation_shard
                    .unwrap_or(d.parallel_optimizer_config.gradient_accumulation_shard),
                parallel_optimizer_threshold: self
                    .parallel_optimizer_threshold
                    .unwrap_or(d.parallel_optimizer_config.parallel_optimizer_threshold),
                optimizer_weight_shard_size: self
                    .optimizer_weight_shard_size
                    .unwrap_or(d.parallel_optimizer_config.optimizer_weight_shard_size),
            },
            pipeline: PipelineOptions {
                stages: self.pipeline_stages.unwrap_or(d.pipeline.stages),
                micro_size: self.micro_size.unwrap_or(d.pipeline.micro_size),
                scheduler: self.pipeline_scheduler.unwrap_or(d.pipeline.scheduler),
            },
            auto_pipeline: self.auto_pipeline.unwrap_or(d.auto_pipeline),
        }
    }
}

fn read_file(path: &Path) -> Result<String, ParallelContextError> {
    std::fs::read_to_string(path).map_err(|source| ParallelContextError::Read {
        path: path.to_path_buf(),
        error: source,
    })
}

/// Wraps `e` with the file and the line of its key in `text` (when the key is in the text).
fn locate(text: &str, file: Option<&Path>, e: ParallelContextError) -> ParallelContextError {
    let line = e.key().and_then(|k| line_of(text, k));
    if file.is_none() && line.is_none() {
        return e;
    }
    ParallelContextError::Located {
        file: file.map(Path::to_path_buf),
        line,
        error: Box::new(e),
    }
}

/// The 1-based line of the dotted key `path` in the TOML `text`, if present.
fn line_of(text: &str, path: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let mut table = doc.get_ref();
    let mut segments = path.split('.').peekable();
    while let Some(seg) = segments.next() {
        let (k, v) = table.iter().find(|(k, _)| k.get_ref().as_ref() == seg)?;
        if segments.peek().is_none() {
            let start = k.span().start.min(text.len());
            return Some(text.get(..start)?.matches('\n').count() + 1);
        }
        table = v.get_ref().as_table()?;
    }
    None
}

fn unknown_key(key: &str, valid: &[&str]) -> ParallelContextError {
    let leaf = key.rsplit('.').next().unwrap_or(key);
    ParallelContextError::UnknownKey {
        key: key.to_string(),
        valid: valid.join(", "),
        hint: did_you_mean(leaf, valid),
    }
}

fn wrong_type(key: &str, expected: &str, value: &toml::Value) -> ParallelContextError {
    ParallelContextError::WrongType {
        key: key.to_string(),
        expected: expected.to_string(),
        found: value.type_str().to_string(),
    }
}

fn str_of<'a>(key: &str, value: &'a toml::Value) -> Result<&'a str, ParallelContextError> {
    value
        .as_str()
        .ok_or_else(|| wrong_type(key, "a string", value))
}

fn bool_of(key: &str, value: &toml::Value) -> Result<bool, ParallelContextError> {
    value
        .as_bool()
        .ok_or_else(|| wrong_type(key, "a boolean (true or false)", value))
}

fn usize_of(key: &str, value: &toml::Value) -> Result<usize, ParallelContextError> {
    let i = value
        .as_integer()
        .ok_or_else(|| wrong_type(key, "a non-negative integer", value))?;
    usize::try_from(i)
        .map_err(|_| ParallelContextError::invalid(key, i, "must be a non-negative integer"))
}

fn table_of<'a>(
    key: &str,
    value: &'a toml::Value,
    valid: &[&str],
) -> Result<&'a toml::Table, ParallelContextError> {
    let t = value
        .as_table()
        .ok_or_else(|| wrong_type(key, "a table", value))?;
    match t.keys().find(|k| !valid.contains(&k.as_str())) {
        Some(k) => Err(unknown_key(&format!("{key}.{k}"), valid)),
        None => Ok(t),
    }
}

fn dataset_of(key: &str, value: &toml::Value) -> Result<DatasetStrategy, ParallelContextError> {
    const EXPECTED: &str = "\"data_parallel\", \"full_batch\" or an array of arrays of integers";
    match value {
        toml::Value::String(s) => s.parse(),
        toml::Value::Array(inputs) => {
            let mut strategy = Vec::with_capacity(inputs.len());
            for input in inputs {
                let dims = input
                    .as_array()
                    .ok_or_else(|| wrong_type(key, EXPECTED, input))?;
                strategy.push(
                    dims.iter()
                        .map(|d| d.as_integer().ok_or_else(|| wrong_type(key, EXPECTED, d)))
                        .collect::<Result<Vec<i64>, _>>()?,
                );
            }
            Ok(DatasetStrategy::Explicit(Strategy(strategy)))
        }
        other => Err(wrong_type(key, EXPECTED, other)),
    }
}

fn memory_of(key: &str, value: &toml::Value) -> Result<u64, ParallelContextError> {
    match value {
        toml::Value::String(s) => parse_memory_size(s),
        toml::Value::Integer(i) if *i > 0 => Ok(*i as u64),
        toml::Value::Integer(i) => Err(ParallelContextError::invalid(
            key,
            i,
            "must be greater than 0",
        )),
        other => Err(wrong_type(
            key,
            "a size such as \"16GB\", or an integer number of bytes",
            other,
        )),
    }
}

fn comm_fusion_of(key: &str, t: &toml::Table) -> Result<CommFusion, ParallelContextError> {
    let mode_key = format!("{key}.mode");
    let config_key = format!("{key}.config");
    let mode = match t.get("mode") {
        Some(v) => str_of(&mode_key, v)?,
        None => {
            return Err(ParallelContextError::MissingKey {
                key: mode_key,
                reason: "`auto`, `size` or `index` is required in [comm_fusion.allreduce]".into(),
            })
        }
    };
    let config = t.get("config");
    let fusion = match (mode, config) {
        ("auto", None) => CommFusion::Auto,
        ("auto", Some(v)) => {
            return Err(ParallelContextError::invalid(
                &config_key,
                v,
                "mode `auto` takes no config (it fuses 64 MB buckets)",
            ))
        }
        ("size", Some(v)) => CommFusion::Size(match v {
            toml::Value::Integer(i) => *i as f64,
            toml::Value::Float(f) => *f,
            other => return Err(wrong_type(&config_key, "a size in MB", other)),
        }),
        ("index", Some(v)) => {
            const EXPECTED: &str = "an array of parameter indices";
            let list = v
                .as_array()
                .ok_or_else(|| wrong_type(&config_key, EXPECTED, v))?;
            let mut ix = Vec::with_capacity(list.len());
            for x in list {
                let i = x
                    .as_integer()
                    .ok_or_else(|| wrong_type(&config_key, EXPECTED, x))?;
                ix.push(usize::try_from(i).map_err(|_| {
                    ParallelContextError::invalid(&config_key, v, "indices must be non-negative")
                })?);
            }
            CommFusion::Index(ix)
        }
        ("size" | "index", None) => {
            return Err(ParallelContextError::MissingKey {
                key: config_key,
                reason: format!("mode `{mode}` needs a config"),
            })
        }
        _ => {
            return Err(ParallelContextError::unknown_name(
                &mode_key,
                mode,
                CommFusion::MODES,
            ))
        }
    };
    Ok(fusion)
}
