//! MindSpore's rank table file (`RANK_TABLE_FILE`): the JSON that Ascend jobs started by hand
//! (one process per NPU, `DEVICE_ID` / `RANK_ID` / `RANK_SIZE` set per process, as in the
//! Ascend tutorials' `run.sh`) read to know which device each rank owns and on which server.
//!
//! The format is MindSpore's (and `hccl_tools.py`'s) version 1.0:
//!
//! ```json
//! {
//!   "version": "1.0",
//!   "server_count": "1",
//!   "server_list": [
//!     { "server_id": "10.0.0.1",
//!       "device": [
//!         { "device_id": "0", "device_ip": "192.168.100.101", "rank_id": "0" },
//!         { "device_id": "1", "device_ip": "192.168.100.102", "rank_id": "1" }
//!       ],
//!       "host_nic_ip": "reserve" }
//!   ],
//!   "status": "completed"
//! }
//! ```
//!
//! Numbers are strings, as MindSpore writes them (plain JSON numbers are accepted too). Every
//! rank `0..n` appears exactly once; a device id appears at most once per server. shardc uses
//! the table for the device mapping (rank → `device_id`), the rank's place on its server (its
//! local rank), and the host of rank 0, where the job's scheduler runs
//! ([`super::env::ClusterEnv`]); HCCL's own links are set up by HCCL from its root info, so
//! `device_ip` is only checked to be a string.

use super::ClusterError;
use serde_json::Value;
use std::path::Path;

/// One NPU of a server in the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTableDevice {
    /// The NPU on its server (`device_id`).
    pub device_id: usize,
    /// The NPU's own network address (`device_ip`), if given.
    pub device_ip: Option<String>,
    /// The rank that owns it (`rank_id`).
    pub rank_id: usize,
}

/// One server of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTableServer {
    /// The server's address (`server_id`, an IP address in MindSpore's tables).
    pub server_id: String,
    /// Its NPUs, in the table's order.
    pub devices: Vec<RankTableDevice>,
}

/// Where a rank runs, as the table says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankPlace {
    /// The rank.
    pub rank: usize,
    /// Its server's address.
    pub server_id: String,
    /// Its NPU on that server.
    pub device_id: usize,
    /// Its position among its server's devices (the local rank).
    pub local_rank: usize,
}

/// A parsed, checked rank table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTable {
    /// The servers, in the table's order.
    pub servers: Vec<RankTableServer>,
}

impl RankTable {
    /// Reads and checks the table in `path` (errors name the file, the field and why).
    pub fn from_file(path: &Path) -> Result<RankTable, ClusterError> {
        let text = std::fs::read_to_string(path).map_err(|e| ClusterError::RankTable {
            file: path.display().to_string(),
            reason: format!("cannot read it: {e}"),
        })?;
        RankTable::parse(&text, &path.display().to_string())
    }

