//! `domus daemon` (domusd): the control daemon, Xen's Domain0 tools for
//! Domus. One per host. Each domain is a `domus run` process that the
//! daemon starts detached (its own session and cgroup) and manages through
//! the domain's API socket; the daemon's state lives in SQLite under the
//! state directory, so killing the daemon, even with SIGKILL, leaves every
//! domain running, and a new daemon finds them all again.
//!
//! State directory layout: `domusd.sock` (the daemon's REST API),
//! `state.db` (each domain's row: its typed configuration, VMM and
//! state), and `domains/<id>/` with the domain's `api.sock`,
//! `console.log` and `vmm.log`.
//!
//! Where things are: `lifecycle` (create, start, destroy, rename, recovery
//! after a daemon restart, admission control), `supervise` (how a VMM ended,
//! the restart policy, the monitor), `network` (taps, interface hot-plug),
//! `devices` (disk hot-plug), `resources` (memory and CPU settings),
//! `tslice` (the host-wide vCPU time slice),
//! `accounting` (what `list` and the metrics show), `console` (a
//! domain's console log through the API), `host` (/proc and
//! scheduler facts), `cgroup`, `db` (the state database), `auth` (the TCP
//! API's token) and `api` (the REST routes). The daemon starts VMMs
//! through a [`Launcher`] and makes taps and cgroups through [`Taps`] and
//! [`Groups`] (together [`HostOps`]); the tests in `races` and `rollbacks`
//! hand in the stand-ins of `fakes`.

mod accounting;
pub mod api;
mod auth;
pub mod cgroup;
mod clone;
mod console;
pub mod db;
mod defnet;
mod devices;
#[cfg(test)]
mod fakes;
mod host;
mod images;
mod jail;
mod lifecycle;
mod migrate;
mod network;
#[cfg(test)]
mod openapi_check;
pub mod paths;
#[cfg(test)]
mod races;
#[cfg(test)]
mod refusals;
mod resources;
#[cfg(test)]
mod rollbacks;
pub mod rtnl;
mod snapshot;
mod supervise;
pub mod tslice;
pub mod vfr;
mod vifs;
mod vmmcall;
mod watch;

use domus_jail::{Job, Process};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use domus_api::client::VmmClient;
use domus_api::daemon::State;
use domus_api::spec::VmSpec;
use domus_xlcfg::DomainConfig;

pub use auth::{token, TcpApi};
pub use cgroup::{Cgroup2, Groups};
pub use db::{Db, Row};
pub use defnet::{Lease, NetSettings};
pub use host::{allowed_cpus, cpu_seconds, host_memory_mib, rss_bytes, start_time};
pub use network::{HostTaps, Taps};
pub use supervise::Request;

use supervise::Live;
use vmmcall::vmm_error;

/// The state directory: `--state-dir`, else `$DOMUS_STATE_DIR`, else
/// `/var/lib/domus`.
pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("DOMUS_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/lib/domus"))
}

/// Where the daemon keeps the disks it makes for domains booted from an
/// image (their overlays and cloud-init seeds); it serves them as it
/// serves image directories.
pub fn overlay_dir(state: &Path) -> PathBuf {
    state.join("overlays")
}

