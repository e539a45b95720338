//! The device description: what the cost model knows of the machines a job runs on, as a
//! TOML file (`shardc bench calibrate` writes one for this machine) or a preset.
//!
//! ```toml
//! name = "8xH100-SXM"
//! devices_per_host = 8
//! flops = 6.7e13                # FLOP/s of one device (f32)
//! memory_bytes = 85899345920    # memory of one device
//!
//! [intra_host]                  # between devices of one host (NVLink, shared memory, HCCS)
//! bandwidth_gbs = 450.0         # 10^9 bytes per second, one direction
//! latency_us = 3.0
//! algorithm = "ring"            # or "shared_memory" (CPU workers); default "ring"
//!
//! [inter_host]                  # between hosts (InfiniBand, RoCE, Ethernet)
//! bandwidth_gbs = 50.0
//! latency_us = 6.0
//!
//! [point_to_point]              # optional: Send/Receive between pipeline stages in a host
//! bandwidth_gbs = 400.0
//! latency_us = 2.0
//! ```
//!
//! Communication follows an α–β model per link class: a message of `b` bytes costs
//! `α + b / β`; a ring AllReduce over `p` devices moves `2 (p − 1) / p` of the buffer through
//! `2 (p − 1)` steps, AllGather and ReduceScatter half of that. On a `shared_memory` link
//! (shardc's CPU workers copy through one host's memory) a member moves the whole buffer
//! whatever the group's size. A group that spans hosts is limited by the inter-host link.

use serde::{Deserialize, Serialize};
use shardc_passes::parallel::cost::{LinkAlgorithm, LinkCost, Machine};
use shardc_passes::parallel::search::stage_plan::{PlanOptions, PointToPoint};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// One link class: bandwidth, latency and how its collectives move data.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Bandwidth in 10⁹ bytes per second, one direction.
    pub bandwidth_gbs: f64,
    /// Latency of one message, in microseconds.
    pub latency_us: f64,
    /// `"ring"` (the default: NCCL, HCCL, MPI over a network or device links) or
    /// `"shared_memory"` (copies through one host's memory, as shardc's CPU workers do: a
    /// member moves the whole buffer whatever the group's size).
    #[serde(default)]
    pub algorithm: LinkAlgorithm,
}

/// What the cost model knows of the devices of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceDescription {
    /// A name for messages (`8xH100-SXM`).
    pub name: String,
    /// Devices in one host (ranks `h * devices_per_host ..` share host `h`).
    pub devices_per_host: usize,
    /// Floating-point operations per second of one device (f32).
    pub flops: f64,
    /// Memory of one device, in bytes (`max_device_memory` may lower it).
    pub memory_bytes: u64,
    /// Memory bandwidth of one device in 10⁹ bytes per second (the roofline of memory-bound
    /// ops); when absent, `flops / 10` bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bandwidth_gbs: Option<f64>,
    /// FLOP/s of one device in elementwise and normalisation ops (its vector units); when
    /// absent, `flops`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vector_flops: Option<f64>,
    /// Microseconds every collective costs besides its messages (launch, arrival, wake-up);
    /// when absent, 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective_overhead_us: Option<f64>,
    /// Between devices of one host.
    pub intra_host: Link,
    /// Between hosts.
    pub inter_host: Link,
    /// Whether every device of a host has its own `inter_host` link (a NIC per GPU or NPU, as
    /// DGX and Atlas 800 hosts have): a collective over several hosts then moves its share
    /// across them on every member's link at once. `false` (the default): the host's devices
    /// share one link.
    #[serde(default)]
    pub inter_host_per_device: bool,
    /// Point-to-point transfers (Send / Receive between pipeline stages) within a host, as
    /// `shardc bench calibrate` measures them (`[point_to_point]`: bandwidth and latency of one
    /// message); when absent, the stage planner prices them on `intra_host`. Between hosts
    /// they take `inter_host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub point_to_point: Option<Link>,
}