    /// Parses and checks a table's text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<RankTable, ClusterError> {
        let bad = |reason: String| ClusterError::RankTable {
            file: file.to_string(),
            reason,
        };
        let root: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("it is not JSON: {e}")))?;
        if let Some(v) = root.get("version") {
            let v = v.as_str().unwrap_or_default();
            if v != "1.0" {
                return Err(bad(format!(
                    "version {v:?} is not supported: expected \"1.0\" (MindSpore's rank table with server_list)"
                )));
            }
        }
        if let Some(status) = root.get("status").and_then(Value::as_str) {
            if status != "completed" {
                return Err(bad(format!(
                    "status is {status:?}: the table is not complete (expected \"completed\")"
                )));
            }
        }
        let list = root
            .get("server_list")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("it has no \"server_list\" array".into()))?;
        let mut servers = Vec::with_capacity(list.len());
        for (s, server) in list.iter().enumerate() {
            let server_id = server
                .get("server_id")
                .and_then(Value::as_str)
                .filter(|id| !id.trim().is_empty())
                .ok_or_else(|| bad(format!("server_list[{s}] has no \"server_id\"")))?
                .trim()
                .to_string();
            let devices = server
                .get("device")
                .and_then(Value::as_array)
                .ok_or_else(|| {
                    bad(format!(
                        "server_list[{s}] ({server_id}) has no \"device\" array"
                    ))
                })?;
            let mut out = Vec::with_capacity(devices.len());
            for (d, dev) in devices.iter().enumerate() {
                let at = format!("server_list[{s}].device[{d}]");
                let device_id = number(dev.get("device_id"))
                    .map_err(|why| bad(format!("{at}.device_id {why}")))?;
                let rank_id =
                    number(dev.get("rank_id")).map_err(|why| bad(format!("{at}.rank_id {why}")))?;
                let device_ip = match dev.get("device_ip") {
                    None => None,
                    Some(Value::String(ip)) => Some(ip.clone()),
                    Some(other) => {
                        return Err(bad(format!("{at}.device_ip is {other}: expected a string")))
                    }
                };
                if out
                    .iter()
                    .any(|o: &RankTableDevice| o.device_id == device_id)
                {
                    return Err(bad(format!(
                        "{at}: device {device_id} of server {server_id} is listed twice"
                    )));
                }
                out.push(RankTableDevice {
                    device_id,
                    device_ip,
                    rank_id,
                });
            }
            servers.push(RankTableServer {
                server_id,
                devices: out,
            });
        }
        if let Some(count) = root.get("server_count") {
            let count = number(Some(count)).map_err(|why| bad(format!("server_count {why}")))?;
            if count != servers.len() {
                return Err(bad(format!(
                    "server_count is {count} but server_list has {} server(s)",
                    servers.len()
                )));
            }
        }
        let table = RankTable { servers };
        let n = table.size();
        if n == 0 {
            return Err(bad("it lists no device".into()));
        }
        let mut seen = vec![false; n];
        for server in &table.servers {
            for d in &server.devices {
                if d.rank_id >= n {
                    return Err(bad(format!(
                        "rank_id {} (device {} of server {}) is not below the number of devices ({n}): ranks must be 0..{n}",
                        d.rank_id, d.device_id, server.server_id
                    )));
                }
                if std::mem::replace(&mut seen[d.rank_id], true) {
                    return Err(bad(format!("rank_id {} is listed twice", d.rank_id)));
                }
            }
        }
        Ok(table)
    }

    /// The number of ranks (devices) in the table.
    pub fn size(&self) -> usize {
        self.servers.iter().map(|s| s.devices.len()).sum()
    }

    /// Where `rank` runs, if the table lists it.
    pub fn place(&self, rank: usize) -> Option<RankPlace> {
        self.servers.iter().find_map(|s| {
            s.devices
                .iter()
                .position(|d| d.rank_id == rank)
                .map(|local| RankPlace {
                    rank,
                    server_id: s.server_id.clone(),
                    device_id: s.devices[local].device_id,
                    local_rank: local,
                })
        })
    }
}