pub fn socket_path(state: &Path) -> PathBuf {
    state.join("domusd.sock")
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(#[from] domus_xlcfg::ConfigError),
    #[error("a domain named '{0}' exists")]
    NameInUse(String),
    #[error("vsock cid {cid} is domain {name}'s")]
    CidInUse { cid: u64, name: String },
    #[error("no domain '{0}'")]
    NoSuchDomain(String),
    #[error("not enough memory: the domain needs {need} MiB (its maxmem and its VMM's allowance: domains are admitted on the most they may hold), {free} MiB of the host's {total} MiB are free ({used} MiB in domains, {reserve} MiB kept for the host)")]
    NoMemory {
        need: u64,
        free: u64,
        total: u64,
        used: u64,
        reserve: u64,
    },
    #[error("{0}")]
    Invalid(String),
    /// A host file the daemon does not serve to guests (see [`paths`]).
    #[error("{0}")]
    Forbidden(String),
    /// A limit this daemon cannot enforce: it runs with `--no-cgroups`.
    #[error(
        "{0} needs cgroups, and this daemon runs without them (--no-cgroups); nothing was changed"
    )]
    NoCgroups(String),
    #[error("domain {name}: {msg}")]
    Start { name: String, msg: String },
    /// The VMM found the domain's configuration unusable (its exit status
    /// 2): a missing kernel, a disk that is a directory, too little memory.
    #[error("domain {name}: {msg}")]
    Refused { name: String, msg: String },
    #[error("domain {name} is {state}")]
    WrongState { name: String, state: State },
    #[error("state database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("opening the state database: {0}")]
    OpenDb(#[from] db::OpenError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The HTTP status the API answers with.
    pub fn status(&self) -> u16 {
        match self {
            Error::Config(_) | Error::Invalid(_) | Error::Refused { .. } => 400,
            Error::NoSuchDomain(_) => 404,
            Error::Forbidden(_) => 403,
            Error::NameInUse(_)
            | Error::CidInUse { .. }
            | Error::NoMemory { .. }
            | Error::WrongState { .. }
            | Error::NoCgroups(_) => 409,
            _ => 500,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

pub struct Daemon {
    pub state: PathBuf,
    /// [`instance_tag`] of `state`.
    pub tag: String,
    pub domus: PathBuf,
    pub reserve_mib: u64,
    /// The host files domains may be given.
    pub files: paths::Files,
    /// VMMs run under their seccomp filter.
    pub seccomp: bool,
    /// VMMs run jailed, domain N's as user and group `jail + N`; None:
    /// not jailed (--no-jail).
    pub jail: Option<u32>,
    /// How long a starting VMM has to answer on its API.
    start_timeout: std::time::Duration,
    /// The TCP API's certificate fingerprint, when it listens on TCP.
    pub tls_fingerprint: std::sync::OnceLock<String>,
    db: Mutex<Db>,
    live: Mutex<HashMap<i64, Live>>,
    /// Serialises creates and destroys, so concurrent requests never see a
    /// half-made domain.
    lifecycle: Mutex<()>,
    /// cgroups of ended domains the kernel had not let go of yet; the
    /// monitor removes them.
    stale_cgroups: Mutex<Vec<String>>,
    /// Serialises asking vCPU threads for the host-wide time slice (see
    /// [`tslice`]), so a domain starting while it changes ends up with it.
    slicing: Mutex<()>,
    /// Wakes the monitor (see [`watch`]).
    waker: watch::Waker,
    /// When each domain was restarted (by the restart policy), for its
    /// rate limit; kept in memory only.
    restart_log: Mutex<HashMap<i64, Vec<std::time::Instant>>>,
    /// Live migrations sent from here, by domain name.
    migrations: migrate::Migrations,
    /// Taps of interfaces being detached, which a thread removes once the
    /// guest lets go (`network_detach`). Held while a tap is named and
    /// made for a new interface and while such a thread removes one, so a
    /// new interface never gets the name of a tap whose removal is under
    /// way (which would take the new tap's rules with it).
    unplugging: Arc<Mutex<std::collections::HashSet<String>>>,
    host: HostOps,
    /// The default network, once it runs (`--network`; not in tests that
    /// stand in for the host).
    pub network: std::sync::OnceLock<defnet::DefaultNet>,
}

impl Daemon {
    /// The cgroups that enforce `what`; without them (`--no-cgroups`) the
    /// request is refused rather than answered with a limit nothing holds.
    fn enforcing(&self, what: &str) -> Result<&dyn Groups> {
        self.host
            .groups
            .as_deref()
            .ok_or_else(|| Error::NoCgroups(what.to_string()))
    }

    /// A configuration's limits, refused where nothing would enforce them.
    fn check_limits(&self, c: &DomainConfig) -> Result<()> {
        if self.host.groups.is_some() {
            return Ok(());
        }
        let mut set = Vec::new();
        if c.cpu_weight != domus_xlcfg::DEFAULT_CPU_WEIGHT {
            set.push("cpu_weight");
        }
        if c.cap != 0 {
            set.push("cap");
        }
        if c.cpus.is_some() {
            set.push("cpus");
        }
        if set.is_empty() {
            return Ok(());
        }
        Err(Error::NoCgroups(format!(
            "domain {}'s {}",
            c.name,
            set.join(", ")
        )))
    }

    /// A domain's cgroup: named by the instance and the domain's id (cgroup
    /// v2 cannot rename groups, and domains can be renamed).
    fn cgroup_name(&self, id: i64) -> String {
        format!("{}-d{id}", self.tag)
    }

    /// A domain's `i`th tap: `dm`, the instance tag, the id, `n`, the index
    /// (at most 15 characters for ids below 10^6 and up to 10 interfaces).
    pub fn tap_name(&self, id: i64, i: usize) -> String {
        format!("dm{}{id}n{i}", self.tag)
    }
}

/// A domain's cgroup settings, from its configuration.
fn limits(c: &DomainConfig) -> cgroup::Limits {
    cgroup::Limits {
        weight: c.cpu_weight,
        cap: c.cap,
        cpus: c.cpus.clone(),
        maxmem_mib: c.maxmem_mib,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn domain_dir(state: &Path, id: i64) -> PathBuf {
    state.join("domains").join(id.to_string())
}

/// Four hex digits naming a state directory, so that daemons with
/// different state directories on one host (a test's and the system's)
/// never share cgroups or taps.
pub fn instance_tag(state: &Path) -> String {
    let h = state
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        });
    format!("{:04x}", h & 0xffff)
}

/// How the daemon starts a VMM process: `domus run --config` (the command
/// it is handed) in production; the daemon's own tests hand in a stand-in
/// VMM, so its lifecycle and races are tested without KVM.
pub trait Launcher: Send + Sync {
    /// Starts the VMM of `spec` (whose file `job` names).
    fn launch(&self, job: Job, spec: &VmSpec) -> std::io::Result<Process>;
    /// Whether no VM on the host (the daemon's or any other VMM's) holds
    /// vsock CID `cid`: the daemon asks before it picks CIDs itself.
    fn vsock_cid_free(&self, cid: u64) -> bool;
}

/// What the daemon does to the host, each behind a trait so that its tests
/// hand in stand-ins: how VMMs start, the taps, the cgroups.
pub struct HostOps {
    pub launcher: Box<dyn Launcher>,
    pub taps: Arc<dyn Taps>,
    /// None: the host has no cgroup v2 controllers (no weights, caps or
    /// memory.max).
    pub groups: Option<Box<dyn Groups>>,
    /// The virtual firewall-router (None: `--no-vfr`).
    pub firewall: Option<Arc<dyn vfr::Firewall>>,
}

impl HostOps {
    /// The host's own: `domus run` processes, taps made through rtnetlink, and
    /// (with `cgroups`) cgroup v2 under /sys/fs/cgroup, which must have the
    /// controllers the limits need: a daemon never runs without them
    /// unless told to (`--no-cgroups`).
    pub fn real(cgroups: bool) -> Result<Self> {
        let groups = if cgroups {
            let g = Cgroup2::host().map_err(|e| {
                Error::Invalid(format!(
                    "{e}: domains could not be given CPU weights, caps, CPU lists or memory \
                     limits; mount cgroup v2 with those controllers, or start the daemon with \
                     --no-cgroups to run without any limits"
                ))
            })?;
            Some(Box::new(g) as Box<dyn Groups>)
        } else {
            None
        };
        Ok(Self {
            launcher: Box::new(Exec),
            taps: Arc::new(HostTaps),
            groups,
            firewall: None,
        })
    }
}

/// What the daemon admits.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Memory kept for the host (MiB): domains together are admitted on
    /// at most the host's memory minus this.
    pub reserve_mib: u64,
    /// The host files domains may be given.
    pub files: paths::Files,
    /// VMMs run under their seccomp filter (`domus run --seccomp`).
    pub seccomp: bool,
    /// VMMs run jailed ([`domus_jail`]), domain N's as user and group
    /// `jail + N`; None: not jailed (`--no-jail`).
    pub jail: Option<u32>,
    /// How long a starting VMM has to answer on its API before the create
    /// fails (`--start-timeout`, default [`START_TIMEOUT_S`]).
    pub start_timeout_s: u64,
}

/// The default of [`Policy::start_timeout_s`]: a VMM answers within a
/// second or two on an idle host, but many created at once on a busy one
/// (64 on two slow CPUs) take tens of seconds, and a create should not fail
/// only because the host is busy.
pub const START_TIMEOUT_S: u64 = 60;

/// The first user and group id of the jails' range by default: far above
/// the ranges distributions give users and containers (subuid ranges
/// start at 100000 and are 65536 wide).
pub const JAIL_ID_BASE: u32 = 1_500_000_000;

#[cfg(test)]
impl Policy {
    /// Tests of other concerns: no reserve, any file.
    pub fn any() -> Self {
        Self {
            reserve_mib: 0,
            files: paths::Files {
                any: true,
                ..paths::Files::new(Vec::new(), Vec::new())
            },
            seccomp: true,
            jail: None,
            start_timeout_s: START_TIMEOUT_S,
        }
    }
}

/// How `domus daemon` runs: its options.
pub struct Settings {
    pub policy: Policy,
    /// The default network (None: `--no-network`).
    pub network: Option<defnet::NetSettings>,
    /// Also serve the API on TCP.
    pub tcp: Option<TcpApi>,
    /// Run without cgroups (no CPU or memory limits).
    pub no_cgroups: bool,
    /// Run without the virtual firewall-router (`--no-vfr`).
    pub no_vfr: bool,
}

/// Runs the command.
struct Exec;

impl Launcher for Exec {
    fn launch(&self, job: Job, _spec: &VmSpec) -> std::io::Result<Process> {
        domus_jail::spawn(job)
    }

    fn vsock_cid_free(&self, cid: u64) -> bool {
        host_vsock_cid_free(cid)
    }
}

/// Asks the host kernel whether vsock CID `cid` is free: claims it on a
/// vhost-vsock of our own, which fails with EADDRINUSE while any VM holds
/// it, and lets it go again by closing that. True when the host has no
/// vhost-vsock to ask: the VMM then says what is missing.
fn host_vsock_cid_free(cid: u64) -> bool {
    use std::os::fd::AsRawFd;
    /// `_IOW(VHOST_VIRTIO, 0x60, __u64)` from linux/vhost.h.
    const VHOST_VSOCK_SET_GUEST_CID: libc::c_ulong = 0x4008_af60;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/vhost-vsock")
    else {
        return true;
    };
    // SAFETY: the ioctl reads one u64 from a live local, on our own fd.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), VHOST_VSOCK_SET_GUEST_CID as _, &cid) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EADDRINUSE)
}

impl Daemon {
    /// Opens the state and finds the domains a previous daemon left,
    /// admitting domains by `policy` and acting on the host through `host`.
    pub fn open(
        state: PathBuf,
        domus: PathBuf,
        policy: Policy,
        host: HostOps,
    ) -> Result<Arc<Self>> {
        let Policy {
            reserve_mib,
            files,
            seccomp,
            jail,
            start_timeout_s,
        } = policy;
        std::fs::create_dir_all(state.join("domains"))?;
        std::fs::create_dir_all(state.join("images"))?;
        let db = Db::open(&state.join("state.db"), &upgrade)?;
        private(&state)?;
        let d = Arc::new(Self {
            tag: instance_tag(&state),
            state,
            domus,
            reserve_mib,
            files,
            seccomp,
            jail,
            start_timeout: std::time::Duration::from_secs(start_timeout_s),
            tls_fingerprint: std::sync::OnceLock::new(),
            db: Mutex::new(db),
            live: Mutex::new(HashMap::new()),
            lifecycle: Mutex::new(()),
            stale_cgroups: Mutex::new(Vec::new()),
            slicing: Mutex::new(()),
            waker: watch::Waker::new()?,
            restart_log: Mutex::new(HashMap::new()),
            migrations: Mutex::new(HashMap::new()),
            unplugging: Arc::default(),
            network: std::sync::OnceLock::new(),
            host,
        });
        d.recover()?;
        Ok(d)
    }

    /// An event of the daemon itself: to its log (`tracing`, on stderr)
    /// and to the stored log `dmesg` shows.
    /// The bridge a vif goes on: its own `bridge=`, else the default
    /// network's (none: a tap on no bridge).
    pub(crate) fn bridge_of<'a>(&'a self, v: &'a domus_api::domain::Vif) -> Option<&'a str> {
        v.bridge
            .as_deref()
            .or_else(|| self.network.get().map(|n| n.settings.bridge.as_str()))
    }

    pub fn log(&self, msg: &str) {
        tracing::info!("{msg}");
        lock(&self.db).log(msg);
    }

    /// An event of domain `domain`, with the domain as a field of the log
    /// line; `warn` for what went wrong (a crash, a failed start).
    pub(crate) fn log_domain(&self, domain: &str, warn: bool, msg: &str) {
        if warn {
            tracing::warn!(domain, "{msg}");
        } else {
            tracing::info!(domain, "{msg}");
        }
        lock(&self.db).log(msg);
    }

    /// Finds a domain by id or name.
    pub fn find(&self, dom: &str) -> Result<db::Row> {
        let db = lock(&self.db);
        let rows = db.all()?;
        rows.into_iter()
            .find(|r| r.name == dom || dom.parse::<i64>().is_ok_and(|id| id == r.id))
            .ok_or_else(|| Error::NoSuchDomain(dom.into()))
    }

    fn api_sock(&self, r: &db::Row) -> PathBuf {
        domain_dir(&self.state, r.id).join("api.sock")
    }

    /// A typed client of domain `r`'s own API, if it is running.
    fn vmm(&self, r: &db::Row) -> Result<VmmClient> {
        if r.state != State::Running {
            return Err(Error::WrongState {
                name: r.name.clone(),
                state: r.state,
            });
        }
        Ok(VmmClient::new(self.api_sock(r)))
    }

    /// Changes domain `id`'s stored configuration with `change`, which
    /// sees the latest one (what changed since `id` was looked up
    /// included), so the change outlives restarts.
    fn update_config(
        &self,
        id: i64,
        change: impl FnOnce(&mut DomainConfig) -> Result<()>,
    ) -> Result<DomainConfig> {
        let db = lock(&self.db);
        let mut c = db
            .get(id)?
            .ok_or_else(|| Error::NoSuchDomain(id.to_string()))?
            .config;
        change(&mut c)?;
        db.set_config(id, &c)?;
        Ok(c)
    }
}

/// A version 0 database's domain configuration (xl.cfg text, its file and
/// directory, `key=value` overrides), parsed as that daemon did on every
/// use; now once.
fn upgrade(l: &db::Legacy) -> std::result::Result<DomainConfig, String> {
    let mut c = domus_xlcfg::load(&l.cfg_file, &l.cfg_text, &l.overrides)
        .map_err(|e| e.to_string())?
        .config;
    c.make_absolute(Path::new(&l.cfg_dir));
    c.name = l.name.clone();
    Ok(c)
}

/// Makes the state directory and the database the owner's alone (0700 and
/// 0600): they hold every domain's configuration, console and sockets.
/// Whatever the daemon makes later is too (`run` sets its umask).
fn private(state: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700))?;
    for f in ["state.db", "state.db-wal", "state.db-shm"] {
        match std::fs::set_permissions(state.join(f), std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
    }
    Ok(())
}

/// The most TCP connections served at once.
const TCP_CONNECTIONS: usize = 64;

/// Runs the daemon until it is killed: serves the API and monitors domains.
pub fn run(state: PathBuf, settings: Settings) -> Result<()> {
    let Settings {
        policy,
        network,
        tcp,
        no_cgroups,
        no_vfr,
    } = settings;
    // What the daemon and the VMMs it starts make (logs, sockets, specs)
    // is the owner's alone.
    // SAFETY: umask(2) only sets the process's file-creation mask.
    unsafe { libc::umask(0o077) };
    // Before anything is bound or opened: a host that cannot enforce limits
    // is refused at once (unless --no-cgroups).
    let mut host = HostOps::real(!no_cgroups)?;
    if !no_vfr {
        host.firewall = Some(Arc::new(vfr::Nft::new(&instance_tag(&state))));
    }
    let domus = std::env::current_exe()?;
    std::fs::create_dir_all(&state)?;
    let listener = domus_http::bind(&socket_path(&state))
        .map_err(|e| Error::Invalid(format!("{}: {e}", socket_path(&state).display())))?;
    let tcp = match tcp {
        Some(t) => {
            let token = token(&t.token_file)?;
            let identity = auth::tls_identity(&t)?;
            let l = std::net::TcpListener::bind(&t.addr)
                .map_err(|e| Error::Invalid(format!("listening on {}: {e}", t.addr)))?;
            Some((l, token, identity, t))
        }
        None => None,
    };
    let d = Daemon::open(state, domus, policy, host)?;
    d.log(&format!(
        "started (state {}, images from {}, {} block devices served)",
        d.state.display(),
        paths::shown(&d.files.image_dirs).join(", "),
        d.files.block_devices.len()
    ));
    if d.jail.is_none() {
        let msg = "VMMs run WITHOUT their jail (--no-jail): each runs as root with every \
                   capability, in the host's namespaces and root, so a guest that takes over \
                   its VMM owns the host: every other domain's disks, the daemon's state";
        tracing::warn!("{msg}");
        d.log(msg);
    }
    if !d.seccomp {
        let msg = "VMMs run WITHOUT their seccomp filter (--no-seccomp): a guest that takes \
                   over its VMM can make any system call";
        tracing::warn!("{msg}");
        d.log(msg);
    }
    let in_memory: Vec<String> = std::iter::once(&d.state)
        .chain(&d.files.image_dirs)
        .filter(|p| !no_cgroups && host::in_memory_fs(p))
        .map(|p| p.display().to_string())
        .collect();
    if !in_memory.is_empty() {
        let msg = format!(
            "{} on tmpfs: a VMM's writes into disk images there are charged to its domain's \
             memory cgroup and cannot be reclaimed, so a domain whose disk writes and guest \
             memory together pass its memory.max (maxmem + {} MiB) is killed; use a disk \
             file system",
            in_memory.join(", "),
            cgroup::VMM_ALLOWANCE_MIB
        );
        tracing::warn!("{msg}");
        d.log(&msg);
    }
    if no_cgroups {
        let msg = "running WITHOUT cgroups (--no-cgroups): domains get no CPU weights, caps, \
                   CPU lists or memory limits, and requests that would set one are refused";
        tracing::warn!("{msg}");
        d.log(msg);
    }
    if let Some(n) = network {
        let net =
            defnet::DefaultNet::start(&d.state, &n, Arc::new(|m: String| tracing::info!("{m}")))
                .map_err(|e| {
                    Error::Invalid(format!(
                    "the default network on {} ({}/{}): {e}; start the daemon with --no-network \
                     to run without it",
                    n.bridge, n.gateway, n.prefix
                ))
                })?;
        d.log(&format!(
            "default network: bridge {} with {}/{} (NAT, DHCP and DNS from dnsmasq)",
            n.bridge, n.gateway, n.prefix
        ));
        let _ = d.network.set(net);
    }
    if no_vfr {
        let msg = "running WITHOUT the virtual firewall-router (--no-vfr): domains' interfaces \
                   are not filtered, so a domain can send frames with any MAC or address";
        tracing::warn!("{msg}");
        d.log(msg);
        // A table an earlier daemon of this state left would drop its
        // taps that it does not name (vfr's base rules): gone, as asked.
        let t = vfr::table_name(&d.tag);
        let _ = vfr::nft(&format!("add table bridge {t}\ndelete table bridge {t}\n"));
    }
    // The rules of exactly the domains that run, whatever the last daemon
    // left; then the DHCP leases, as dnsmasq gives them.
    d.reconcile_vfr()?;
    d.watch_leases();
    let h = d.clone();
    domus_http::spawn_server(
        "domusd-api",
        listener,
        Arc::new(move |r| api::handle(&h, r)),
    )?;
    if let Some((l, token, identity, t)) = tcp {
        let _ = d.tls_fingerprint.set(identity.fingerprint.clone());
        d.log(&format!(
            "listening on tcp {} with TLS, certificate {} ({}{}), bearer token in {}",
            l.local_addr().map_or(t.addr.clone(), |a| a.to_string()),
            t.cert.display(),
            if identity.made { "made now, " } else { "" },
            identity.fingerprint,
            t.token_file.display()
        ));
        // Printed too, for whoever started the daemon to hand to clients.
        eprintln!(
            "domus daemon: TLS certificate fingerprint {} (clients: DOMUS_TLS_FINGERPRINT)",
            identity.fingerprint
        );
        let h = d.clone();
        // The token is checked as soon as the head is in (a client without
        // it never gets its body read), each request has one deadline, and
        // connections are capped, so unauthenticated clients cannot hold
        // the daemon; the local socket has its own cap.
        let policy = domus_http::Policy {
            max_connections: TCP_CONNECTIONS,
            gate: Some(Arc::new(move |r| {
                (!domus_http::bearer_ok(r, &token)).then(|| {
                    domus_http::Response::error(
                        401,
                        "this API needs 'Authorization: Bearer TOKEN' (the daemon's token file)",
                    )
                })
            })),
            ..domus_http::Policy::default()
        };
        domus_http::tls::spawn_tls_server(
            "domusd-tls",
            l,
            &identity,
            policy,
            Arc::new(move |r| api::handle(&h, r)),
        )?;
    }
    loop {
        d.monitor_once();
        d.wait_for_change();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dir_precedence() {
        assert_eq!(state_dir(Some("/x".into())), PathBuf::from("/x"));
    }
}
