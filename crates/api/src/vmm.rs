//! Bodies of the per-domain API that each VMM serves on its Unix socket
//! (`domus run --api-socket PATH`; routes and schemas in
//! `api/domain.openapi.json`).

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::spec::{DiskSpec, NetSpec};

/// What a running VMM's domain is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainState {
    Running,
    Paused,
}

impl DomainState {
    /// The name the API writes (`running`, `paused`).
    pub fn as_str(self) -> &'static str {
        match self {
            DomainState::Running => "running",
            DomainState::Paused => "paused",
        }
    }
}

/// `GET /v1/domain`, and the answer to pause and resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainInfo {
    pub name: String,
    pub state: DomainState,
    /// The VMM's process id.
    pub pid: u32,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub uptime_s: f64,
    /// Thread ids of the vCPU threads, vCPU 0 first.
    pub vcpu_tids: Vec<i32>,
    /// Device ids (`vda`, `net0`, `rng0`, ...).
    pub devices: Vec<String>,
}

/// A device's limits; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Bytes per second.
    pub bandwidth: Option<u64>,
    /// Operations per second (a disk's requests, an interface's packets).
    pub iops: Option<u64>,
}

/// `GET /v1/devices/{id}`; `GET /v1/devices` lists them all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceInfo {
    pub id: String,
    /// `block`, `net`, `rng`, `balloon`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Fixed facts that depend on the kind (a disk's path, read-only flag
    /// and serial; an interface's tap and MAC address).
    pub info: serde_json::Value,
    /// The device's counters, by name (bytes, operations, kicks, ...).
    pub counters: BTreeMap<String, u64>,
    /// Its rate limits, for a device that has a limiter.
    pub rate_limit: Option<RateLimit>,
}

impl DeviceInfo {
    /// A string fact of its `info` (a disk's `path` and `serial`, an
    /// interface's `tap` and `mac`); empty when it has none by that name.
    pub fn fact(&self, key: &str) -> &str {
        self.info
            .get(key)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
    }

    /// A flag of its `info` (a disk's `read_only`); false when absent.
    pub fn flag(&self, key: &str) -> bool {
        self.info
            .get(key)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    }

    /// One of its counters; 0 when it has none by that name.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

/// `PUT /v1/devices/{id}/rate-limit`: a field left out keeps its limit;
/// `null` or 0 lifts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitUpdate {
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub bandwidth: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub iops: Option<Option<u64>>,
}

/// A field that is present: `Some(None)` for `null`, `Some(Some(n))` for a
/// number (an absent field is `None`, through `default`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(d).map(Some)
}

/// `POST /v1/devices`: exactly one of `disk` or `net`, each an object or
/// in the syntax of `domus run --disk` and `--net` (see [`crate::spec`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlugRequest {
    #[serde(
        default,
        deserialize_with = "crate::spec::either_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub disk: Option<DiskSpec>,
    #[serde(
        default,
        deserialize_with = "crate::spec::either_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub net: Option<NetSpec>,
}

/// `PUT /v1/domain/vcpu-pin`: lets one vCPU (or, with `vcpu` left out,
/// every vCPU) run on the host CPUs `cpus` only.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuPin {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpu: Option<u32>,
    pub cpus: Vec<u32>,
}

/// One vCPU's thread and the host CPUs it may run on: the answer to
/// vcpu-pin lists every vCPU so.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuAffinity {
    pub vcpu: u32,
    pub tid: i32,
    pub cpus: Vec<u32>,
}

/// The answer to `DELETE /v1/devices/{id}` (202): the guest has been asked
/// to let go of the device in this PCI slot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Unplugging {
    pub unplugging: String,
    pub slot: usize,
}

/// The answer to `PUT /v1/domain/power-button` (202).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pressed {
    pub pressed: String,
}

/// `PUT /v1/domain/console` (and the daemon's `POST
/// /v1/domains/{dom}/console`): text typed at the serial console, as a
/// terminal sends it (control characters included), at most
/// [`CONSOLE_INPUT_MAX`] bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleInput {
    pub text: String,
}

/// The most bytes one [`ConsoleInput`] may carry.
pub const CONSOLE_INPUT_MAX: usize = 4096;

/// The answer to a [`ConsoleInput`]: how many bytes the serial port took
/// (fewer than sent when the guest reads none for a second).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleTaken {
    pub taken: usize,
}

/// `GET /v1/balloon`, and the answer to `PUT /v1/balloon`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonInfo {
    /// The memory the guest is asked to keep.
    pub target_mib: u64,
    /// What the balloon is asked to hold (the domain's memory less the
    /// target).
    pub balloon_target_mib: u64,
    /// What it holds now.
    pub balloon_actual_mib: u64,
    /// The memory the guest has now.
    pub actual_mib: u64,
    /// Freed memory the guest has reported (free page reporting), in all.
    pub reported_bytes: u64,
    /// The guest's memory statistics, by name (`free_memory`, ...).
    pub statistics: BTreeMap<String, u64>,
    /// How old those statistics are; `None` before the first.
    pub statistics_age_s: Option<f64>,
}

/// `PUT /v1/balloon`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonTarget {
    pub target_mib: u64,
}