/// Which NPU a rank uses, and why, in MindSpore's order: the device asked for (`device_id`,
/// `--device-id`), else `DEVICE_ID`, else the rank table's device of `rank`
/// (`RANK_TABLE_FILE`), else the rank on its host (`local_rank`, or `rank`) modulo the `npus`
/// the host has. `var` reads the environment. A device that is not below `npus` is an error
/// naming where it came from.
pub fn npu_of_rank(
    asked: Option<usize>,
    rank: usize,
    local_rank: Option<usize>,
    npus: usize,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(usize, String), ClusterError> {
    let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let (device, why) = if let Some(d) = asked {
        (d, "the device asked for".to_string())
    } else if let Some(v) = get("DEVICE_ID") {
        let d = v
            .trim()
            .parse::<usize>()
            .map_err(|_| ClusterError::InvalidEnv {
                var: "DEVICE_ID".into(),
                value: v.clone(),
                reason: "expected a non-negative integer (the NPU of this process)".into(),
            })?;
        (d, "DEVICE_ID".to_string())
    } else if let Some(file) = get("RANK_TABLE_FILE") {
        let table = RankTable::from_file(Path::new(file.trim()))?;
        let place = table.place(rank).ok_or_else(|| ClusterError::RankTable {
            file: file.trim().to_string(),
            reason: format!("it lists no device for rank {rank}"),
        })?;
        (
            place.device_id,
            format!("the rank table's device of rank {rank}"),
        )
    } else {
        if npus == 0 {
            return Err(ClusterError::InvalidConfig {
                what: "the NPUs of this host".into(),
                value: "0".into(),
                reason: "the Ascend runtime sees no NPU".into(),
            });
        }
        let local = local_rank.unwrap_or(rank);
        (
            local % npus,
            format!("rank {local} on this host modulo {npus} NPU(s)"),
        )
    };
    if device >= npus {
        return Err(ClusterError::InvalidConfig {
            what: format!("the NPU of rank {rank} ({why})"),
            value: device.to_string(),
            reason: format!("this host has {npus} NPU(s), numbered from 0"),
        });
    }
    Ok((device, why))
}

/// A table number: a decimal string (MindSpore's) or a non-negative JSON integer.
fn number(v: Option<&Value>) -> Result<usize, String> {
    match v {
        None => Err("is missing".into()),
        Some(Value::String(s)) => s
            .trim()
            .parse::<usize>()
            .map_err(|_| format!("is {s:?}: expected a non-negative integer")),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| format!("is {n}: expected a non-negative integer")),
        Some(other) => Err(format!("is {other}: expected a non-negative integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_SERVERS: &str = r#"{
        "version": "1.0", "server_count": "2",
        "server_list": [
            {"server_id": "10.0.0.1", "device": [
                {"device_id": "0", "device_ip": "192.168.100.101", "rank_id": "0"},
                {"device_id": "1", "device_ip": "192.168.100.102", "rank_id": "1"}],
             "host_nic_ip": "reserve"},
            {"server_id": "10.0.0.2", "device": [
                {"device_id": "0", "device_ip": "192.168.100.103", "rank_id": "2"},
                {"device_id": "3", "device_ip": "192.168.100.104", "rank_id": "3"}],
             "host_nic_ip": "reserve"}],
        "status": "completed"}"#;

    #[test]
    fn mindspores_table_gives_each_rank_its_server_device_and_local_rank() {
        let t = RankTable::parse(TWO_SERVERS, "hccl_4p.json").unwrap();
        assert_eq!(t.size(), 4);
        assert_eq!(
            t.place(3),
            Some(RankPlace {
                rank: 3,
                server_id: "10.0.0.2".into(),
                device_id: 3,
                local_rank: 1
            })
        );
        assert_eq!(t.place(0).unwrap().server_id, "10.0.0.1");
        assert_eq!(t.place(4), None);
    }

    #[test]
    fn a_rank_takes_the_npu_asked_for_then_device_id_then_the_table_then_its_local_rank() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.json");
        std::fs::write(&file, TWO_SERVERS).unwrap();
        let table = file.to_str().unwrap().to_string();
        let vars = |pairs: Vec<(&'static str, String)>| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
            }
        };
        let none = vars(vec![]);
        assert_eq!(npu_of_rank(Some(2), 5, None, 8, &none).unwrap().0, 2);
        assert_eq!(
            npu_of_rank(None, 5, Some(1), 8, &none).unwrap(),
            (1, "rank 1 on this host modulo 8 NPU(s)".to_string())
        );
        assert_eq!(npu_of_rank(None, 9, None, 8, &none).unwrap().0, 1);
        let dev = vars(vec![
            ("DEVICE_ID", "6".into()),
            ("RANK_TABLE_FILE", table.clone()),
        ]);
        assert_eq!(npu_of_rank(None, 3, None, 8, &dev).unwrap().0, 6);
        let t = vars(vec![("RANK_TABLE_FILE", table.clone())]);
        assert_eq!(
            npu_of_rank(None, 3, None, 8, &t).unwrap(),
            (3, "the rank table's device of rank 3".to_string())
        );
        assert_eq!(
            npu_of_rank(None, 3, None, 2, &t).unwrap_err().to_string(),
            "invalid cluster configuration: the NPU of rank 3 (the rank table's device of rank 3) is 3: this host has 2 NPU(s), numbered from 0"
        );
        let bad = vars(vec![("DEVICE_ID", "one".into())]);
        assert_eq!(
            npu_of_rank(None, 0, None, 8, &bad).unwrap_err().to_string(),
            "environment variable DEVICE_ID=\"one\" is invalid: expected a non-negative integer (the NPU of this process)"
        );
    }

    #[test]
    fn a_bad_table_is_refused_naming_the_file_and_the_field() {
        let err = |text: &str| RankTable::parse(text, "t.json").unwrap_err().to_string();
        assert_eq!(
            err("{"),
            "rank table t.json: it is not JSON: EOF while parsing an object at line 1 column 1"
        );
        assert!(
            err(&TWO_SERVERS.replace("\"rank_id\": \"3\"", "\"rank_id\": \"1\""))
                .contains("rank_id 1 is listed twice")
        );
        assert!(
            err(&TWO_SERVERS.replace("\"rank_id\": \"3\"", "\"rank_id\": \"7\"")).contains(
                "rank_id 7 (device 3 of server 10.0.0.2) is not below the number of devices (4)"
            )
        );
        assert!(
            err(&TWO_SERVERS.replace("\"device_id\": \"3\"", "\"device_id\": \"x\"")).contains(
                "server_list[1].device[1].device_id is \"x\": expected a non-negative integer"
            )
        );
        assert!(
            err(&TWO_SERVERS.replace("\"server_count\": \"2\"", "\"server_count\": \"3\""))
                .contains("server_count is 3 but server_list has 2 server(s)")
        );
        assert!(err(&TWO_SERVERS.replace("completed", "initializing"))
            .contains("status is \"initializing\""));
        assert!(
            err(&TWO_SERVERS.replace("\"device_id\": \"3\"", "\"device_id\": \"0\""))
                .contains("device 0 of server 10.0.0.2 is listed twice")
        );
        assert!(err("{\"version\": \"1.0\"}").contains("no \"server_list\" array"));
    }
}