/// A device description that cannot be read or makes no sense.
#[derive(Debug, Error)]
pub enum DeviceError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a device description.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong (TOML's message, with line and column).
        reason: String,
    },
    /// A value is out of range.
    #[error("device description {name}: {field} = {value}: {reason}")]
    Invalid {
        /// The description's name.
        name: String,
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// No preset of that name.
    #[error("no device preset {0:?}; the presets are {presets}", presets = DeviceDescription::PRESETS.join(", "))]
    UnknownPreset(String),
}

impl DeviceDescription {
    /// The names of the presets.
    pub const PRESETS: &'static [&'static str] = &["cpu", "8xh100", "ascend910"];

    /// A preset: `cpu` (worker processes on a small x86 host, up to 8 of them sharing its
    /// memory, as the tutorials run their 8 ranks on one machine; Ethernet between hosts: the
    /// machine class shardc's CI runs on),
    /// `8xh100` (a DGX-class host: 8 H100 SXM, NVLink 4, 400 Gb/s InfiniBand per GPU) or
    /// `ascend910` (an Atlas 800 host: 8 Ascend 910, HCCS, 100 Gb/s RoCE per NPU). Figures are
    /// vendor peaks derated to what collectives and dense kernels reach; calibrate for real
    /// figures.
    pub fn preset(name: &str) -> Result<DeviceDescription, DeviceError> {
        let d = match name {
            "cpu" => DeviceDescription {
                name: "cpu".into(),
                devices_per_host: 8,
                flops: 1.0e11,
                memory_bytes: 12 << 30,
                memory_bandwidth_gbs: Some(10.0),
                vector_flops: Some(2.7e9),
                collective_overhead_us: Some(50.0),
                intra_host: Link {
                    bandwidth_gbs: 4.0,
                    latency_us: 3.0,
                    algorithm: LinkAlgorithm::SharedMemory,
                },
                inter_host: Link {
                    bandwidth_gbs: 1.0,
                    latency_us: 50.0,
                    algorithm: LinkAlgorithm::Ring,
                },
                inter_host_per_device: false,
                point_to_point: None,
            },
            "8xh100" => DeviceDescription {
                name: "8xH100-SXM".into(),
                devices_per_host: 8,
                flops: 6.7e13,
                memory_bytes: 80 << 30,
                memory_bandwidth_gbs: Some(2500.0),
                vector_flops: Some(6.7e13),
                collective_overhead_us: Some(10.0),
                intra_host: Link {
                    bandwidth_gbs: 360.0,
                    latency_us: 3.0,
                    algorithm: LinkAlgorithm::Ring,
                },
                inter_host: Link {
                    bandwidth_gbs: 45.0,
                    latency_us: 6.0,
                    algorithm: LinkAlgorithm::Ring,
                },
                inter_host_per_device: true,
                point_to_point: None,
            },
            "ascend910" => DeviceDescription {
                name: "8xAscend910".into(),
                devices_per_host: 8,
                flops: 1.28e14,
                memory_bytes: 32 << 30,
                memory_bandwidth_gbs: Some(1000.0),
                vector_flops: Some(8.0e12),
                collective_overhead_us: Some(15.0),
                intra_host: Link {
                    bandwidth_gbs: 90.0,
                    latency_us: 5.0,
                    algorithm: LinkAlgorithm::Ring,
                },
                inter_host: Link {
                    bandwidth_gbs: 11.0,
                    latency_us: 10.0,
                    algorithm: LinkAlgorithm::Ring,
                },
                inter_host_per_device: true,
                point_to_point: None,
            },
            other => return Err(DeviceError::UnknownPreset(other.to_string())),
        };
        Ok(d)
    }

    /// Reads and checks a TOML description.
    pub fn load(path: &Path) -> Result<DeviceDescription, DeviceError> {
        let text = std::fs::read_to_string(path).map_err(|source| DeviceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and checks a TOML description (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<DeviceDescription, DeviceError> {
        let d: DeviceDescription = toml::from_str(text).map_err(|e| DeviceError::Parse {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        d.validate()?;
        Ok(d)
    }

    /// The TOML text of this description, with a comment line per field.
    pub fn to_toml(&self) -> String {
        format!(
            "# shardc device description (the cost model's machine)\n\
             name = {:?}\n\
             # devices (worker processes, GPUs, NPUs) in one host\n\
             devices_per_host = {}\n\
             # f32 FLOP/s of one device\n\
             flops = {:e}\n\
             # memory of one device, bytes\n\
             memory_bytes = {}\n\
             # memory bandwidth of one device, 1e9 bytes/s\n\
             memory_bandwidth_gbs = {:?}\n\
             # f32 FLOP/s of one device in elementwise ops (vector units)\n\
             vector_flops = {:e}\n\
             # microseconds every collective costs besides its messages\n\
             collective_overhead_us = {:?}\n\
             # whether every device has its own link to the other hosts (a NIC per GPU)\n\
             inter_host_per_device = {}\n\n\
             # between devices of one host: bandwidth in 1e9 bytes/s, latency in microseconds\n\
             # algorithm: \"ring\" (a member moves (p - 1)/p of the buffer) or \"shared_memory\" (the whole buffer)\n\
             [intra_host]\n\
             bandwidth_gbs = {:?}\n\
             latency_us = {:?}\n\
             algorithm = {:?}\n\n\
             # between hosts\n\
             [inter_host]\n\
             bandwidth_gbs = {:?}\n\
             latency_us = {:?}\n\
             algorithm = {:?}\n",
            self.name,
            self.devices_per_host,
            self.flops,
            self.memory_bytes,
            self.memory_bandwidth(),
            self.vector_flops.unwrap_or(self.flops),
            self.collective_overhead_us.unwrap_or(0.0),
            self.inter_host_per_device,
            self.intra_host.bandwidth_gbs,
            self.intra_host.latency_us,
            self.intra_host.algorithm.name(),
            self.inter_host.bandwidth_gbs,
            self.inter_host.latency_us,
            self.inter_host.algorithm.name(),
        ) + &match &self.point_to_point {
            Some(l) => format!(
                "\n# point-to-point (Send/Receive between pipeline stages) within a host\n\
                 [point_to_point]\n\
                 bandwidth_gbs = {:?}\n\
                 latency_us = {:?}\n",
                l.bandwidth_gbs, l.latency_us
            ),
            None => String::new(),
        }
    }

    /// Writes [`DeviceDescription::to_toml`] to `path`.
    pub fn save(&self, path: &Path) -> Result<(), DeviceError> {
        std::fs::write(path, self.to_toml()).map_err(|source| DeviceError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Checks every value: positive and finite.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let bad = |field: &'static str, value: String, reason: &'static str| DeviceError::Invalid {
            name: self.name.clone(),
            field,
            value,
            reason,
        };
        if self.devices_per_host == 0 {
            return Err(bad(
                "devices_per_host",
                "0".into(),
                "a host has at least one device",
            ));
        }
        if !(self.flops.is_finite() && self.flops > 0.0) {
            return Err(bad(
                "flops",
                self.flops.to_string(),
                "must be a positive number",
            ));
        }
        if self.memory_bytes == 0 {
            return Err(bad("memory_bytes", "0".into(), "a device has some memory"));
        }
        for (field, v) in [
            ("memory_bandwidth_gbs", self.memory_bandwidth_gbs),
            ("vector_flops", self.vector_flops),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    return Err(bad(field, v.to_string(), "must be a positive number"));
                }
            }
        }
        if let Some(v) = self.collective_overhead_us {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(
                    "collective_overhead_us",
                    v.to_string(),
                    "must be a non-negative number",
                ));
            }
        }
        for (field, v) in [
            ("intra_host.bandwidth_gbs", self.intra_host.bandwidth_gbs),
            ("inter_host.bandwidth_gbs", self.inter_host.bandwidth_gbs),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(field, v.to_string(), "must be a positive number"));
            }
        }
        if let Some(l) = &self.point_to_point {
            if !(l.bandwidth_gbs.is_finite() && l.bandwidth_gbs > 0.0) {
                return Err(bad(
                    "point_to_point.bandwidth_gbs",
                    l.bandwidth_gbs.to_string(),
                    "must be a positive number",
                ));
            }
            if !(l.latency_us.is_finite() && l.latency_us >= 0.0) {
                return Err(bad(
                    "point_to_point.latency_us",
                    l.latency_us.to_string(),
                    "must be a non-negative number",
                ));
            }
        }
        for (field, v) in [
            ("intra_host.latency_us", self.intra_host.latency_us),
            ("inter_host.latency_us", self.inter_host.latency_us),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(field, v.to_string(), "must be a non-negative number"));
            }
        }
        Ok(())
    }

    /// Memory bandwidth of one device, 10⁹ bytes per second.
    pub fn memory_bandwidth(&self) -> f64 {
        self.memory_bandwidth_gbs.unwrap_or(self.flops / 10.0 / 1e9)
    }

    /// The cost model's machine (SI units) of this description.
    pub fn machine(&self) -> Machine {
        let link = |l: &Link| LinkCost {
            bandwidth: l.bandwidth_gbs * 1e9,
            latency: l.latency_us * 1e-6,
            algorithm: l.algorithm,
        };
        Machine {
            devices_per_host: self.devices_per_host,
            flops: self.flops,
            vector_flops: self.vector_flops.unwrap_or(self.flops),
            memory_bandwidth: self.memory_bandwidth() * 1e9,
            memory_bytes: self.memory_bytes as f64,
            intra_host: link(&self.intra_host),
            inter_host: link(&self.inter_host),
            inter_host_per_device: self.inter_host_per_device,
            collective_overhead: self.collective_overhead_us.unwrap_or(0.0) * 1e-6,
        }
    }

    /// The stage planner's point-to-point links: the measured `point_to_point` link within a
    /// host and `inter_host` between hosts, each transfer with the collective overhead;
    /// `None` when no point-to-point link was measured (the planner then uses the
    /// collectives' links).
    pub fn point_to_point(&self) -> Option<PointToPoint> {
        let l = self.point_to_point?;
        let m = self.machine();
        Some(PointToPoint {
            intra_host: LinkCost {
                bandwidth: l.bandwidth_gbs * 1e9,
                latency: l.latency_us * 1e-6,
                algorithm: LinkAlgorithm::Ring,
            },
            inter_host: m.inter_host,
            devices_per_host: self.devices_per_host,
            overhead: m.collective_overhead,
        })
    }

    /// The stage planner's options for `devices` devices of this description and
    /// `global_batch` samples: its machine and memory, its point-to-point link where measured
    /// ([`DeviceDescription::point_to_point`]), the planner's defaults otherwise.
    pub fn plan_options(&self, devices: usize, global_batch: usize) -> PlanOptions {
        let mut o = PlanOptions::new(self.machine(), devices, global_batch);
        o.p2p = self.point_to_point().unwrap_or(o.p2p);
        o
    }

    /// Seconds of an AllReduce of `bytes` per member over `group`: on the intra-host link within
    /// a host, hierarchically over hosts ([`Machine::group_all_reduce_seconds`]).
    pub fn all_reduce_seconds(&self, bytes: f64, group: &[usize]) -> f64 {
        self.machine().group_all_reduce_seconds(group, bytes)
    }

    /// Seconds of an AllGather (or ReduceScatter) whose full result is `bytes`.
    pub fn all_gather_seconds(&self, bytes: f64, group: &[usize]) -> f64 {
        self.machine().group_all_gather_seconds(group, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_round_trip_through_toml() {
        for name in DeviceDescription::PRESETS {
            let d = DeviceDescription::preset(name).unwrap();
            d.validate().unwrap();
            let back = DeviceDescription::parse(&d.to_toml(), Path::new("x.toml")).unwrap();
            assert_eq!(back, d, "{name}");
        }
        let mut d = DeviceDescription::preset("cpu").unwrap();
        d.point_to_point = Some(Link {
            bandwidth_gbs: 3.5,
            latency_us: 4.25,
            algorithm: LinkAlgorithm::Ring,
        });
        let back = DeviceDescription::parse(&d.to_toml(), Path::new("x.toml")).unwrap();
        assert_eq!(back, d);
        let p = back.point_to_point().unwrap();
        assert_eq!(p.intra_host.bandwidth, 3.5e9);
        assert_eq!(p.inter_host, back.machine().inter_host);
        assert!(DeviceDescription::preset("8xh100")
            .unwrap()
            .point_to_point()
            .is_none());
        let e = DeviceDescription::preset("tpu").unwrap_err().to_string();
        assert!(e.contains("\"tpu\"") && e.contains("8xh100"), "{e}");
    }

    #[test]
    fn bad_files_name_the_file_the_field_and_the_reason() {
        let p = Path::new("dev.toml");
        let d = DeviceDescription::preset("8xh100").unwrap();
        let e = DeviceDescription::parse(&d.to_toml().replace("flops = 6.7e13", "flops = -1.0"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("flops = -1") && e.contains("positive"), "{e}");
        let e = DeviceDescription::parse("name = \"x\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("dev.toml:") && e.contains("devices_per_host"),
            "{e}"
        );
        let e = DeviceDescription::parse(&format!("{}\nspeed = 3\n", d.to_toml()), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("speed"), "{e}");
        let e = DeviceDescription::parse(
            &d.to_toml()
                .replacen("algorithm = \"ring\"", "algorithm = \"mesh\"", 1),
            p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("mesh") && e.contains("ring") && e.contains("shared_memory"),
            "{e}"
        );
    }

    #[test]
    fn the_cpu_preset_copies_through_shared_memory_within_a_host() {
        let d = DeviceDescription::preset("cpu").unwrap();
        assert_eq!(d.intra_host.algorithm, LinkAlgorithm::SharedMemory);
        assert_eq!(d.inter_host.algorithm, LinkAlgorithm::Ring);
        // A member moves the whole buffer: 2 MB of AllReduce over a pair cost what the
        // whole host's would, bar the latency.
        let pair = d.all_reduce_seconds(2e6, &[0, 1]);
        assert!(
            (pair - (2.0 * 3e-6 + 2.0 * 2e6 / 4e9)).abs() < 1e-12,
            "{pair}"
        );
        // Written without the key, a link is a ring (files written before it existed).
        let old = d.to_toml().replace("algorithm = \"shared_memory\"\n", "");
        let back = DeviceDescription::parse(&old, Path::new("old.toml")).unwrap();
        assert_eq!(back.intra_host.algorithm, LinkAlgorithm::Ring);
    }

    #[test]
    fn the_alpha_beta_model_follows_the_ring_and_the_host_boundary() {
        let d = DeviceDescription::preset("8xh100").unwrap();
        let mb = 1e6;
        // One device communicates nothing; within a host NVLink, across hosts InfiniBand.
        assert_eq!(d.all_reduce_seconds(mb, &[3]), 0.0);
        let intra = d.all_reduce_seconds(64.0 * mb, &[0, 1, 2, 3, 4, 5, 6, 7]);
        let inter = d.all_reduce_seconds(64.0 * mb, &[0, 8]);
        let want_intra = 14.0 * 3e-6 + 2.0 * 7.0 / 8.0 * 64e6 / 360e9;
        assert!(
            (intra - want_intra).abs() < 1e-12,
            "{intra} vs {want_intra}"
        );
        assert!(inter > intra, "{inter} vs {intra}");
        assert!((d.all_gather_seconds(64.0 * mb, &[0, 1]) - (3e-6 + 32e6 / 360e9)).abs() < 1e-12);
        let m = d.machine();
        assert!((m.compute_seconds(6.7e13, 0.0) - 1.0).abs() < 1e-12);
        assert_eq!(m.link_of(&[8, 9, 15]), &m.intra_host);
        assert_eq!(m.link_of(&[7, 8]), &m.inter_host);
        assert_eq!(m.memory_bandwidth, 2500e9);
    }
}
