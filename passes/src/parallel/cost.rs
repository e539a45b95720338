//! The cost model of strategy search: per op and strategy, its compute time on one device;
//! per edge, the time of the redistribution between two layouts; per device, the memory a
//! strategy keeps.
//!
//! - **Compute** is a roofline: `max(flops / F, bytes / B_mem)` for the op's local block,
//!   where `flops` counts two per multiply-add of a contraction (MatMul, BatchMatMul, the
//!   convolutions, at the GEMM rate `F`) and a weight per element otherwise (at the vector
//!   rate), and `bytes` is what the op reads and writes. A strategy that uses fewer devices
//!   than there are repeats the work; an op that is first user of a weight also pays the
//!   weight's optimizer update on its slice.
//! - **Communication** follows an α–β model per link class ([`Machine`]): a ring AllReduce
//!   over `p` devices of a `b`-byte buffer costs `2 (p − 1) α + 2 (p − 1) / p · b / β`,
//!   AllGather, ReduceScatter and AllToAll half of that (on the full buffer); on a link whose
//!   collectives copy through shared memory ([`LinkAlgorithm::SharedMemory`]) a member moves
//!   the whole buffer whatever the group's size (`2 b / β` for the AllReduce). A slice costs
//!   the copy of its result (read out of the source, written packed: one element operation
//!   and two memory passes per element; `shardc bench strategies` ranked the MLP's
//!   candidates at 0.97-0.99 with it against 0.86-0.98 without, on the same measurements);
//!   a group whose members are on several hosts runs hierarchically, as NCCL and HCCL run
//!   it: within each host on the intra-host link, and across the hosts with every member on
//!   its own inter-host link at once, each moving its share of the buffer
//!   ([`Machine::group_all_reduce_seconds`]). The
//!   steps are those [`super::redistribute::plan`] would insert, each collective with the
//!   machine's fixed `collective_overhead` on top.
//! - **Memory** per device: every weight's slice, its optimizer state and its gradient
//!   (charged to the weight's first user), and every result that the backward pass reads
//!   (charged to the op that produces it).

use super::redistribute::{greedy_plan, group, plan, Canon, Step};
use super::simplify::simplify;
use shardc_ir::{DType, TensorLayout};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex};

/// How the collectives of a link class move data (`algorithm = "ring"` or
/// `"shared_memory"` in a device description).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum LinkAlgorithm {
    /// Rings over a network or device links (NCCL, HCCL, MPI): each of `p` members sends
    /// and receives `(p − 1) / p` of the buffer, so a larger group moves a little more.
    #[default]
    Ring,
    /// Copies through one host's memory (shardc's in-process and shared-memory
    /// collectives): every member reads each member's share of the buffer, so a member moves
    /// the whole buffer whatever the group's size. Measured with 8 in-process ranks on 2
    /// cores, 256×128 f32: AllReduce 42, 43, 47 µs and AllGather 20, 19, 19 µs for groups of
    /// 2, 4, 8, where a ring fitted to the whole world says 22, 31, 39 and 13, 18, 22.
    SharedMemory,
}

impl LinkAlgorithm {
    /// Its name in a device description.
    pub fn name(self) -> &'static str {
        match self {
            LinkAlgorithm::Ring => "ring",
            LinkAlgorithm::SharedMemory => "shared_memory",
        }
    }

    /// The share of a buffer one of `p` members moves in an AllGather or ReduceScatter (an
    /// AllReduce moves twice as much).
    pub fn share(self, p: usize) -> f64 {
        match self {
            LinkAlgorithm::Ring => (p.max(1) - 1) as f64 / p.max(1) as f64,
            LinkAlgorithm::SharedMemory => 1.0,
        }
    }
}

/// One link class of the machine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Bytes per second, one direction.
    pub bandwidth: f64,
    /// Seconds per message.
    pub latency: f64,
    /// How its collectives move data.
    pub algorithm: LinkAlgorithm,
}

