//! Request and response bodies of the daemon's API (`domusd.sock`, or TCP
//! with a token; routes in `api/daemon.openapi.json`).

use serde::{Deserialize, Serialize};

/// `POST /v1/domains`: an xl-style configuration file's text, with where it
/// came from (for relative paths) and `key=value` overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The configuration file's text.
    pub config: String,
    /// Its name, for messages (default `config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The absolute directory relative paths in it are taken from, once, at
    /// create (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// `key=value` settings that override the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<Vec<String>>,
}

/// `PUT /v1/domains/{dom}/memory`: the memory the guest keeps (balloon).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRequest {
    pub target_mib: u64,
}

/// `PUT /v1/domains/{dom}/maxmem`: the most memory the domain may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MaxmemRequest {
    pub maxmem_mib: u64,
}

/// `PUT /v1/domains/{dom}/name`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    pub name: String,
}

/// `PUT /v1/domains/{dom}/block-attach` and `network-attach`: an xl disk or
/// vif spec (a vif's may be left out: all defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    #[serde(default)]
    pub spec: Option<String>,
}

/// A string or a whole number, as a name or index may be given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NameOrNumber {
    Name(String),
    Number(u64),
}

impl std::fmt::Display for NameOrNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameOrNumber::Name(s) => f.write_str(s),
            NameOrNumber::Number(n) => write!(f, "{n}"),
        }
    }
}

/// `PUT /v1/domains/{dom}/block-detach` (`vdb`) and `network-detach` (an
/// index, 0 for net0, or a MAC address).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachRequest {
    pub id: NameOrNumber,
}

/// `PUT /v1/domains/{dom}/vcpu-pin`: pins one vCPU (or all: `"all"` or left
/// out) to a host CPU list like `0-3,6`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinRequest {
    #[serde(default)]
    pub vcpu: Option<NameOrNumber>,
    pub cpus: String,
}

impl PinRequest {
    /// The vCPU asked for: `None` for all of them, or a message for a 400.
    pub fn vcpu(&self) -> Result<Option<usize>, String> {
        match &self.vcpu {
            None => Ok(None),
            Some(NameOrNumber::Name(s)) if s == "all" => Ok(None),
            Some(NameOrNumber::Number(n)) => usize::try_from(*n)
                .map(Some)
                .map_err(|_| format!("vCPU {n} is out of range")),
            Some(NameOrNumber::Name(s)) => Err(format!(
                "'vcpu' must be a vCPU number or \"all\", not {s:?}"
            )),
        }
    }
}

/// `PUT /v1/domains/{dom}/sched`: a credit-scheduler weight and cap (a
/// percentage of one CPU); a field left out or null is unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedRequest {
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub cap: Option<u32>,
}

/// The host-wide scheduler settings (`GET /v1/sched`, `domus sched-credit
/// -s`), as Xen's credit scheduler has them for its CPU pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSched {
    /// The time slice, in ms, every domain's vCPU threads ask of the
    /// host's scheduler (Xen's tslice); 0: the kernel's own base slice.
    pub tslice_ms: u32,
    /// The kernel's base slice in ns (what 0 gives); null on a kernel
    /// that shows none (before Linux 6.12).
    pub base_slice_ns: Option<u64>,
}

/// `PUT /v1/sched`: the host-wide time slice in ms (1 to 100, or 0 for the
/// kernel's own); a field left out or null is unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSchedRequest {
    #[serde(default)]
    pub tslice_ms: Option<u32>,
}

/// Where a domain is in its life, as the daemon's answers name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Being created: its VMM is starting.
    Creating,
    Running,
    Paused,
    /// Its VMM ended and on_poweroff, on_reboot or on_crash restarts it.
    Restarting,
    /// Being destroyed.
    Destroying,
    /// Powered off and kept (`preserve`).
    Shutdown,
    /// Crashed and kept (`preserve`), or a restart failed.
    Crashed,
}