/// `PUT /v1/domain/snapshot`: saves the domain. Give either `path` (the
/// VMM writes the state file there and the memory beside it, as
/// `NAME.mem`) or, for a jailed VMM, `state_fd`, `memory_fd` and
/// `memory_name`: tags of descriptors passed on its descriptor socket, open
/// for writing, and the memory file's name beside the state file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_fd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_fd: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_name: Option<String>,
    /// Let the domain run again once saved (default: it stays paused).
    #[serde(default)]
    pub resume: bool,
    /// The daemon's record of the domain, kept in the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<crate::domain::DomainConfig>,
}

/// The answer to `PUT /v1/domain/snapshot`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotInfo {
    /// Guest memory saved, and the 4 KiB pages of it written (the rest
    /// were zero and are holes in the file).
    pub memory_bytes: u64,
    pub pages_stored: u64,
    /// The state file's size.
    pub state_bytes: u64,
    /// How long the guest was stopped for it.
    pub paused_ms: f64,
    /// Whether the domain is paused now.
    pub paused: bool,
}

/// `PUT /v1/domain/migrate`: send the domain live to a destination VMM
/// (docs/migration.md). The answer (200, a [`MigrationStatus`]) hands
/// the connection over: the migration's stream follows on it, and
/// `GET /v1/domain/migration` tells how it goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// The longest the guest may stop for the last copy (default 300 ms).
    #[serde(default = "default_downtime_ms")]
    pub downtime_ms: u64,
    /// Pre-copy rounds after which a migration that has not come under
    /// the downtime gives up, leaving the domain running here (default 30).
    #[serde(default = "default_max_rounds")]
    pub max_rounds: u32,
}

impl Default for MigrateRequest {
    fn default() -> Self {
        Self {
            downtime_ms: default_downtime_ms(),
            max_rounds: default_max_rounds(),
        }
    }
}

pub(crate) fn default_downtime_ms() -> u64 {
    300
}

pub(crate) fn default_max_rounds() -> u32 {
    30
}

/// Where a live migration is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationState {
    /// None was asked for.
    #[default]
    None,
    /// Copying memory while the guest runs.
    Copying,
    /// The guest is stopped: the last pages and the state are going.
    Stopped,
    /// The guest runs on the destination; this VMM ends.
    Completed,
    /// It failed or was cancelled: the guest runs here as before.
    Failed,
}

/// `GET /v1/domain/migration`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationStatus {
    pub state: MigrationState,
    /// Pre-copy rounds sent.
    pub rounds: u32,
    /// Bytes sent so far.
    pub bytes_sent: u64,
    /// Pages dirtied since the last round (the next round's work).
    pub dirty_pages: u64,
    /// The last round's rate, MiB per second.
    pub mib_per_s: f64,
    /// How long the guest would stop if the copy stopped now.
    pub expected_downtime_ms: f64,
    /// How long the guest was stopped, once completed.
    pub downtime_ms: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    #[test]
    fn unknown_fields_and_wrong_types_are_refused_by_name() {
        let e = parse_body::<RateLimitUpdate>(br#"{"bw": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `bw`"), "{e}");
        let e = parse_body::<PlugRequest>(br#"{"disk": "a", "size": 3}"#).unwrap_err();
        assert!(e.contains("unknown field `size`"), "{e}");
        let e = parse_body::<RateLimitUpdate>(br#"{"iops": 1.5}"#).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        let e = parse_body::<BalloonTarget>(b"{}").unwrap_err();
        assert!(e.contains("missing field `target_mib`"), "{e}");
        assert!(parse_body::<BalloonTarget>(b"").is_err());
        assert!(parse_body::<BalloonTarget>(b"not json").is_err());
        assert!(parse_body::<BalloonTarget>(b"[1]").is_err());
    }

    #[test]
    fn a_rate_limit_update_tells_absent_from_null() {
        let u: RateLimitUpdate = parse_body(br#"{"bandwidth": null, "iops": 7}"#).unwrap();
        assert_eq!(u.bandwidth, Some(None));
        assert_eq!(u.iops, Some(Some(7)));
        let u: RateLimitUpdate = parse_body(b"{}").unwrap();
        assert_eq!(u, RateLimitUpdate::default());
    }

    #[test]
    fn answers_read_back_as_written() {
        let d = DomainInfo {
            name: "a".into(),
            state: DomainState::Paused,
            pid: 7,
            vcpus: 2,
            memory_mib: 256,
            uptime_s: 1.5,
            vcpu_tids: vec![8, 9],
            devices: vec!["vda".into()],
        };
        let text = serde_json::to_string(&d).unwrap();
        assert!(text.contains(r#""state":"paused""#), "{text}");
        for s in [DomainState::Running, DomainState::Paused] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert_eq!(parse_body::<DomainInfo>(text.as_bytes()).unwrap(), d);
        let dev = DeviceInfo {
            id: "vda".into(),
            kind: "block".into(),
            info: serde_json::json!({"path": "/x"}),
            counters: [("read_bytes".to_string(), 4)].into(),
            rate_limit: Some(RateLimit {
                bandwidth: Some(1),
                iops: None,
            }),
        };
        let text = serde_json::to_string(&dev).unwrap();
        assert!(text.contains(r#""type":"block""#), "{text}");
        assert_eq!(parse_body::<DeviceInfo>(text.as_bytes()).unwrap(), dev);
    }
}