/// What the cost model knows of the devices (the compiler's device description, in SI units).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Machine {
    /// Devices in one host (ranks `h * devices_per_host ..` share host `h`).
    pub devices_per_host: usize,
    /// f32 FLOP/s of one device in contractions (MatMul, convolutions: the GEMM rate).
    pub flops: f64,
    /// f32 FLOP/s of one device in elementwise and normalisation ops (the vector units; a
    /// transcendental function counts as [`crate::parallel::search::problem`]'s weight).
    pub vector_flops: f64,
    /// Bytes per second one device reads and writes its memory at.
    pub memory_bandwidth: f64,
    /// Memory of one device, bytes.
    pub memory_bytes: f64,
    /// Between devices of one host.
    pub intra_host: LinkCost,
    /// Between hosts.
    pub inter_host: LinkCost,
    /// Whether every device has its own inter-host link (a NIC per GPU or NPU): a
    /// collective over hosts then moves `1 / k` of its buffer across them on each of a host's
    /// `k` members' links at once; otherwise the host's members share one link.
    pub inter_host_per_device: bool,
    /// Seconds every collective costs besides its messages (launch, the members' arrival
    /// and wake-up).
    pub collective_overhead: f64,
}

impl Default for Machine {
    /// The `cpu` preset: worker processes on a small x86 host, up to 8 sharing its memory (as
    /// the tutorials run their 8 ranks on one machine), Ethernet between hosts.
    fn default() -> Machine {
        Machine {
            devices_per_host: 8,
            flops: 1.0e11,
            vector_flops: 2.7e9,
            memory_bandwidth: 1.0e10,
            memory_bytes: (12u64 << 30) as f64,
            intra_host: LinkCost {
                bandwidth: 4.0e9,
                latency: 3.0e-6,
                algorithm: LinkAlgorithm::SharedMemory,
            },
            inter_host: LinkCost {
                bandwidth: 1.0e9,
                latency: 50.0e-6,
                algorithm: LinkAlgorithm::Ring,
            },
            inter_host_per_device: false,
            collective_overhead: 50.0e-6,
        }
    }
}

impl Machine {
    /// The link the group `ranks` communicates over.
    pub fn link_of(&self, ranks: &[usize]) -> &LinkCost {
        let host = |r: usize| r / self.devices_per_host.max(1);
        match ranks.first() {
            Some(&f) if ranks.iter().any(|&r| host(r) != host(f)) => &self.inter_host,
            _ => &self.intra_host,
        }
    }

    /// How the group `ranks` sits on hosts: `(members per host, hosts)` when every host it
    /// touches holds the same number of its members (as every group of a device matrix does),
    /// `None` otherwise.
    pub fn hosts_of(&self, ranks: &[usize]) -> Option<(usize, usize)> {
        let h = self.devices_per_host.max(1);
        let mut per_host: Vec<(usize, usize)> = Vec::new();
        for &r in ranks {
            match per_host.iter_mut().find(|(host, _)| *host == r / h) {
                Some((_, n)) => *n += 1,
                None => per_host.push((r / h, 1)),
            }
        }
        let k = per_host.first()?.1;
        per_host
            .iter()
            .all(|&(_, n)| n == k)
            .then_some((k, per_host.len()))
    }