impl State {
    pub const ALL: [State; 7] = [
        State::Creating,
        State::Running,
        State::Paused,
        State::Restarting,
        State::Destroying,
        State::Shutdown,
        State::Crashed,
    ];

    /// The name the API writes (and the daemon's database stores).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Paused => "paused",
            State::Restarting => "restarting",
            State::Destroying => "destroying",
            State::Shutdown => "shutdown",
            State::Crashed => "crashed",
        }
    }

    /// The state named `s`, if it is one.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A domain as `GET /v1/domains` lists it and `GET /v1/domains/{dom}`
/// (and the verbs that change it) answer. Domain-0, the host, is listed
/// first with id 0; the fields that describe a configuration are `null`
/// for a domain whose configuration no longer loads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Domain {
    pub id: i64,
    pub name: String,
    pub state: State,
    /// The VMM's process id (the daemon's own for Domain-0).
    pub pid: Option<i64>,
    /// The memory the guest keeps (its balloon target).
    pub memory_mib: u64,
    pub maxmem_mib: Option<u64>,
    pub vcpus: Option<u32>,
    pub cpu_weight: Option<u32>,
    pub cap: Option<u32>,
    /// CPU time of the whole VMM process: its vCPU threads (`vcpu_time_s`)
    /// and the rest, the I/O done for it (`io_time_s`).
    pub cpu_time_s: f64,
    pub vcpu_time_s: f64,
    pub io_time_s: f64,
    /// Thread ids of the vCPU threads, vCPU 0 first.
    pub vcpu_tids: Vec<i32>,
    pub restarts: i64,
    /// `poweroff` or `reboot`, asked of the guest and not done yet.
    pub shutdown_requested: Option<String>,
    pub on_poweroff: Option<String>,
    pub on_reboot: Option<String>,
    pub on_crash: Option<String>,
    /// The vsock context id its guest is reached at (`vsock = 'cid=N'`; a
    /// clone gets one of its own).
    pub vsock_cid: Option<u64>,
    /// Packets its interfaces sent that the virtual firewall-router passed,
    /// and dropped (spoofed, isolated, ...): 0 without a VFR.
    pub vfr_passed: u64,
    pub vfr_dropped: u64,
}

/// The answer to `POST /v1/domains` (201).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Created {
    pub domain: Domain,
    /// What the configuration has that Domus ignores or changed.
    pub warnings: Vec<String>,
}

/// `PUT /v1/domains/{dom}/save` (`domus save`): saves the domain into
/// `file` (the state) and `file`.mem (its memory) beside it, in a
/// directory the daemon serves images from; neither may exist yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaveRequest {
    /// An absolute path.
    pub file: String,
    /// Leave the domain paused afterwards (`domus save -p`) instead of
    /// destroying it.
    #[serde(default)]
    pub pause: bool,
}

/// The answer to `PUT /v1/domains/{dom}/save`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    pub file: String,
    pub memory_file: String,
    pub memory_bytes: u64,
    /// 4 KiB pages written (the rest were zero).
    pub pages_stored: u64,
    /// How long the guest was stopped for the save.
    pub paused_ms: f64,
    /// Whether the domain was destroyed afterwards (else it is paused).
    pub destroyed: bool,
}

/// `POST /v1/restore` (`domus restore`): starts the domain saved in
/// `file` again, under its saved name unless `name` gives another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// An absolute path, in a directory the daemon serves images from.
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `POST /v1/domains/{dom}/migrate` (`domus migrate`): sends the domain
/// live to the daemon at `to` (its TCP API: host:port), whose certificate
/// is checked by `fingerprint` or `ca_file` and which takes `token`. The
/// answer comes once both ends have agreed; `GET
/// /v1/domains/{dom}/migration` follows it, `DELETE` cancels it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    pub to: String,
    /// The destination daemon's bearer token.
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// The longest the guest may stop (default 300 ms).
    #[serde(default = "crate::vmm::default_downtime_ms")]
    pub downtime_ms: u64,
    /// Rounds after which a migration that does not converge gives up
    /// (default 30).
    #[serde(default = "crate::vmm::default_max_rounds")]
    pub max_rounds: u32,
}

