//! The binary form of a graph: a header (magic `SHARDCG\0`, then the format version as a
//! little-endian `u32`) followed by the graph in bincode 2's serde encoding
//! (`bincode::config::standard()`).
//!
//! Attribute values are recursive (`Attr::Tuple` holds attributes); on the wire they are
//! flattened into a postfix token list so that decoding never recurses, and nesting deeper
//! than [`crate::text::MAX_NESTING`] is refused both ways. Decoding runs under a byte limit
//! proportional to the input's length, so a corrupt length prefix cannot make it allocate
//! much more than the input's size. Decoding never panics on any input.

use crate::attr::{Attr, Attrs, Strategy};
use crate::graph::{Graph, Node, Operand, Param};
use crate::op::OpKind;
use crate::text::MAX_NESTING;
use crate::types::Type;
use serde::{Deserialize, Serialize};

/// The first bytes of every binary graph.
pub const MAGIC: [u8; 8] = *b"SHARDCG\0";

/// The version of the binary format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Length of the header: magic and version.
const HEADER_LEN: usize = MAGIC.len() + 4;

/// Payloads larger than this are refused (a graph holds no tensor data; real ones are a few
/// megabytes at most).
pub const MAX_PAYLOAD: usize = 256 << 20;

/// Why a graph could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum BinaryError {
    /// The data does not start with [`MAGIC`].
    #[error("not a shardc graph: the data does not start with the magic bytes \"SHARDCG\\0\"")]
    BadMagic,
    /// The data is shorter than the header.
    #[error("truncated shardc graph: {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    Truncated {
        /// Length of the data.
        len: usize,
    },
    /// The header names a format version this build cannot read.
    #[error(
        "shardc graph format version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The version in the header.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The payload is larger than [`MAX_PAYLOAD`].
    #[error("shardc graph too large: {len} bytes (at most {MAX_PAYLOAD})")]
    TooLarge {
        /// Length of the payload.
        len: usize,
    },
    /// bincode could not encode the graph.
    #[error("cannot encode the graph: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// bincode could not decode the payload.
    #[error("corrupt shardc graph: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// The payload decoded but bytes remain after it.
    #[error("corrupt shardc graph: {extra} bytes after the end of the graph")]
    TrailingBytes {
        /// Number of unread bytes.
        extra: usize,
    },
    /// An attribute value is malformed or nests too deeply.
    #[error("attribute `{key}` of node %{node}: {reason}")]
    BadAttr {
        /// 1-based node number, as printed.
        node: usize,
        /// The attribute's key.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

/// One token of a flattened attribute value, in postfix order: a container token follows its
/// elements and says how many of the values before it it takes.
#[derive(Serialize, Deserialize)]
enum AttrTok {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Tuple(u32),
    List(u32),
}

type WireAttrs = Vec<(String, Vec<AttrTok>)>;

#[derive(Serialize, Deserialize)]
struct WireNode {
    op: OpKind,
    inputs: Vec<Operand>,
    attrs: WireAttrs,
    cnode_attrs: WireAttrs,
    ty: Type,
    name: String,
    instance: String,
    scope: String,
    in_strategy: Option<Strategy>,
    out_strategy: Option<Strategy>,
    comments: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct WireGraph {
    name: String,
    params: Vec<Param>,
    nodes: Vec<WireNode>,
    outputs: Vec<Operand>,
}

/// A node on the wire (`i` numbers it in messages).
fn wire_node(i: usize, n: &Node) -> Result<WireNode, BinaryError> {
    // Destructured so that a new field of `Node` does not go unnoticed here.
    let Node {
        op,
        inputs,
        attrs,
        cnode_attrs,
        ty,
        name,
        instance,
        scope,
        in_strategy,
        out_strategy,
        comments,
    } = n;
    Ok(WireNode {
        op: *op,
        inputs: inputs.clone(),
        attrs: flatten_attrs(i, attrs)?,
        cnode_attrs: flatten_attrs(i, cnode_attrs)?,
        ty: ty.clone(),
        name: name.clone(),
        instance: instance.clone(),
        scope: scope.clone(),
        in_strategy: in_strategy.clone(),
        out_strategy: out_strategy.clone(),
        comments: comments.clone(),
    })
}

/// A node off the wire.
fn node_of(i: usize, n: WireNode) -> Result<Node, BinaryError> {
    Ok(Node {
        op: n.op,
        inputs: n.inputs,
        attrs: unflatten_attrs(i, n.attrs)?,
        cnode_attrs: unflatten_attrs(i, n.cnode_attrs)?,
        ty: n.ty,
        name: n.name,
        instance: n.instance,
        scope: n.scope,
        in_strategy: n.in_strategy,
        out_strategy: n.out_strategy,
        comments: n.comments,
    })
}

fn wire_graph(g: &Graph) -> Result<WireGraph, BinaryError> {
    let nodes = g
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| wire_node(i, n))
        .collect::<Result<_, _>>()?;
    Ok(WireGraph {
        name: g.name.clone(),
        params: g.params.clone(),
        nodes,
        outputs: g.outputs.clone(),
    })
}

fn graph_of(wire: WireGraph) -> Result<Graph, BinaryError> {
    let nodes = wire
        .nodes
        .into_iter()
        .enumerate()
        .map(|(i, n)| node_of(i, n))
        .collect::<Result<_, _>>()?;
    Ok(Graph {
        name: wire.name,
        params: wire.params,
        nodes,
        outputs: wire.outputs,
    })
}

/// The header and the bincode payload of `wire`.
fn frame<T: Serialize>(magic: &[u8; 8], version: u32, wire: &T) -> Result<Vec<u8>, BinaryError> {
    let payload = bincode::serde::encode_to_vec(wire, bincode::config::standard())?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(magic);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Encodes a graph: header, then the bincode payload.
pub fn encode_graph(g: &Graph) -> Result<Vec<u8>, BinaryError> {
    frame(&MAGIC, FORMAT_VERSION, &wire_graph(g)?)
}

/// Decodes a graph written by [`encode_graph`]. Checks the magic and the version first, so a
/// file of another kind gets a clear error; never panics and never allocates much more than
/// the input's size, whatever the input.
pub fn decode_graph(data: &[u8]) -> Result<Graph, BinaryError> {
    graph_of(unframe(&MAGIC, FORMAT_VERSION, data)?)
}

/// The payload of a frame written by [`frame`], decoded: the magic, the version, the size
/// and the payload's end checked first.
fn unframe<T: serde::de::DeserializeOwned>(
    magic_expected: &[u8; 8],
    version_expected: u32,
    data: &[u8],
) -> Result<T, BinaryError> {
    if data.len() < HEADER_LEN {
        if !magic_expected.starts_with(data) && !data.starts_with(magic_expected) {
            return Err(BinaryError::BadMagic);
        }
        return Err(BinaryError::Truncated { len: data.len() });
    }
    let (magic, rest) = data.split_at(MAGIC.len());
    if magic != magic_expected {
        return Err(BinaryError::BadMagic);
    }
    let (version, payload) = rest.split_at(4);
    let mut v = [0u8; 4];
    v.copy_from_slice(version);
    let found = u32::from_le_bytes(v);
    if found != version_expected {
        return Err(BinaryError::UnsupportedVersion {
            found,
            supported: version_expected,
        });
    }
    if payload.len() > MAX_PAYLOAD {
        return Err(BinaryError::TooLarge { len: payload.len() });
    }
    let (wire, read) = decode_payload(payload)?;
    if read != payload.len() {
        return Err(BinaryError::TrailingBytes {
            extra: payload.len().saturating_sub(read),
        });
    }
    Ok(wire)
}

/// The first bytes of every binary program ([`crate::spmd::SpmdProgram`]).
pub const PROGRAM_MAGIC: [u8; 8] = *b"SHARDCP\0";

/// The version of the binary program format this build writes and reads.
pub const PROGRAM_FORMAT_VERSION: u32 = 2;

// Version 2 (pipeline stages): a program holds its stages' templates and patches.

/// A patch as written: every kind as it is, but window variants, whose nodes are written as
/// a graph's nodes are (their operands checked when read).
#[derive(Serialize, Deserialize)]
enum WirePatch {
    Plain(crate::spmd::Patch),
    Variants {
        nodes: Vec<u32>,
        layout: crate::TensorLayout,
        dims: Vec<usize>,
        keys: Vec<Vec<(usize, usize)>>,
        variants: Vec<Vec<WireNode>>,
    },
}

#[derive(Serialize, Deserialize)]
struct WireStage {
    first_rank: u64,
    rank_count: u64,
    template: WireGraph,
    patches: Vec<WirePatch>,
}

#[derive(Serialize, Deserialize)]
struct WireProgram {
    device_num: u64,
    template: WireGraph,
    patches: Vec<WirePatch>,
    stages: Vec<WireStage>,
}

/// The patches as written.
fn wire_patches(patches: &[crate::spmd::Patch]) -> Result<Vec<WirePatch>, BinaryError> {
    use crate::spmd::Patch;
    patches
        .iter()
        .map(|patch| {
            Ok(match patch.clone() {
                Patch::Variants {
                    nodes,
                    layout,
                    dims,
                    keys,
                    variants,
                } => WirePatch::Variants {
                    variants: variants
                        .iter()
                        .map(|v| {
                            v.iter()
                                .zip(&nodes)
                                .map(|(n, &i)| wire_node(i as usize, n))
                                .collect::<Result<Vec<_>, _>>()
                        })
                        .collect::<Result<_, _>>()?,
                    nodes,
                    layout,
                    dims,
                    keys,
                },
                other => WirePatch::Plain(other),
            })
        })
        .collect()
}

/// The patches of their written form (window variants' nodes checked).
fn patches_of(wire: Vec<WirePatch>) -> Result<Vec<crate::spmd::Patch>, BinaryError> {
    use crate::spmd::Patch;
    wire.into_iter()
        .map(|w| {
            Ok(match w {
                WirePatch::Plain(Patch::Variants { .. }) => {
                    return Err(BinaryError::Decode(
                        bincode::error::DecodeError::OtherString(
                            "a window-variants patch outside its wire form".into(),
                        ),
                    ))
                }
                WirePatch::Plain(p) => p,
                WirePatch::Variants {
                    nodes,
                    layout,
                    dims,
                    keys,
                    variants,
                } => Patch::Variants {
                    variants: variants
                        .into_iter()
                        .map(|v| {
                            v.into_iter()
                                .zip(&nodes)
                                .map(|(n, &i)| node_of(i as usize, n))
                                .collect::<Result<Vec<_>, _>>()
                        })
                        .collect::<Result<_, _>>()?,
                    nodes,
                    layout,
                    dims,
                    keys,
                },
            })
        })
        .collect()
}

/// Encodes the program every rank runs: header (magic `SHARDCP\0`, version), then the
/// bincode payload (the template as a graph is, the patches beside it, then each pipeline
/// stage's template and patches).
pub fn encode_program(p: &crate::spmd::SpmdProgram) -> Result<Vec<u8>, BinaryError> {
    let wire = WireProgram {
        device_num: p.device_num as u64,
        template: wire_graph(&p.template)?,
        patches: wire_patches(&p.patches)?,
        stages: p
            .stages
            .iter()
            .map(|s| {
                Ok(WireStage {
                    first_rank: s.first_rank as u64,
                    rank_count: s.rank_count as u64,
                    template: wire_graph(&s.template)?,
                    patches: wire_patches(&s.patches)?,
                })
            })
            .collect::<Result<_, BinaryError>>()?,
    };
    frame(&PROGRAM_MAGIC, PROGRAM_FORMAT_VERSION, &wire)
}

/// Decodes a program written by [`encode_program`], as [`decode_graph`] decodes a graph.
pub fn decode_program(data: &[u8]) -> Result<crate::spmd::SpmdProgram, BinaryError> {
    let wire: WireProgram = unframe(&PROGRAM_MAGIC, PROGRAM_FORMAT_VERSION, data)?;
    let size = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
    Ok(crate::spmd::SpmdProgram {
        device_num: size(wire.device_num),
        template: graph_of(wire.template)?,
        patches: patches_of(wire.patches)?,
        stages: wire
            .stages
            .into_iter()
            .map(|s| {
                Ok(crate::spmd::StageProgram {
                    first_rank: size(s.first_rank),
                    rank_count: size(s.rank_count),
                    template: graph_of(s.template)?,
                    patches: patches_of(s.patches)?,
                })
            })
            .collect::<Result<_, BinaryError>>()?,
    })
}

/// Decodes the payload under a byte limit of about 64 times its length: bincode charges every
/// container's in-memory size against the limit before allocating it.
fn decode_payload<T: serde::de::DeserializeOwned>(
    payload: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    const MIB: usize = 1 << 20;
    const HUGE: usize = if usize::BITS >= 64 {
        (16u64 << 30) as usize
    } else {
        usize::MAX
    };
    let cfg = bincode::config::standard();
    if payload.len() <= 64 * 1024 {
        bincode::serde::decode_from_slice(payload, cfg.with_limit::<{ 4 * MIB }>())
    } else if payload.len() <= MIB {
        bincode::serde::decode_from_slice(payload, cfg.with_limit::<{ 64 * MIB }>())
    } else if payload.len() <= 16 * MIB {
        bincode::serde::decode_from_slice(payload, cfg.with_limit::<{ 1024 * MIB }>())
    } else {
        bincode::serde::decode_from_slice(payload, cfg.with_limit::<HUGE>())
    }
}

fn flatten_attrs(node: usize, attrs: &Attrs) -> Result<WireAttrs, BinaryError> {
    attrs
        .iter()
        .map(|(k, v)| {
            let mut toks = Vec::new();
            flatten(v, 0, &mut toks).map_err(|reason| BinaryError::BadAttr {
                node: node + 1,
                key: k.to_string(),
                reason,
            })?;
            Ok((k.to_string(), toks))
        })
        .collect()
}

/// Appends `a` in postfix order; recursion is bounded by [`MAX_NESTING`].
fn flatten(a: &Attr, depth: usize, out: &mut Vec<AttrTok>) -> Result<(), String> {
    match a {
        Attr::None => out.push(AttrTok::None),
        Attr::Bool(b) => out.push(AttrTok::Bool(*b)),
        Attr::Int(i) => out.push(AttrTok::Int(*i)),
        Attr::Float(f) => out.push(AttrTok::Float(*f)),
        Attr::Str(s) => out.push(AttrTok::Str(s.clone())),
        Attr::Tuple(xs) | Attr::List(xs) => {
            if depth >= MAX_NESTING {
                return Err(format!(
                    "nests deeper than {MAX_NESTING} levels of tuples and lists"
                ));
            }
            for x in xs {
                flatten(x, depth + 1, out)?;
            }
            let n = u32::try_from(xs.len()).map_err(|_| "too many elements".to_string())?;
            out.push(if matches!(a, Attr::Tuple(_)) {
                AttrTok::Tuple(n)
            } else {
                AttrTok::List(n)
            });
        }
    }
    Ok(())
}

fn unflatten_attrs(node: usize, wire: WireAttrs) -> Result<Attrs, BinaryError> {
    let mut attrs = Attrs::new();
    for (key, toks) in wire {
        match unflatten(toks) {
            Ok(v) => attrs.0.push((key, v)),
            Err(reason) => {
                return Err(BinaryError::BadAttr {
                    node: node + 1,
                    key,
                    reason: reason.to_string(),
                })
            }
        }
    }
    Ok(attrs)
}

/// Rebuilds a value from postfix tokens with an explicit stack of `(value, depth)`.
fn unflatten(toks: Vec<AttrTok>) -> Result<Attr, &'static str> {
    let mut stack: Vec<(Attr, usize)> = Vec::new();
    for t in toks {
        let leaf = match t {
            AttrTok::None => Attr::None,
            AttrTok::Bool(b) => Attr::Bool(b),
            AttrTok::Int(i) => Attr::Int(i),
            AttrTok::Float(f) => Attr::Float(f),
            AttrTok::Str(s) => Attr::Str(s),
            AttrTok::Tuple(n) | AttrTok::List(n) => {
                let is_tuple = matches!(t, AttrTok::Tuple(_));
                let n = usize::try_from(n).map_err(|_| "corrupt attribute value")?;
                if n > stack.len() {
                    return Err("corrupt attribute value (a tuple takes more values than exist)");
                }
                let items = stack.split_off(stack.len() - n);
                let depth = 1 + items.iter().map(|(_, d)| *d).max().unwrap_or(0);
                if depth > MAX_NESTING {
                    return Err("attribute value nests too deeply");
                }
                let items: Vec<Attr> = items.into_iter().map(|(a, _)| a).collect();
                let v = if is_tuple {
                    Attr::Tuple(items)
                } else {
                    Attr::List(items)
                };
                stack.push((v, depth));
                continue;
            }
        };
        stack.push((leaf, 0));
    }
    match (stack.pop(), stack.is_empty()) {
        (Some((v, _)), true) => Ok(v),
        _ => Err("corrupt attribute value (not exactly one value)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DType, TensorType};

    fn sample() -> Graph {
        let mut g = Graph::new("Net");
        let x = g.add_param(Param {
            name: "x".into(),
            ty: TensorType::new(DType::Float32, vec![2, 3]),
            kind: crate::graph::ParamKind::Input,
        });
        let mut n = Node::new(OpKind::ReLU, vec![x.into()]);
        n.attrs = Attrs::new()
            .with(
                "nested",
                Attr::Tuple(vec![
                    Attr::List(vec![Attr::Int(1), Attr::None]),
                    Attr::Str("s".into()),
                ]),
            )
            .with("empty", Attr::Tuple(vec![]));
        n.ty = Type::Tensor(TensorType::new(DType::Float32, vec![2, 3]));
        let id = g.push_node(n);
        g.outputs.push(id.into());
        g
    }

    #[test]
    fn round_trip_and_header_errors() {
        let g = sample();
        let bytes = encode_graph(&g).unwrap();
        assert_eq!(&bytes[..8], &MAGIC);
        assert_eq!(decode_graph(&bytes).unwrap(), g);

        assert!(matches!(
            decode_graph(b"PK\x03\x04 zip file"),
            Err(BinaryError::BadMagic)
        ));
        assert!(matches!(
            decode_graph(b"SHARD"),
            Err(BinaryError::Truncated { len: 5 })
        ));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        let e = decode_graph(&v2).unwrap_err();
        assert!(e.to_string().contains("version 2 is not supported"), "{e}");
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(matches!(
            decode_graph(&extra),
            Err(BinaryError::TrailingBytes { extra: 1 })
        ));
        for cut in HEADER_LEN..bytes.len() {
            assert!(decode_graph(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn too_deep_attrs_are_refused() {
        let mut a = Attr::Int(0);
        for _ in 0..=MAX_NESTING {
            a = Attr::Tuple(vec![a]);
        }
        let mut g = sample();
        g.nodes[0].attrs.set("deep", a);
        let e = encode_graph(&g).unwrap_err();
        assert!(e.to_string().contains("attribute `deep` of node %1"), "{e}");
    }

    #[test]
    fn malformed_token_streams_are_errors() {
        assert!(unflatten(vec![AttrTok::Tuple(1)]).is_err());
        assert!(unflatten(vec![AttrTok::Int(1), AttrTok::Int(2)]).is_err());
        assert!(unflatten(vec![]).is_err());
        let mut deep = vec![AttrTok::Int(0)];
        deep.extend((0..=MAX_NESTING).map(|_| AttrTok::List(1)));
        assert!(unflatten(deep).is_err());
    }

    #[test]
    fn a_huge_length_prefix_does_not_allocate() {
        // Header, then a graph name whose varint length claims ~2^62 bytes.
        let mut data = MAGIC.to_vec();
        data.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        data.push(0xFD); // u64 varint marker
        data.extend_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(matches!(decode_graph(&data), Err(BinaryError::Decode(_))));
    }
}