    /// Seconds of an AllReduce of a `bytes` buffer over the group `ranks` (without the fixed
    /// [`Machine::collective_overhead`]). Within a host: a ring on the intra-host link
    /// ([`Machine::all_reduce_seconds`]). Over `H` hosts with `k` members each, hierarchically,
    /// as NCCL's rings over every NIC and HCCL's two-level algorithm run it: a ReduceScatter
    /// within each host (`k` members, intra-host link), then `k` AllReduces of `bytes / k`
    /// across the hosts in parallel (the cheaper of a ring, `2 (H − 1)` steps, and a
    /// pipelined tree, `2 ⌈log2 H⌉` steps moving the buffer twice), each on its member's own
    /// inter-host link with [`Machine::inter_host_per_device`], else all `k` sharing the
    /// host's one link (as one AllReduce of `bytes`), then an AllGather within each host. A
    /// group whose hosts hold different numbers of its members runs as one ring at the
    /// inter-host link's figures.
    pub fn group_all_reduce_seconds(&self, ranks: &[usize], bytes: f64) -> f64 {
        let p = ranks.len();
        if p <= 1 {
            return 0.0;
        }
        match self.hosts_of(ranks) {
            Some((_, 1)) => Machine::all_reduce_seconds(&self.intra_host, bytes, p),
            Some((k, hosts)) => {
                let within = 2.0 * Machine::all_gather_seconds(&self.intra_host, bytes, k);
                within + self.across_hosts_all_reduce(self.across_share(bytes, k), hosts)
            }
            None => Machine::all_reduce_seconds(&self.inter_host, bytes, p),
        }
    }

    /// Seconds of an AllGather whose full result is `bytes` (also a ReduceScatter of a
    /// `bytes` buffer, and an AllToAll of one) over the group `ranks`, without the fixed
    /// overhead. Over `H` hosts with `k` members each: `k` rings of `bytes / k` across the
    /// hosts in parallel (on every member's own inter-host link, or sharing the host's one),
    /// then an AllGather of `bytes` within each host; otherwise as
    /// [`Machine::group_all_reduce_seconds`] says.
    pub fn group_all_gather_seconds(&self, ranks: &[usize], bytes: f64) -> f64 {
        let p = ranks.len();
        if p <= 1 {
            return 0.0;
        }
        match self.hosts_of(ranks) {
            Some((_, 1)) => Machine::all_gather_seconds(&self.intra_host, bytes, p),
            Some((k, hosts)) => {
                Machine::all_gather_seconds(&self.intra_host, bytes, k)
                    + Machine::all_gather_seconds(
                        &self.inter_host,
                        self.across_share(bytes, k),
                        hosts,
                    )
            }
            None => Machine::all_gather_seconds(&self.inter_host, bytes, p),
        }
    }

    /// The bytes of a `bytes` buffer that one inter-host link moves when `k` members of
    /// each host take part: `bytes / k` on each member's own link, `bytes` on a shared one.
    fn across_share(&self, bytes: f64, k: usize) -> f64 {
        if self.inter_host_per_device {
            bytes / k.max(1) as f64
        } else {
            bytes
        }
    }

    /// One member's AllReduce of `bytes` across `hosts` hosts on its inter-host link: the
    /// cheaper of a ring and a pipelined (double binary) tree, as NCCL picks per size.
    fn across_hosts_all_reduce(&self, bytes: f64, hosts: usize) -> f64 {
        let link = &self.inter_host;
        let ring = Machine::all_reduce_seconds(link, bytes, hosts);
        let depth = (hosts as f64).log2().ceil();
        let tree = 2.0 * depth * link.latency + 2.0 * bytes / link.bandwidth;
        ring.min(tree)
    }

    /// Seconds of an AllReduce of a `bytes` buffer over `p` members on `link`:
    /// `2 (p − 1) α + 2 s b / β`, `s` the share of the buffer a member moves
    /// ([`LinkAlgorithm::share`]: `(p − 1) / p` on a ring).
    pub fn all_reduce_seconds(link: &LinkCost, bytes: f64, p: usize) -> f64 {
        if p <= 1 {
            return 0.0;
        }
        let steps = (p - 1) as f64;
        2.0 * steps * link.latency + 2.0 * link.algorithm.share(p) * bytes / link.bandwidth
    }

