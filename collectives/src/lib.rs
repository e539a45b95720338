//! `shardc-collectives`: collectives between processes — shared memory within a host, TCP
//! (optionally TLS-sealed) between hosts, and MPI behind the `mpi` feature. Every
//! communicator here implements [`shardc_runtime::Communicator`], with results bit-identical
//! to the in-process world's.
//!
//! [`ProcessComm`] is the one a worker uses: built from a [`CommSetup`] (the membership the
//! control plane hands out, plus the worker's data-plane listener), it runs every collective
//! whose group lies on this host through shared memory ([`shm::ShmComm`]) and everything
//! else — groups spanning hosts, send and receive — over TCP ([`tcp::TcpComm`]).
//!
//! What the transports share is written once: the arithmetic and the reductions (in member
//! order) are the runtime's [`shardc_runtime::comm::tensor_ops`], the argument checks its
//! [`shardc_runtime::comm::arguments`], and the encoding of a call's header and of tensor
//! elements (element-type and collective codes, frames) is this crate's `wire` module, which
//! TCP and MPI messages both use.
//!
//! Modules: `process` (ProcessComm), [`shm`] (with `futex`, its waits), [`tcp`] (with
//! `tcp/mesh`, `tcp/handshake`, `tcp/seal`, `tcp/setup`), `mpi` (feature `mpi`), `wire`.

#![warn(missing_docs)]

mod futex;
#[cfg(feature = "mpi")]
pub mod mpi;
mod process;
pub mod shm;
pub mod tcp;
mod wire;

pub use process::{CommSetup, Peer, ProcessComm};