/// `POST /v1/migrations`, from the source daemon to the destination's:
/// take this domain, whose migration stream follows on the connection
/// once answered (200).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncomingRequest {
    pub domain: crate::domain::DomainConfig,
    /// Paused through the source daemon (it stays paused).
    #[serde(default)]
    pub paused: bool,
}

/// `POST /v1/clone` (`domus clone`): starts `count` domains from the
/// snapshot in `file`, named `PREFIX-1` to `PREFIX-count`, each with an
/// identity of its own (see [`Cloned`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    /// An absolute path, in a directory the daemon serves images from.
    pub file: String,
    /// 1 to [`MAX_CLONES`].
    pub count: u32,
    /// The clones' names are `PREFIX-N` (default: the saved domain's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// The most clones one `POST /v1/clone` makes.
pub const MAX_CLONES: u32 = 256;

/// The answer to `POST /v1/clone` (201): every clone, running. Each has
/// new MAC addresses (its interfaces are replaced once it runs, so its
/// guest sees them come and go), a vsock CID of its own, a copy of each
/// writable disk (`disks`), and a new VM generation ID. Either all were
/// made or none is left.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cloned {
    pub domains: Vec<Domain>,
    /// The disk copies made for the clones, in clone order (read-only
    /// disks are shared, not copied).
    pub disks: Vec<String>,
    /// How long making them all took, in milliseconds.
    pub elapsed_ms: f64,
}

/// `GET /v1/info`: the daemon and the host's memory as admission control
/// counts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Info {
    pub version: String,
    pub state_dir: String,
    pub host_memory_mib: u64,
    pub host_reserve_mib: u64,
    pub domain_memory_mib: u64,
    pub free_memory_mib: u64,
    pub cpus: usize,
    /// Whether domains get cgroups (weights, caps, memory.max).
    pub cgroups: bool,
    /// The directories whose files domains may use (kernels, initrds,
    /// disk images).
    pub image_dirs: Vec<String>,
    /// The block devices domains may use.
    pub block_devices: Vec<String>,
    /// The TCP API's TLS certificate fingerprint (`SHA256:..`), when the
    /// daemon listens on TCP (null when it does not).
    pub tls_fingerprint: Option<String>,
    /// Whether VMMs run under their seccomp filter.
    pub seccomp: bool,
    /// The first user and group id of the VMMs' jails (domain N's is this
    /// plus N); null when VMMs are not jailed (`--no-jail`).
    pub jail_ids: Option<u32>,
}

/// One line of `GET /v1/dmesg`, the daemon's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogLine {
    /// Seconds since the Unix epoch.
    pub at: f64,
    pub msg: String,
}

/// One vCPU of `GET /v1/domains/{dom}/vcpus` (and the answer to vcpu-pin).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vcpu {
    pub name: String,
    pub id: i64,
    pub vcpu: usize,
    /// Its thread's id.
    pub tid: i64,
    /// The host CPU it last ran on.
    pub cpu: Option<i64>,
    pub cpu_time_s: Option<f64>,
    /// The host CPUs it may run on, as `0-3,6`.
    pub affinity: Option<String>,
}

/// `GET` and `PUT /v1/domains/{dom}/sched`: the credit scheduler's weight
/// and cap (percent of one CPU, 0 for none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sched {
    pub id: i64,
    pub name: String,
    pub weight: u32,
    pub cap: u32,
}