    /// Seconds of an AllGather whose full result is `bytes` (also ReduceScatter of a `bytes`
    /// buffer, and AllToAll of one) over `p` members on `link`: half an AllReduce's.
    pub fn all_gather_seconds(link: &LinkCost, bytes: f64, p: usize) -> f64 {
        if p <= 1 {
            return 0.0;
        }
        let steps = (p - 1) as f64;
        steps * link.latency + link.algorithm.share(p) * bytes / link.bandwidth
    }

    /// Roofline seconds of `flops` contraction operations touching `bytes` on one device.
    pub fn compute_seconds(&self, flops: f64, bytes: f64) -> f64 {
        (flops / self.flops).max(bytes / self.memory_bandwidth)
    }

    /// Roofline seconds of `flops` elementwise operations touching `bytes` on one device.
    pub fn vector_seconds(&self, flops: f64, bytes: f64) -> f64 {
        (flops / self.vector_flops).max(bytes / self.memory_bandwidth)
    }
}

/// Bytes of one element of `dt` as the CPU kernels store it.
pub fn elem_bytes(dt: DType) -> usize {
    match dt {
        DType::Float64 | DType::Int64 => 8,
        DType::Float16 | DType::BFloat16 => 2,
        DType::Bool => 1,
        _ => 4,
    }
}

/// The time of redistributions between layouts, memoised per pair of layouts (shareable
/// between threads).
#[derive(Debug)]
pub struct CommCost {
    machine: Machine,
    enable_alltoall: bool,
    /// Keyed by a hash of (from, to, element bytes): no clones on the hot path; a collision
    /// could only misprice a candidate, never change what a chosen strategy computes.
    /// Sharded by the key's top bits, so that the searchers' threads seldom wait on each
    /// other. Shared by every calculator of the same machine in the process
    /// ([`shared_memo`]): the stage planner's dozens of profiles, and a completion's
    /// baselines, price the same pairs of layouts again and again.
    memo: Arc<Memo>,
}

/// The memo of one machine: seconds by key, in [`MEMO_SHARDS`] locked parts.
type Memo = [Mutex<HashMap<u64, f64, BuildHasherDefault<MemoKey>>>; MEMO_SHARDS];

/// How many locks the memo is split into.
const MEMO_SHARDS: usize = 16;

/// Entries one part of a memo keeps before it starts over (so a memo stays under about 2
/// million entries, some 50 MB).
const MEMO_SHARD_ENTRIES: usize = 1 << 17;

/// Machines whose memos the process keeps (the least recently asked for goes first).
const SHARED_MEMOS: usize = 4;

/// The memo of calculators for `machine` (with AllToAll or not): the one the process already
/// keeps for it, else a new one, kept.
fn shared_memo(machine: &Machine, enable_alltoall: bool) -> Arc<Memo> {
    type Registry = Mutex<Vec<(String, Arc<Memo>)>>;
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    // `Debug` writes every figure in the shortest form that reads back exactly.
    let key = format!("{machine:?} alltoall={enable_alltoall}");
    let mut reg = REGISTRY
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let memo = match reg.iter().position(|(k, _)| *k == key) {
        Some(i) => reg.remove(i).1,
        None => Arc::new(std::array::from_fn(|_| Mutex::new(HashMap::default()))),
    };
    reg.push((key, Arc::clone(&memo)));
    if reg.len() > SHARED_MEMOS {
        reg.remove(0);
    }
    memo
}

/// The seed of the memo's key hash (fixed, so that a compile prices alike on every run).
const MEMO_SEED: u64 = 0x5348_4152_4443_0001;

/// The memo's keys are already hashes: the map uses them as they are.
#[derive(Default)]
struct MemoKey(u64);

impl std::hash::Hasher for MemoKey {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

impl CommCost {
    /// A calculator for `machine`.
    pub fn new(machine: Machine, enable_alltoall: bool) -> CommCost {
        CommCost {
            machine,
            enable_alltoall,
            memo: shared_memo(&machine, enable_alltoall),
        }
    }

