//! `shardc-ir`: the graph every other shardc crate works on.
//!
//! A [`Graph`] holds parameters (data inputs and weights), [`Node`]s in execution order and
//! the returned values. Nodes carry MindSpore op names ([`OpKind`]), attributes ([`Attrs`]),
//! instance names, scopes and per-op strategies. The text form (see `text`) prints exactly the
//! grammar of `docs/ir-format.md` and parses it back; the binary form is serde + bincode.
//!
//! This crate imports nothing else of shardc's. Shape rules, verification and every graph
//! transformation live in `shardc-passes`.

pub mod artifact;
pub mod attr;
pub mod binary;
pub mod block;
pub mod dropout;
pub mod geometry;
pub mod graph;
pub mod layout;
pub mod op;
pub mod spmd;
pub mod text;
pub mod types;

pub use attr::{Attr, Attrs, Const, Strategy};
pub use graph::{Graph, Init, Node, NodeId, Operand, Param, ParamId, ParamKind};
pub use layout::{ReduceOp, TensorLayout};
pub use op::{OpClass, OpKind};
pub use types::{num_elements, DType, Shape, ShapeDisplay, TensorType, Type};