/// The answer to `PUT /v1/domains/{dom}/maxmem`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Maxmem {
    pub id: i64,
    pub name: String,
    pub maxmem_mib: u64,
    pub memory_mib: u64,
    /// The guest's RAM now, for a running domain.
    pub ram_mib: Option<u64>,
    /// The new maximum is above the running guest's RAM: it takes effect
    /// at the domain's next start.
    pub at_next_start: bool,
}

/// `GET /v1/domains/{dom}/console?file=F&from=N`: the next piece of a
/// domain's console log, as `tail -F` reads it. `file` names the log the
/// client was reading (from the previous answer; left out at first) and
/// `from` the byte offset in it; when a restart has started a new log, the
/// rest of the old one comes first, then the new one from its start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleChunk {
    /// The log this piece is from (its inode number), for the next ask.
    pub file: u64,
    /// Where the piece starts in that log.
    pub from: u64,
    /// Where the next ask starts (`from` plus the piece's length in bytes).
    pub next: u64,
    /// The console's output: at most 64 KiB, cut at a character's end (a
    /// byte that is not UTF-8 shows as U+FFFD).
    pub data: String,
    /// The domain has gone away (within the last minute; asked by id): its
    /// log will not grow, and a reader stops at its end.
    pub ended: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_body;

    #[test]
    fn requests_parse_and_refuse_what_they_do_not_know() {
        let c: CreateRequest =
            parse_body(br#"{"config": "name='a'", "overrides": ["memory=512"]}"#).unwrap();
        assert_eq!(c.file, None);
        assert_eq!(c.overrides.unwrap(), ["memory=512"]);
        let e = parse_body::<CreateRequest>(br#"{"config": "x", "colour": 1}"#).unwrap_err();
        assert!(e.contains("unknown field `colour`"), "{e}");
        assert!(parse_body::<CreateRequest>(br#"{"overrides": "memory=1"}"#).is_err());
        let d: DetachRequest = parse_body(br#"{"id": 1}"#).unwrap();
        assert_eq!(d.id.to_string(), "1");
        let d: DetachRequest = parse_body(br#"{"id": "vdb"}"#).unwrap();
        assert_eq!(d.id.to_string(), "vdb");
        assert!(parse_body::<DetachRequest>(br#"{"id": 1.5}"#).is_err());
        let p: PinRequest = parse_body(br#"{"vcpu": "all", "cpus": "0-1"}"#).unwrap();
        assert_eq!(p.vcpu(), Ok(None));
        let p: PinRequest = parse_body(br#"{"vcpu": 3, "cpus": "1"}"#).unwrap();
        assert_eq!(p.vcpu(), Ok(Some(3)));
        let p: PinRequest = parse_body(br#"{"vcpu": "some", "cpus": "1"}"#).unwrap();
        assert!(p.vcpu().is_err());
        assert!(parse_body::<SchedRequest>(br#"{"weight": 5000000000}"#).is_err());
        assert!(parse_body::<SchedRequest>(br#"{"weight": -1}"#).is_err());
        let s: SchedRequest = parse_body(br#"{"cap": null}"#).unwrap();
        assert_eq!(s, SchedRequest::default());
        let h: HostSchedRequest = parse_body(br#"{"tslice_ms": 30}"#).unwrap();
        assert_eq!(h.tslice_ms, Some(30));
        assert!(
            parse_body::<HostSchedRequest>(br#"{"tslice_ms": 30, "ratelimit_us": 1}"#).is_err()
        );
        assert!(parse_body::<HostSchedRequest>(br#"{"tslice_ms": -1}"#).is_err());
        assert!(parse_body::<MemoryRequest>(br#"{"target_mib": "512"}"#).is_err());
    }

    #[test]
    fn states_are_named_once() {
        for st in State::ALL {
            assert_eq!(State::parse(st.as_str()), Some(st));
            let json = serde_json::to_string(&st).unwrap();
            assert_eq!(json, format!("\"{st}\""), "serde and as_str agree");
        }
        assert_eq!(State::parse("sleeping"), None);
    }
}