    /// The machine.
    pub fn machine(&self) -> &Machine {
        &self.machine
    }

    /// Seconds to turn a value laid out as `from` into `to` (`elem_bytes` per element), as
    /// the partition converts it: the cheapest chain ([`plan`]), simplified. The prediction
    /// of a plan prices its conversions so.
    pub fn seconds(&self, from: &TensorLayout, to: &TensorLayout, elem_bytes: usize) -> f64 {
        self.memoised(from, to, elem_bytes, true)
    }

    /// As [`CommCost::seconds`], by the greedy order of the redistribution planner
    /// ([`greedy_plan`]): never cheaper than the partition's chain, and fast enough to price
    /// every pair of candidates a searcher weighs.
    pub fn estimate(&self, from: &TensorLayout, to: &TensorLayout, elem_bytes: usize) -> f64 {
        self.memoised(from, to, elem_bytes, false)
    }

    fn memoised(
        &self,
        from: &TensorLayout,
        to: &TensorLayout,
        elem_bytes: usize,
        exact: bool,
    ) -> f64 {
        if from == to && !from.is_partial() {
            return 0.0;
        }
        use std::hash::BuildHasher;
        let key = foldhash::quality::FixedState::with_seed(MEMO_SEED)
            .hash_one((from, to, elem_bytes, exact));
        let shard = &self.memo[(key >> 60) as usize % MEMO_SHARDS];
        if let Some(&s) = shard.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return s;
        }
        let s = self.plan_seconds(from, to, elem_bytes, exact);
        let mut part = shard.lock().unwrap_or_else(|e| e.into_inner());
        if part.len() >= MEMO_SHARD_ENTRIES {
            part.clear();
        }
        part.insert(key, s);
        s
    }

    fn plan_seconds(
        &self,
        from: &TensorLayout,
        to: &TensorLayout,
        elem_bytes: usize,
        exact: bool,
    ) -> f64 {
        let p = if exact {
            // The plan the partition emits: the planner's chain, simplified.
            simplify(
                plan(from, to, elem_bytes, self.enable_alltoall),
                &from.slice_shape(),
                elem_bytes,
                self.enable_alltoall,
            )
        } else {
            greedy_plan(from, to, elem_bytes, self.enable_alltoall)
        };
        let eb = elem_bytes as f64;
        let bytes = |shape: &[usize]| shape.iter().product::<usize>() as f64 * eb;
        let mut before = Canon::of(from).local_shape();
        let mut total = 0.0;
        for (step, after) in p.steps.iter().zip(&p.shapes) {
            let (space, axes) = match step {
                Step::AllReduce { space, axes, .. }
                | Step::ReduceScatter { space, axes, .. }
                | Step::AllGather { space, axes, .. }
                | Step::AllToAll { space, axes, .. } => (*space, axes),
                Step::Slice { .. } => {
                    // A copy: the slice read out of its source, written packed.
                    let el = after.iter().product::<usize>() as f64;
                    total += self.machine.vector_seconds(el, 2.0 * el * eb);
                    before = after.clone();
                    continue;
                }
            };
            let primes = &p.spaces[space];
            let (ranks, _) = group(primes, axes, 0);
            let m = &self.machine;
            total += m.collective_overhead;
            total += match step {
                Step::AllReduce { .. } => m.group_all_reduce_seconds(&ranks, bytes(&before)),
                Step::AllGather { .. } => m.group_all_gather_seconds(&ranks, bytes(after)),
                _ => m.group_all_gather_seconds(&ranks, bytes(&before)),
            };
            before = after.clone();
        }
        total
    }
}

/// A predicted cost split by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown {
    /// Seconds of compute.
    pub compute: f64,
    /// Seconds of communication.
    pub communication: f64,
    /// Bytes per device.
    pub memory: f64,
}

impl Breakdown {
    /// Compute plus communication, seconds.
    pub fn seconds(&self) -> f64 {
        self.compute + self.communication
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardc_ir::ReduceOp;

    fn layout(dev: &[usize], map: &[i64], shape: &[usize], partial: &[usize]) -> TensorLayout {
        TensorLayout {
            dev_matrix: dev.to_vec(),
            tensor_map: map.to_vec(),
            tensor_shape: shape.to_vec(),
            partial: partial.to_vec(),
            partial_op: ReduceOp::Sum,
        }
    }

    #[test]
    fn redistribution_times_follow_the_ring_model_and_the_host_boundary() {
        let m = Machine {
            devices_per_host: 4,
            flops: 1e12,
            vector_flops: 1e12,
            memory_bandwidth: 1e11,
            memory_bytes: 1e10,
            intra_host: LinkCost {
                bandwidth: 1e10,
                latency: 1e-6,
                algorithm: LinkAlgorithm::Ring,
            },
            inter_host: LinkCost {
                bandwidth: 1e9,
                latency: 1e-5,
                algorithm: LinkAlgorithm::Ring,
            },
            inter_host_per_device: true,
            collective_overhead: 0.0,
        };
        let c = CommCost::new(m, false);
        // A 1024x1024 f32 value split on rows over 8 devices, gathered whole: the group spans
        // two hosts of 4, so it runs hierarchically: each member's ring of a quarter across
        // the 2 hosts on its inter-host link, then the whole within each host.
        let split = layout(&[8], &[0, -1], &[1024, 1024], &[]);
        let whole = layout(&[8], &[-1, -1], &[1024, 1024], &[]);
        let full = 1024.0 * 1024.0 * 4.0;
        let want = (1e-5 + 0.5 * (full / 4.0) / 1e9) + (3.0 * 1e-6 + 0.75 * full / 1e10);
        let got = c.seconds(&split, &whole, 4);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        // Slicing costs the copy of the slice: 1024 x 128 elements, one operation each at
        // 1e12/s or 8 bytes each (read and written) at 1e11 B/s, whichever is slower.
        let slice = 1024.0 * 128.0;
        let want = (slice / 1e12_f64).max(2.0 * slice * 4.0 / 1e11);
        let got = c.seconds(&whole, &split, 4);
        assert!((got - want).abs() < 1e-15, "{got} vs {want}");
        // Partial over 2 devices of one host (the minor axis): AllReduce on the intra link.
        let partial = layout(&[4, 2], &[-1, -1], &[256, 256], &[0]);
        let repl = layout(&[4, 2], &[-1, -1], &[256, 256], &[]);
        let b = 256.0 * 256.0 * 4.0;
        let want = 2.0 * 1e-6 + b / 1e10;
        let got = c.seconds(&partial, &repl, 4);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        // Memoised: the same answer again.
        assert_eq!(c.seconds(&partial, &repl, 4), got);
    }

    #[test]
    fn shared_memory_members_move_the_whole_buffer_whatever_the_group() {
        let link = |algorithm| LinkCost {
            bandwidth: 1e10,
            latency: 1e-6,
            algorithm,
        };
        let (ring, shm) = (link(LinkAlgorithm::Ring), link(LinkAlgorithm::SharedMemory));
        let b = 1e6;
        for p in [2usize, 4, 8] {
            let steps = (p - 1) as f64;
            let ring_share = steps / p as f64;
            let got = Machine::all_reduce_seconds(&ring, b, p);
            assert!((got - (2.0 * steps * 1e-6 + 2.0 * ring_share * b / 1e10)).abs() < 1e-15);
            let got = Machine::all_reduce_seconds(&shm, b, p);
            assert!((got - (2.0 * steps * 1e-6 + 2.0 * b / 1e10)).abs() < 1e-15);
            let got = Machine::all_gather_seconds(&shm, b, p);
            assert!((got - (steps * 1e-6 + b / 1e10)).abs() < 1e-15);
        }
        // One member: nothing to do on either.
        assert_eq!(Machine::all_reduce_seconds(&shm, b, 1), 0.0);
        assert_eq!(Machine::all_gather_seconds(&ring, b, 1), 0.0);
    }

    #[test]
    fn a_group_over_hosts_runs_within_each_host_then_across_on_every_members_link() {
        let m = Machine {
            devices_per_host: 8,
            intra_host: LinkCost {
                bandwidth: 360e9,
                latency: 3e-6,
                algorithm: LinkAlgorithm::Ring,
            },
            inter_host: LinkCost {
                bandwidth: 45e9,
                latency: 6e-6,
                algorithm: LinkAlgorithm::Ring,
            },
            inter_host_per_device: true,
            ..Machine::default()
        };
        let b = 1e9;
        // Within one host: the intra-host ring.
        let host: Vec<usize> = (8..16).collect();
        let want = Machine::all_reduce_seconds(&m.intra_host, b, 8);
        assert_eq!(m.group_all_reduce_seconds(&host, b), want);
        // 4 hosts, all 8 members each: ReduceScatter and AllGather within, a ring of b / 8
        // across (4 hosts: the ring's 6 steps beat nothing the tree saves at this size).
        let all: Vec<usize> = (0..32).collect();
        let within = 2.0 * (7.0 * 3e-6 + 7.0 / 8.0 * b / 360e9);
        let across = 2.0 * 3.0 * 6e-6 + 2.0 * 0.75 * (b / 8.0) / 45e9;
        let got = m.group_all_reduce_seconds(&all, b);
        assert!((got - (within + across)).abs() < 1e-12, "{got}");
        // Far cheaper than one ring over 32 members at one inter-host link's bandwidth.
        assert!(got < 0.3 * Machine::all_reduce_seconds(&m.inter_host, b, 32));
        // One member per host on 64 hosts, a small buffer: the tree's 2·6 steps, not the
        // ring's 126.
        let spread: Vec<usize> = (0..64).map(|h| 8 * h).collect();
        let small = 1e3;
        let tree = 2.0 * 6.0 * 6e-6 + 2.0 * small / 45e9;
        assert!((m.group_all_reduce_seconds(&spread, small) - tree).abs() < 1e-15);
        // AllGather over 2 hosts × 8: a ring of b / 8 across, then b within.
        let two: Vec<usize> = (0..16).collect();
        let want = (7.0 * 3e-6 + 7.0 / 8.0 * b / 360e9) + (6e-6 + 0.5 * (b / 8.0) / 45e9);
        assert!((m.group_all_gather_seconds(&two, b) - want).abs() < 1e-12);
        // Hosts holding different numbers of members: one ring at the inter-host figures.
        let uneven = [0, 1, 2, 8];
        assert_eq!(m.hosts_of(&uneven), None);
        assert_eq!(
            m.group_all_reduce_seconds(&uneven, b),
            Machine::all_reduce_seconds(&m.inter_host, b, 4)
        );
        assert_eq!(m.group_all_reduce_seconds(&[5], b), 0.0);
        // Members sharing their host's one link: across the hosts, the whole buffer.
        let shared = Machine {
            inter_host_per_device: false,
            ..m
        };
        let want = (7.0 * 3e-6 + 7.0 / 8.0 * b / 360e9) + (6e-6 + 0.5 * b / 45e9);
        assert!((shared.group_all_gather_seconds(&two, b) - want).abs() < 1e-12);
        assert!(shared.group_all_reduce_seconds(&all, b) > got);
    }

    #[test]
    fn compute_is_a_roofline() {
        let m = Machine::default();
        assert_eq!(m.compute_seconds(1e11, 0.0), 1.0);
        assert_eq!(m.compute_seconds(0.0, 1e10), 1.0);
        assert_eq!(m.compute_seconds(1e11, 2e10), 2.0);
    }
}
