//! `domus daemon` (domusd): the control daemon, Xen's Domain0 tools for
//! Domus. One per host. Each domain is a `domus run` process that the
//! daemon starts detached (its own session and cgroup) and manages through
//! the domain's API socket; the daemon's state lives in SQLite under the
//! state directory, so killing the daemon, even with SIGKILL, leaves every
//! domain running, and a new daemon finds them all again.
//!
//! State directory layout: `domusd.sock` (the daemon's REST API),
//! `state.db`, and `domains/<id>/` with the domain's `api.sock`,
//! `console.log` and `vmm.log`.

pub mod api;
pub mod cgroup;
pub mod db;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use domus_api::client::{ClientError, VmmClient};
use domus_api::vmm::{DeviceInfo, PlugRequest};
use domus_xlcfg::{Action, DomainConfig};
use serde_json::{json, Value};

pub use db::{Db, Row};

/// The state directory: `--state-dir`, else `$DOMUS_STATE_DIR`, else
/// `/var/lib/domus`.
pub fn state_dir(arg: Option<PathBuf>) -> PathBuf {
    arg.or_else(|| std::env::var_os("DOMUS_STATE_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/lib/domus"))
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
    #[error("no domain '{0}'")]
    NoSuchDomain(String),
    #[error("not enough memory: the domain needs {need} MiB, {free} MiB of the host's {total} MiB are free ({used} MiB in domains, {reserve} MiB kept for the host)")]
    NoMemory {
        need: u64,
        free: u64,
        total: u64,
        used: u64,
        reserve: u64,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("domain {name}: {msg}")]
    Start { name: String, msg: String },
    #[error("domain {name} is {state}")]
    WrongState { name: String, state: String },
    #[error("state database: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The HTTP status the API answers with.
    pub fn status(&self) -> u16 {
        match self {
            Error::Config(_) | Error::Invalid(_) => 400,
            Error::NoSuchDomain(_) => 404,
            Error::NameInUse(_) | Error::NoMemory { .. } | Error::WrongState { .. } => 409,
            _ => 500,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A typed answer as JSON, for the daemon's own (still untyped) answers.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// A failed call to domain `r`'s own API, as the daemon reports it.
fn vmm_error(r: &db::Row) -> impl FnOnce(ClientError) -> Error + '_ {
    move |e| Error::Invalid(format!("domain {}: {e}", r.name))
}

/// Host facts for admission control and `domus info`.
pub fn host_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib >> 10)
}

/// A process's start time (clock ticks after boot), to tell it from a
/// later process with the same pid.
pub fn start_time(pid: i64) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// User + system CPU seconds of one thread or process stat file.
pub fn cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

/// The VMM's resident memory.
pub fn rss_bytes(pid: i64) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib << 10)
}

/// A thread's CPU affinity.
pub fn affinity(tid: i64) -> Option<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`.
    let r = unsafe {
        libc::sched_getaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &mut set)
    };
    if r != 0 {
        return None;
    }
    // SAFETY: CPU_ISSET reads the set for in-range indices.
    Some(
        (0..libc::CPU_SETSIZE as u32)
            .filter(|c| unsafe { libc::CPU_ISSET(*c as usize, &set) })
            .collect(),
    )
}

fn set_affinity(tid: i64, cpus: &[u32]) -> Result<()> {
    // SAFETY: as above.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus {
        // SAFETY: CPU_SET writes in-range indices (checked by the caller
        // against the host's CPUs, far below CPU_SETSIZE).
        unsafe { libc::CPU_SET(*c as usize, &mut set) };
    }
    // SAFETY: the pointer and size describe `set`.
    let r = unsafe {
        libc::sched_setaffinity(tid as i32, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        return Err(Error::Invalid(format!(
            "pinning thread {tid}: {} (outside the domain's cpus?)",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// "0-2,5" for [0, 1, 2, 5].
pub fn cpulist(cpus: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Whether `pid` is still the process that started at `start` and has not
/// exited (a zombie has).
fn alive(pid: i64, start: Option<i64>) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with(['Z', 'X'])))
        .unwrap_or(true);
    start.is_some() && !zombie && start_time(pid) == start
}

/// What the daemon knows about a running domain beyond its row.
#[derive(Default)]
struct Live {
    child: Option<Child>,
    restart_at: Option<Instant>,
    /// A shutdown or reboot asked of the guest (the power button pressed)
    /// that has not happened yet.
    requested: Option<Request>,
}

/// What `shutdown` and `reboot` ask of a guest. Both press its ACPI power
/// button; a reboot then treats the power-off as a reboot (applies
/// on_reboot), as libvirt does for guests without a reboot button.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    PowerOff,
    Reboot,
}

impl Request {
    pub fn as_str(self) -> &'static str {
        match self {
            Request::PowerOff => "poweroff",
            Request::Reboot => "reboot",
        }
    }
}

/// An exit status in words, for the log.
fn describe_status(status: Option<ExitStatus>) -> String {
    match status {
        None => "killed: it was started by an earlier daemon and left no exit file".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => s.to_string(),
        },
    }
}

/// How a VMM that was not our child ended, from the exit file it writes
/// (`domus run --exit-file`) in the domain's directory `dir`: its exit
/// status as a wait status, or None when it wrote none (it was killed).
fn exit_file_status(dir: &Path) -> Option<ExitStatus> {
    let text = std::fs::read_to_string(dir.join("exit")).ok()?;
    let code: i32 = text.split_whitespace().next()?.parse().ok()?;
    (0..=255)
        .contains(&code)
        .then(|| ExitStatus::from_raw(code << 8))
}

/// The last `n` lines of a text file, or nothing.
fn tail(path: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// How a domain's VMM ended, from its exit status (see `domus run --help`)
/// and what had been asked of it.
fn end_kind(code: Option<i32>, requested: Option<Request>) -> &'static str {
    match (code, requested) {
        (Some(3), _) => "rebooted",
        (Some(0) | None, Some(Request::Reboot)) => "rebooted",
        (Some(0), _) | (None, Some(Request::PowerOff)) => "powered off",
        _ => "crashed",
    }
}

pub struct Daemon {
    pub state: PathBuf,
    /// [`instance_tag`] of `state`.
    pub tag: String,
    pub domus: PathBuf,
    pub cgroup_base: Option<PathBuf>,
    pub reserve_mib: u64,
    db: Mutex<Db>,
    live: Mutex<HashMap<i64, Live>>,
    /// Serialises creates and destroys, so concurrent requests never see a
    /// half-made domain.
    lifecycle: Mutex<()>,
    /// cgroups of ended domains the kernel had not let go of yet; the
    /// monitor removes them.
    stale_cgroups: Mutex<Vec<String>>,
}

impl Daemon {
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

fn ip(args: &[&str]) -> std::io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Daemon {
    /// Opens the state and finds the domains a previous daemon left.
    pub fn open(state: PathBuf, domus: PathBuf, reserve_mib: u64) -> Result<Arc<Self>> {
        std::fs::create_dir_all(state.join("domains"))?;
        let db = Db::open(&state.join("state.db"))?;
        let base = cgroup::root();
        let cgroup_base = base.join("cgroup.controllers").exists().then_some(base);
        let d = Arc::new(Self {
            tag: instance_tag(&state),
            state,
            domus,
            cgroup_base,
            reserve_mib,
            db: Mutex::new(db),
            live: Mutex::new(HashMap::new()),
            lifecycle: Mutex::new(()),
            stale_cgroups: Mutex::new(Vec::new()),
        });
        d.recover()?;
        Ok(d)
    }

    pub fn log(&self, msg: &str) {
        eprintln!("domusd: {msg}");
        lock(&self.db).log(msg);
    }

    fn recover(&self) -> Result<()> {
        let rows = lock(&self.db).all()?;
        // Groups of domains that ended while no daemon ran, or that the last
        // daemon had not removed yet.
        if let Some(base) = &self.cgroup_base {
            let known: Vec<String> = rows.iter().map(|r| self.cgroup_name(r.id)).collect();
            let prefix = format!("{}-d", self.tag);
            lock(&self.stale_cgroups).extend(
                cgroup::list(base, &prefix)
                    .into_iter()
                    .filter(|n| !known.contains(n)),
            );
        }
        for r in rows {
            match r.state.as_str() {
                // A create the last daemon did not finish: undo it.
                "creating" => {
                    if let Some(pid) = r.pid {
                        if alive(pid, r.start_time) {
                            // SAFETY: kill(2) on a pid we started.
                            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                        }
                    }
                    self.cleanup(&r)?;
                    self.log(&format!("removed half-created domain {}", r.name));
                }
                "running" if r.pid.is_some_and(|p| alive(p, r.start_time)) => {
                    lock(&self.live).insert(r.id, Live::default());
                    self.log(&format!("found domain {} (pid {:?})", r.name, r.pid));
                }
                "running" => {
                    self.log(&format!("domain {} ended while no daemon ran", r.name));
                    self.ended(&r, exit_file_status(&domain_dir(&self.state, r.id)))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn load(&self, r: &db::Row) -> Result<DomainConfig> {
        let overrides: Vec<String> = serde_json::from_str(&r.overrides).unwrap_or_default();
        let mut c = domus_xlcfg::load(&r.cfg_file, &r.cfg_text, &overrides)?.config;
        let dir = Path::new(&r.cfg_dir);
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        };
        abs(&mut c.kernel);
        if let Some(r) = c.ramdisk.as_mut() {
            abs(r);
        }
        for d in &mut c.disks {
            abs(&mut d.path);
        }
        c.name = r.name.clone();
        Ok(c)
    }

    /// Finds a domain by id or name.
    pub fn find(&self, dom: &str) -> Result<db::Row> {
        let db = lock(&self.db);
        let rows = db.all()?;
        rows.into_iter()
            .find(|r| r.name == dom || dom.parse::<i64>().is_ok_and(|id| id == r.id))
            .ok_or_else(|| Error::NoSuchDomain(dom.into()))
    }

    fn used_mib(&self, except: Option<i64>) -> Result<u64> {
        Ok(lock(&self.db)
            .all()?
            .iter()
            .filter(|r| Some(r.id) != except && r.state != "shutdown" && r.state != "crashed")
            .map(|r| r.memory_mib as u64)
            .sum())
    }

    fn admit(&self, need: u64, except: Option<i64>) -> Result<()> {
        let total = host_memory_mib();
        let used = self.used_mib(except)?;
        let free = total.saturating_sub(self.reserve_mib).saturating_sub(used);
        if need > free {
            return Err(Error::NoMemory {
                need,
                free,
                total,
                used,
                reserve: self.reserve_mib,
            });
        }
        Ok(())
    }

    /// Creates and starts a domain from a configuration file's text.
    pub fn create(
        &self,
        file: &str,
        dir: &str,
        text: &str,
        overrides: &[String],
    ) -> Result<(Value, Vec<String>)> {
        let loaded = domus_xlcfg::load(file, text, overrides)?;
        let c = &loaded.config;
        // The name check, admission and the row (which reserves the name and
        // the memory) happen under the lifecycle lock; starting the VMM does
        // not, so creates run side by side.
        let guard = lock(&self.lifecycle);
        if lock(&self.db).all()?.iter().any(|r| r.name == c.name) {
            return Err(Error::NameInUse(c.name.clone()));
        }
        self.admit(c.memory_mib, None)?;
        let row = db::Row {
            id: 0,
            name: c.name.clone(),
            cfg_text: text.into(),
            cfg_file: file.into(),
            cfg_dir: dir.into(),
            overrides: serde_json::to_string(overrides).unwrap_or_else(|_| "[]".into()),
            pid: None,
            start_time: None,
            state: "creating".into(),
            restarts: 0,
            memory_mib: c.memory_mib as i64,
        };
        let id = lock(&self.db).insert(&row)?;
        drop(guard);
        let row = db::Row { id, ..row };
        match self.start(&row) {
            Ok(()) => {
                let Some(r) = lock(&self.db).get(id)? else {
                    // Destroyed while it started: take the new VMM down too.
                    if let Some(mut l) = lock(&self.live).remove(&id) {
                        if let Some(ch) = l.child.as_mut() {
                            let _ = ch.kill();
                            let _ = ch.wait();
                        }
                    }
                    self.cleanup(&row)?;
                    return Err(Error::NoSuchDomain(format!(
                        "{} (destroyed while it was being created)",
                        c.name
                    )));
                };
                self.log(&format!("created domain {} (id {id})", c.name));
                Ok((self.describe(&r), loaded.warnings))
            }
            Err(e) => {
                self.log(&format!("creating {} failed: {e}", c.name));
                // A destroy that came in meanwhile removed the row; what the
                // start made after that (directory, cgroup, taps) goes now.
                let Some(r) = lock(&self.db).get(id)? else {
                    self.cleanup(&row)?;
                    return Err(e);
                };
                if let Some(pid) = r.pid.filter(|p| alive(*p, r.start_time)) {
                    // SAFETY: kill(2) on the VMM we started (still the same
                    // process: its start time matches).
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
                if let Some(mut l) = lock(&self.live).remove(&id) {
                    if let Some(ch) = l.child.as_mut() {
                        let _ = ch.kill();
                        let _ = ch.wait();
                    }
                }
                self.cleanup(&r)?;
                Err(e)
            }
        }
    }

    /// Starts the VMM of a domain whose row exists; waits until its API
    /// answers.
    fn start(&self, r: &db::Row) -> Result<()> {
        let c = self.load(r)?;
        let dir = domain_dir(&self.state, r.id);
        std::fs::create_dir_all(&dir)?;
        let api = dir.join("api.sock");
        let mut cmd = Command::new(&self.domus);
        cmd.arg("run")
            .arg("--name")
            .arg(&c.name)
            .arg("--kernel")
            .arg(&c.kernel)
            .arg("--cmdline")
            .arg(&c.cmdline)
            .arg("--vcpus")
            .arg(c.vcpus.to_string())
            .arg("--memory")
            .arg(format!("{}M", c.maxmem_mib))
            .arg("--console")
            .arg(format!("file:{}", dir.join("console.log").display()))
            .arg("--api-socket")
            .arg(&api)
            .arg("--exit-file")
            .arg(dir.join("exit"))
            .arg("--balloon");
        if let Some(rd) = &c.ramdisk {
            cmd.arg("--initrd").arg(rd);
        }
        for d in &c.disks {
            cmd.arg("--disk").arg(format!(
                "{}{}",
                d.path.display(),
                if d.read_only { ",ro" } else { "" }
            ));
        }
        // A restart finds the taps of the VMM that ended (hot-plugged ones
        // too): start afresh.
        for t in self.taps(r.id) {
            let _ = ip(&["link", "del", &t]);
        }
        for (i, v) in c.vifs.iter().enumerate() {
            let tap = self.tap_name(r.id, i);
            ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
            if let Some(br) = &v.bridge {
                ip(&["link", "set", &tap, "master", br])?;
            }
            ip(&["link", "set", &tap, "up"])?;
            let mut spec = format!("tap={tap}");
            if let Some(m) = &v.mac {
                spec.push_str(&format!(",mac={m}"));
            }
            if let Some(rate) = v.rate {
                spec.push_str(&format!(",bw={rate}"));
            }
            cmd.arg("--net").arg(spec);
        }
        // A restart keeps the last run's logs, as vmm.log.1 and console.log.1.
        let _ = std::fs::remove_file(dir.join("exit"));
        for f in ["vmm.log", "console.log"] {
            let _ = std::fs::rename(dir.join(f), dir.join(format!("{f}.1")));
        }
        let log = std::fs::File::create(dir.join("vmm.log"))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log));
        let procs = match &self.cgroup_base {
            Some(base) => {
                let g = cgroup::create(base, &self.cgroup_name(r.id), &limits(&c))?;
                Some(
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(g.join("cgroup.procs"))?,
                )
            }
            None => None,
        };
        let procs_fd = procs.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        // SAFETY: the closure runs in the child between fork and exec and
        // only makes async-signal-safe calls (setsid, write) on memory and
        // descriptors that exist before the fork.
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                if let Some(fd) = procs_fd {
                    // "0": the writing process itself joins the group.
                    if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn()?;
        drop(procs);
        let pid = i64::from(child.id());
        let st = start_time(pid).unwrap_or(0);
        lock(&self.db).set_running(r.id, pid, st)?;
        // Wait for the API to answer (or the VMM to fail).
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("vmm.log")).unwrap_or_default();
                return Err(Error::Start {
                    name: c.name.clone(),
                    msg: format!("domus run exited ({status}): {}", log.trim()),
                });
            }
            if VmmClient::new(&api).domain().is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Start {
                    name: c.name.clone(),
                    msg: "its API did not answer within 15 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        lock(&self.live).insert(
            r.id,
            Live {
                child: Some(child),
                ..Live::default()
            },
        );
        if c.memory_mib < c.maxmem_mib {
            let _ = VmmClient::new(&api).set_balloon(c.memory_mib);
        }
        Ok(())
    }

    /// Removes everything of a domain: taps, cgroup, files, row.
    fn cleanup(&self, r: &db::Row) -> Result<()> {
        let c = self.load(r).ok();
        let n = c.as_ref().map_or(0, |c| c.vifs.len());
        let mut taps: Vec<String> = (0..n).map(|i| self.tap_name(r.id, i)).collect();
        taps.extend(self.taps(r.id));
        taps.dedup();
        for t in taps {
            let _ = ip(&["link", "del", &t]);
        }
        if let Some(base) = &self.cgroup_base {
            let name = self.cgroup_name(r.id);
            cgroup::kill(base, &name);
            if let Err(e) = cgroup::remove(base, &name, Duration::from_secs(1)) {
                self.log(&format!("{e}: removing it later"));
                lock(&self.stale_cgroups).push(name);
            }
        }
        let _ = std::fs::remove_dir_all(domain_dir(&self.state, r.id));
        lock(&self.db).delete(r.id)?;
        // A VMM still running here was started by a create that raced this
        // cleanup (its start() put it in `live` after the caller looked):
        // it must not outlive its row.
        let live = lock(&self.live).remove(&r.id);
        if let Some(mut ch) = live.and_then(|l| l.child) {
            let _ = ch.kill();
            let _ = ch.wait();
        }
        Ok(())
    }

    /// Destroys a domain at once (xl destroy): kills its VMM, releases
    /// everything.
    pub fn destroy(&self, dom: &str) -> Result<()> {
        let _guard = lock(&self.lifecycle);
        let r = self.find(dom)?;
        lock(&self.db).set_state(r.id, "destroying")?;
        let child = lock(&self.live).remove(&r.id).and_then(|l| l.child);
        if let Some(pid) = r.pid {
            if alive(pid, r.start_time) {
                // SAFETY: kill(2) on the domain's VMM.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
            match child {
                Some(mut ch) => {
                    let _ = ch.wait();
                }
                None => {
                    let end = Instant::now() + Duration::from_secs(5);
                    while alive(pid, r.start_time) && Instant::now() < end {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            }
        }
        self.cleanup(&r)?;
        self.log(&format!("destroyed domain {}", r.name));
        Ok(())
    }

    fn api_sock(&self, r: &db::Row) -> PathBuf {
        domain_dir(&self.state, r.id).join("api.sock")
    }

    /// A typed client of domain `r`'s own API, if it is running.
    fn vmm(&self, r: &db::Row) -> Result<VmmClient> {
        if r.state != "running" {
            return Err(Error::WrongState {
                name: r.name.clone(),
                state: r.state.clone(),
            });
        }
        Ok(VmmClient::new(self.api_sock(r)))
    }

    /// Pauses (or, with `false`, resumes) a running domain's vCPUs.
    pub fn pause(&self, dom: &str, paused: bool) -> Result<()> {
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let done = if paused { api.pause() } else { api.resume() };
        done.map(drop).map_err(vmm_error(&r))
    }

    /// A running domain's devices, as its VMM shows them.
    pub fn devices(&self, dom: &str) -> Result<Vec<DeviceInfo>> {
        let r = self.find(dom)?;
        self.vmm(&r)?.devices().map_err(vmm_error(&r))
    }

    /// Asks the guest to power off or reboot: presses its ACPI power
    /// button and remembers the request. The domain's on_poweroff or
    /// on_reboot action applies once the guest has stopped.
    pub fn shutdown(&self, dom: &str, what: Request) -> Result<()> {
        let r = self.find(dom)?;
        self.vmm(&r)?.power_button().map_err(vmm_error(&r))?;
        if let Some(l) = lock(&self.live).get_mut(&r.id) {
            l.requested = Some(what);
        }
        self.log(&format!(
            "asked domain {} to {} (power button)",
            r.name,
            what.as_str()
        ));
        Ok(())
    }

    pub fn mem_set(&self, dom: &str, mib: u64) -> Result<Value> {
        let r = self.find(dom)?;
        let c = self.load(&r)?;
        if mib > c.maxmem_mib || mib < 64 {
            return Err(Error::Invalid(format!(
                "{mib} MiB is outside 64 MiB to maxmem ({} MiB)",
                c.maxmem_mib
            )));
        }
        if mib > r.memory_mib as u64 {
            self.admit(mib, Some(r.id))?;
        }
        let b = self.vmm(&r)?.set_balloon(mib).map_err(vmm_error(&r))?;
        lock(&self.db).set_memory(r.id, mib as i64)?;
        Ok(to_json(&b))
    }

    /// mem-max: the most memory the domain may have. It bounds `mem-set` at
    /// once and, through the group's memory.max, what the domain's
    /// processes may use. The guest's RAM is sized when it starts, so a
    /// maximum above it takes effect at the domain's next start.
    pub fn mem_max(&self, dom: &str, mib: u64) -> Result<Value> {
        let r = self.find(dom)?;
        let mut c = self.load(&r)?;
        if mib < 64 || mib > host_memory_mib() {
            return Err(Error::Invalid(format!(
                "{mib} MiB is outside 64 MiB to the host's {} MiB",
                host_memory_mib()
            )));
        }
        if mib < r.memory_mib as u64 {
            return Err(Error::Invalid(format!(
                "{mib} MiB is below domain {}'s current memory ({} MiB); lower that first with mem-set",
                r.name, r.memory_mib
            )));
        }
        let ram = match r.state.as_str() {
            "running" => Some(self.vmm(&r)?.domain().map_err(vmm_error(&r))?.memory_mib),
            _ => None,
        };
        c.maxmem_mib = mib;
        if let Some(g) = self.cgroup_path(&r) {
            cgroup::update(
                &g,
                &cgroup::Limits {
                    maxmem_mib: ram.map_or(mib, |ram| ram.min(mib)),
                    ..limits(&c)
                },
            )?;
        }
        self.remember(&r, "maxmem", &mib.to_string())?;
        Ok(json!({
            "id": r.id,
            "name": r.name,
            "maxmem_mib": mib,
            "memory_mib": r.memory_mib,
            "ram_mib": ram,
            "at_next_start": ram.is_some_and(|ram| mib > ram),
        }))
    }

    /// block-attach: hot-plugs a disk (an xl disk spec) into the running
    /// domain and adds it to the domain's configuration, so that it is
    /// there after a reboot too.
    pub fn block_attach(&self, dom: &str, spec: &str) -> Result<Value> {
        let r = self.find(dom)?;
        let disk = domus_xlcfg::parse_disk(spec).map_err(Error::Invalid)?;
        if !disk.path.is_absolute() {
            return Err(Error::Invalid(format!(
                "give the disk's absolute path, not {}",
                disk.path.display()
            )));
        }
        let c = self.load(&r)?;
        let mut specs: Vec<String> = c.disks.iter().map(|d| d.spec()).collect();
        specs.push(disk.spec());
        let list = domus_xlcfg::list_value(&specs)
            .ok_or_else(|| Error::Invalid("a disk path cannot hold quotes".into()))?;
        let vmm_spec = format!(
            "{}{}",
            disk.path.display(),
            if disk.read_only { ",ro" } else { "" }
        );
        let dev = self
            .vmm(&r)?
            .plug(&PlugRequest {
                disk: Some(vmm_spec),
                net: None,
            })
            .map_err(vmm_error(&r))?;
        self.remember(&r, "disk", &list)?;
        self.log(&format!(
            "attached {} to domain {} as {}",
            disk.path.display(),
            r.name,
            dev.id
        ));
        Ok(to_json(&dev))
    }

    /// A device of domain `r`, by its API id (vda, net0, ...), which must
    /// be of `kind`.
    fn device(r: &db::Row, api: &VmmClient, id: &str, kind: &str) -> Result<DeviceInfo> {
        let d = api.device(id).map_err(vmm_error(r))?;
        if d.kind != kind {
            return Err(Error::Invalid(format!(
                "device {id} is not a {kind} device"
            )));
        }
        Ok(d)
    }

    /// A string fact of a device (its `info`): a disk's path, an
    /// interface's MAC or tap.
    fn fact(d: &DeviceInfo, key: &str) -> String {
        d.info
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }

    /// block-detach: asks the guest to let go of a disk (by its name,
    /// vda, vdb, ...) and drops it from the domain's configuration. The
    /// disk leaves when the guest has released it.
    pub fn block_detach(&self, dom: &str, id: &str) -> Result<Value> {
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let d = Self::device(&r, &api, id, "block")?;
        let path = Self::fact(&d, "path");
        let v = to_json(&api.unplug(id).map_err(vmm_error(&r))?);
        let c = self.load(&r)?;
        let mut disks = c.disks.clone();
        if let Some(i) = disks
            .iter()
            .position(|x| x.path.display().to_string() == path)
        {
            disks.remove(i);
        }
        let specs: Vec<String> = disks.iter().map(|d| d.spec()).collect();
        if let Some(list) = domus_xlcfg::list_value(&specs) {
            self.remember(&r, "disk", &list)?;
        }
        self.log(&format!("detaching {id} ({path}) from domain {}", r.name));
        Ok(v)
    }

    /// The domain's taps that exist now.
    fn taps(&self, id: i64) -> Vec<String> {
        let prefix = format!("dm{}{id}n", self.tag);
        let mut out: Vec<String> = std::fs::read_dir("/sys/class/net")
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| {
                        n.strip_prefix(&prefix)
                            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// network-attach: a new tap (on the vif's bridge) and a hot-plugged
    /// interface on it; the vif (with its MAC, made up if not given) joins
    /// the domain's configuration.
    pub fn network_attach(&self, dom: &str, spec: &str) -> Result<Value> {
        let r = self.find(dom)?;
        let mut warnings = Vec::new();
        let mut vif = domus_xlcfg::parse_vif(spec, &mut warnings).map_err(Error::Invalid)?;
        let taps = self.taps(r.id);
        let i = (0..)
            .find(|i| !taps.contains(&self.tap_name(r.id, *i)))
            .unwrap_or(0);
        let tap = self.tap_name(r.id, i);
        let mac = vif.mac.clone().unwrap_or_else(|| {
            let mut b = [0u8; 3];
            // SAFETY: getrandom writes at most b.len() bytes into b.
            unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
            format!("52:54:00:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2])
        });
        vif.mac = Some(mac.clone());
        let c = self.load(&r)?;
        let mut specs: Vec<String> = c.vifs.iter().map(|v| v.spec()).collect();
        specs.push(vif.spec());
        let list = domus_xlcfg::list_value(&specs)
            .ok_or_else(|| Error::Invalid("a vif cannot hold quotes".into()))?;
        if r.state != "running" {
            return Err(Error::WrongState {
                name: r.name,
                state: r.state,
            });
        }
        ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
        let made = (|| -> Result<DeviceInfo> {
            if let Some(br) = &vif.bridge {
                ip(&["link", "set", &tap, "master", br])?;
            }
            ip(&["link", "set", &tap, "up"])?;
            let mut net = format!("tap={tap},mac={mac}");
            if let Some(rate) = vif.rate {
                net.push_str(&format!(",bw={rate}"));
            }
            self.vmm(&r)?
                .plug(&PlugRequest {
                    disk: None,
                    net: Some(net),
                })
                .map_err(vmm_error(&r))
        })();
        let dev = match made {
            Ok(d) => d,
            Err(e) => {
                let _ = ip(&["link", "del", &tap]);
                return Err(e);
            }
        };
        self.remember(&r, "vif", &list)?;
        self.log(&format!(
            "attached interface {} ({mac}, tap {tap}) to domain {}",
            dev.id, r.name
        ));
        Ok(to_json(&dev))
    }

    /// network-detach: by index (0 for net0) or MAC. The guest lets go of
    /// the interface, which leaves with its tap; the vif leaves the
    /// domain's configuration.
    pub fn network_detach(&self, dom: &str, which: &str) -> Result<Value> {
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let id = if which.contains(':') {
            api.devices()
                .map_err(vmm_error(&r))?
                .into_iter()
                .find(|d| d.kind == "net" && Self::fact(d, "mac") == which.to_lowercase())
                .map(|d| d.id)
                .ok_or_else(|| Error::Invalid(format!("no interface with MAC {which}")))?
        } else {
            format!("net{which}")
        };
        let d = Self::device(&r, &api, &id, "net")?;
        let mac = Self::fact(&d, "mac");
        let tap = Self::fact(&d, "tap");
        let v = to_json(&api.unplug(&id).map_err(vmm_error(&r))?);
        let c = self.load(&r)?;
        let mut vifs = c.vifs.clone();
        let pos = vifs
            .iter()
            .position(|x| x.mac.as_deref() == Some(mac.as_str()))
            .or_else(|| {
                // A vif without a MAC: its place is its tap's index.
                tap.rsplit('n').next().and_then(|i| i.parse::<usize>().ok())
            });
        if let Some(i) = pos.filter(|i| *i < vifs.len()) {
            vifs.remove(i);
        }
        let specs: Vec<String> = vifs.iter().map(|v| v.spec()).collect();
        if let Some(list) = domus_xlcfg::list_value(&specs) {
            self.remember(&r, "vif", &list)?;
        }
        // The tap goes once the guest has let go and the VMM closed it (at
        // most 60 s later; if the guest never does, destroy removes it).
        let (api, dev) = (api.with_timeout(Duration::from_secs(2)), id.clone());
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(60);
            while Instant::now() < end {
                match api.device(&dev) {
                    Ok(_) => std::thread::sleep(Duration::from_millis(200)),
                    _ => {
                        let _ = ip(&["link", "del", &tap]);
                        return;
                    }
                }
            }
        });
        self.log(&format!("detaching {id} ({mac}) from domain {}", r.name));
        Ok(v)
    }

    /// Adds `key=value` to a domain's stored overrides (replacing an
    /// earlier one for the key), so the change outlives restarts.
    fn remember(&self, r: &db::Row, key: &str, value: &str) -> Result<()> {
        let mut o: Vec<String> = serde_json::from_str(&r.overrides).unwrap_or_default();
        o.retain(|x| x.split('=').next() != Some(key));
        o.push(format!("{key}={value}"));
        lock(&self.db).set_overrides(r.id, &serde_json::to_string(&o).unwrap_or_default())?;
        Ok(())
    }

    fn cgroup_path(&self, r: &db::Row) -> Option<PathBuf> {
        self.cgroup_base
            .as_ref()
            .map(|b| cgroup::group(b, &self.cgroup_name(r.id)))
    }

    /// sched-credit: changes a domain's weight and/or cap (enforced through
    /// its cgroup at once, kept for restarts).
    pub fn sched(&self, dom: &str, weight: Option<u32>, cap: Option<u32>) -> Result<Value> {
        let r = self.find(dom)?;
        if let Some(w) = weight {
            if !(1..=65535).contains(&w) {
                return Err(Error::Invalid(format!("weight {w} is not 1 to 65535")));
            }
        }
        if let Some(c) = cap {
            if c > 25_500 {
                return Err(Error::Invalid(format!(
                    "cap {c} is more than 255 CPUs (25500)"
                )));
            }
        }
        let mut c = self.load(&r)?;
        if let Some(w) = weight {
            c.cpu_weight = w;
        }
        if let Some(cp) = cap {
            c.cap = cp;
        }
        if let Some(g) = self.cgroup_path(&r) {
            cgroup::update(&g, &limits(&c))?;
        }
        if let Some(w) = weight {
            self.remember(&r, "cpu_weight", &w.to_string())?;
        }
        if let Some(cp) = cap {
            self.remember(&r, "cap", &cp.to_string())?;
        }
        Ok(json!({"id": r.id, "name": r.name, "weight": c.cpu_weight, "cap": c.cap}))
    }

    /// vcpu-list: each vCPU's thread, CPU time and affinity.
    pub fn vcpus(&self, dom: &str) -> Result<Vec<Value>> {
        let r = self.find(dom)?;
        let d = self.describe(&r);
        let pid = r.pid.unwrap_or(0);
        Ok(d["vcpu_tids"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, t)| {
                let tid = t.as_i64().unwrap_or(0);
                let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                    .unwrap_or_default();
                json!({
                    "name": r.name, "id": r.id, "vcpu": i, "tid": tid,
                    "cpu": stat.rsplit(')').next().and_then(|x| x.split(' ').nth(37)).and_then(|x| x.parse::<i64>().ok()),
                    "cpu_time_s": cpu_seconds(&stat),
                    "affinity": affinity(tid).map(|c| cpulist(&c)),
                })
            })
            .collect())
    }

    /// vcpu-pin: pins vCPU `vcpu` (or all with None) to `cpus`.
    pub fn pin(&self, dom: &str, vcpu: Option<usize>, cpus: &str) -> Result<()> {
        let list = domus_xlcfg::parse_cpulist(cpus).map_err(Error::Invalid)?;
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let list: Vec<u32> = if list.is_empty() {
            (0..n).collect()
        } else {
            list
        };
        if let Some(bad) = list.iter().find(|c| **c >= n) {
            return Err(Error::Invalid(format!(
                "CPU {bad} does not exist (the host has {n})"
            )));
        }
        let r = self.find(dom)?;
        let tids: Vec<i64> = self.describe(&r)["vcpu_tids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default();
        let chosen: Vec<i64> = match vcpu {
            Some(i) => vec![*tids.get(i).ok_or_else(|| {
                Error::Invalid(format!("domain {} has {} vCPUs", r.name, tids.len()))
            })?],
            None => tids,
        };
        for tid in chosen {
            set_affinity(tid, &list)?;
        }
        Ok(())
    }

    /// rename: a new unique name.
    pub fn rename(&self, dom: &str, new: &str) -> Result<()> {
        let _guard = lock(&self.lifecycle);
        let r = self.find(dom)?;
        domus_xlcfg::load("name", &format!("name = '{new}'\nkernel = '/'"), &[])?;
        if lock(&self.db).all()?.iter().any(|x| x.name == new) {
            return Err(Error::NameInUse(new.into()));
        }
        lock(&self.db).rename(r.id, new)?;
        self.remember(
            &Row {
                name: new.into(),
                ..r.clone()
            },
            "name",
            new,
        )?;
        self.log(&format!("renamed domain {} to {new}", r.name));
        Ok(())
    }

    /// Accounting in Prometheus' text format.
    pub fn metrics(&self) -> Result<String> {
        let mut out = String::new();
        let help = [
            (
                "domus_domain_cpu_seconds_total",
                "counter",
                "CPU time of the domain's VMM process",
            ),
            (
                "domus_domain_vcpu_seconds_total",
                "counter",
                "CPU time of the domain's vCPU threads",
            ),
            (
                "domus_domain_io_cpu_seconds_total",
                "counter",
                "CPU time of the domain's device and I/O threads",
            ),
            (
                "domus_domain_memory_bytes",
                "gauge",
                "memory the domain's guest keeps (balloon target)",
            ),
            (
                "domus_domain_rss_bytes",
                "gauge",
                "resident memory of the domain's VMM",
            ),
            (
                "domus_domain_running",
                "gauge",
                "1 if the domain is running (not paused)",
            ),
        ];
        let rows = lock(&self.db).all()?;
        let ds: Vec<(db::Row, Value)> = rows
            .into_iter()
            .map(|r| {
                let d = self.describe(&r);
                (r, d)
            })
            .collect();
        for (name, kind, text) in help {
            out.push_str(&format!("# HELP {name} {text}\n# TYPE {name} {kind}\n"));
            for (r, d) in &ds {
                let v = match name {
                    "domus_domain_cpu_seconds_total" => d["cpu_time_s"].as_f64().unwrap_or(0.0),
                    "domus_domain_vcpu_seconds_total" => d["vcpu_time_s"].as_f64().unwrap_or(0.0),
                    "domus_domain_io_cpu_seconds_total" => d["io_time_s"].as_f64().unwrap_or(0.0),
                    "domus_domain_memory_bytes" => (r.memory_mib << 20) as f64,
                    "domus_domain_rss_bytes" => r.pid.and_then(rss_bytes).unwrap_or(0) as f64,
                    _ => f64::from(u8::from(d["state"] == "running")),
                };
                out.push_str(&format!(
                    "{name}{{domain=\"{}\",id=\"{}\"}} {v}\n",
                    r.name, r.id
                ));
            }
        }
        Ok(out)
    }

    /// A domain as the API and `list` show it.
    pub fn describe(&self, r: &db::Row) -> Value {
        let c = self.load(r).ok();
        let mut state = r.state.clone();
        let (mut cpu, mut vcpu_time) = (0.0, 0.0);
        let mut vcpu_tids = Vec::new();
        if state == "running" {
            // A VMM that does not answer quickly shows its stored state.
            let api = VmmClient::new(self.api_sock(r)).with_timeout(Duration::from_secs(2));
            if let Ok(info) = api.domain() {
                state = info.state.as_str().to_string();
                vcpu_tids = info.vcpu_tids;
            }
            if let Some(pid) = r.pid {
                cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| cpu_seconds(&s))
                    .unwrap_or(0.0);
                vcpu_time = vcpu_tids
                    .iter()
                    .filter_map(|t| {
                        std::fs::read_to_string(format!("/proc/{pid}/task/{t}/stat")).ok()
                    })
                    .filter_map(|s| cpu_seconds(&s))
                    .sum();
            }
        }
        json!({
            "id": r.id,
            "name": r.name,
            "state": state,
            "pid": r.pid,
            "memory_mib": r.memory_mib,
            "maxmem_mib": c.as_ref().map(|c| c.maxmem_mib),
            "vcpus": c.as_ref().map(|c| c.vcpus),
            "cpu_weight": c.as_ref().map(|c| c.cpu_weight),
            "cap": c.as_ref().map(|c| c.cap),
            "cpu_time_s": cpu,
            "vcpu_time_s": vcpu_time,
            "io_time_s": (cpu - vcpu_time).max(0.0),
            "vcpu_tids": vcpu_tids,
            "restarts": r.restarts,
            "shutdown_requested": lock(&self.live)
                .get(&r.id)
                .and_then(|l| l.requested)
                .map(Request::as_str),
            "on_poweroff": c.as_ref().map(|c| c.on_poweroff.as_str()),
            "on_reboot": c.as_ref().map(|c| c.on_reboot.as_str()),
            "on_crash": c.as_ref().map(|c| c.on_crash.as_str()),
        })
    }

    /// Domain-0 (the host) and every domain.
    pub fn list(&self) -> Result<Vec<Value>> {
        let host = host_memory_mib();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut out = vec![json!({
            "id": 0,
            "name": "Domain-0",
            "state": "running",
            "pid": std::process::id(),
            "memory_mib": host.saturating_sub(self.used_mib(None)?),
            "maxmem_mib": host,
            "vcpus": cpus,
        })];
        let rows = lock(&self.db).all()?;
        out.extend(rows.iter().map(|r| self.describe(r)));
        Ok(out)
    }

    /// A domain's VMM ended with `status` (None: unknown, it was not our
    /// child); applies its on_poweroff / on_reboot / on_crash action.
    fn ended(&self, r: &db::Row, status: Option<ExitStatus>) -> Result<()> {
        let c = self.load(r).ok();
        let requested = lock(&self.live).get(&r.id).and_then(|l| l.requested);
        let code = status.and_then(|s| s.code());
        let why = end_kind(code, requested);
        let act = match why {
            "powered off" => c.as_ref().map_or(Action::Destroy, |c| c.on_poweroff),
            "rebooted" => c.as_ref().map_or(Action::Destroy, |c| c.on_reboot),
            _ => c.as_ref().map_or(Action::Destroy, |c| c.on_crash),
        };
        self.log(&format!(
            "domain {} {why} ({}): {}",
            r.name,
            describe_status(status),
            act.as_str()
        ));
        if why == "crashed" || (why == "rebooted" && requested.is_none()) {
            // What is left to tell why, before on_crash may remove it or a
            // restart starts new logs.
            self.log_crash_evidence(r);
        }
        match act {
            Action::Destroy => self.cleanup(r),
            Action::Preserve => {
                lock(&self.db).set_state(
                    r.id,
                    if why == "crashed" {
                        "crashed"
                    } else {
                        "shutdown"
                    },
                )?;
                lock(&self.live).remove(&r.id);
                Ok(())
            }
            Action::Restart => {
                // A crash backs off, 1 s per restart so far, at most 30 s;
                // a reboot or power-off restarts at once.
                let wait = if why == "crashed" {
                    Duration::from_secs((r.restarts as u64 + 1).min(30))
                } else {
                    Duration::ZERO
                };
                lock(&self.db).set_state(r.id, "restarting")?;
                lock(&self.live).insert(
                    r.id,
                    Live {
                        restart_at: Some(Instant::now() + wait),
                        ..Live::default()
                    },
                );
                Ok(())
            }
        }
    }

    /// Logs what may tell why a domain crashed: whether its cgroup's memory
    /// limit killed it, and the last lines of its VMM's log and console.
    fn log_crash_evidence(&self, r: &db::Row) {
        if let Some(base) = &self.cgroup_base {
            let events = cgroup::group(base, &self.cgroup_name(r.id)).join("memory.events");
            let kills = std::fs::read_to_string(events)
                .ok()
                .and_then(|t| cgroup::oom_kills(&t));
            if let Some(k) = kills.filter(|k| *k > 0) {
                self.log(&format!(
                    "domain {}: its memory.max killed {k} process(es)",
                    r.name
                ));
            }
        }
        let dir = domain_dir(&self.state, r.id);
        for (file, what) in [("vmm.log", "VMM log"), ("console.log", "console")] {
            for l in tail(&dir.join(file), 10) {
                self.log(&format!("domain {} {what}: {l}", r.name));
            }
        }
    }

    /// One pass of the monitor: reaps ended VMMs, restarts domains whose
    /// back-off is over, and removes the cgroups the kernel has let go of.
    pub fn monitor_once(&self) {
        let _guard = lock(&self.lifecycle);
        if let Some(base) = &self.cgroup_base {
            lock(&self.stale_cgroups).retain(|n| {
                cgroup::kill(base, n);
                match cgroup::remove(base, n, Duration::ZERO) {
                    Ok(()) => {
                        self.log(&format!("removed cgroup {n}"));
                        false
                    }
                    Err(_) => true,
                }
            });
        }
        let rows = match lock(&self.db).all() {
            Ok(r) => r,
            Err(_) => return,
        };
        for r in rows {
            let mut ended = None;
            let mut restart = false;
            {
                let mut live = lock(&self.live);
                match live.get_mut(&r.id) {
                    Some(Live {
                        child: Some(ch), ..
                    }) if r.state == "running" => {
                        if let Ok(Some(st)) = ch.try_wait() {
                            ended = Some(Some(st));
                        }
                    }
                    Some(Live {
                        restart_at: Some(t),
                        ..
                    }) if r.state == "restarting" => restart = Instant::now() >= *t,
                    Some(_)
                        if r.state == "running"
                            && !r.pid.is_some_and(|p| alive(p, r.start_time)) =>
                    {
                        // Not our child (started by an earlier daemon): its
                        // exit file says how it ended.
                        ended = Some(exit_file_status(&domain_dir(&self.state, r.id)));
                    }
                    _ => {}
                }
            }
            if let Some(code) = ended {
                let _ = self.ended(&r, code);
            }
            if restart {
                let _ = lock(&self.db).count_restart(r.id);
                lock(&self.live).remove(&r.id);
                match self.start(&r) {
                    Ok(()) => self.log(&format!("restarted domain {}", r.name)),
                    Err(e) => {
                        self.log(&format!("restarting {} failed: {e}", r.name));
                        let _ = lock(&self.db).set_state(r.id, "crashed");
                    }
                }
            }
        }
    }

    pub fn dmesg(&self) -> Result<Vec<(f64, String)>> {
        Ok(lock(&self.db).log_lines()?)
    }

    pub fn info(&self) -> Value {
        let host = host_memory_mib();
        let used = self.used_mib(None).unwrap_or(0);
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "state_dir": self.state.display().to_string(),
            "host_memory_mib": host,
            "host_reserve_mib": self.reserve_mib,
            "domain_memory_mib": used,
            "free_memory_mib": host.saturating_sub(self.reserve_mib).saturating_sub(used),
            "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
            "cgroups": self.cgroup_base.is_some(),
        })
    }
}

/// Runs the daemon until it is killed: serves the API and monitors domains.
/// The bearer token for the TCP API: read from `path`, or made (32 random
/// bytes in hex, mode 0600) if there is none. A token file others can read
/// is refused.
pub fn token(path: &Path) -> Result<String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::metadata(path) {
        Ok(m) => {
            if m.permissions().mode() & 0o077 != 0 {
                return Err(Error::Invalid(format!(
                    "token file {} is readable by others (chmod 600 it)",
                    path.display()
                )));
            }
            let t = std::fs::read_to_string(path)?.trim().to_string();
            if t.len() < 16 {
                return Err(Error::Invalid(format!(
                    "token file {}: the token is shorter than 16 characters",
                    path.display()
                )));
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 32];
            // SAFETY: getrandom writes at most b.len() bytes into b.
            if unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) } != b.len() as isize {
                return Err(std::io::Error::last_os_error().into());
            }
            let t: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            std::io::Write::write_all(&mut f, format!("{t}\n").as_bytes())?;
            Ok(t)
        }
        Err(e) => Err(e.into()),
    }
}

/// Where the daemon also listens besides its Unix socket.
pub struct TcpApi {
    /// host:port
    pub addr: String,
    pub token_file: PathBuf,
}

pub fn run(state: PathBuf, reserve_mib: u64, tcp: Option<TcpApi>) -> Result<()> {
    let domus = std::env::current_exe()?;
    std::fs::create_dir_all(&state)?;
    let listener = domus_http::bind(&socket_path(&state))
        .map_err(|e| Error::Invalid(format!("{}: {e}", socket_path(&state).display())))?;
    let tcp = match tcp {
        Some(t) => {
            let token = token(&t.token_file)?;
            let l = std::net::TcpListener::bind(&t.addr)
                .map_err(|e| Error::Invalid(format!("listening on {}: {e}", t.addr)))?;
            Some((l, token, t))
        }
        None => None,
    };
    let d = Daemon::open(state, domus, reserve_mib)?;
    d.log(&format!(
        "started (state {}, cgroups {})",
        d.state.display(),
        if d.cgroup_base.is_some() {
            "on"
        } else {
            "unavailable"
        }
    ));
    let h = d.clone();
    domus_http::spawn_server(
        "domusd-api",
        listener,
        Arc::new(move |r| api::handle(&h, r)),
    )?;
    if let Some((l, token, t)) = tcp {
        d.log(&format!(
            "listening on tcp {} (bearer token in {})",
            l.local_addr().map_or(t.addr.clone(), |a| a.to_string()),
            t.token_file.display()
        ));
        let h = d.clone();
        domus_http::spawn_tcp_server(
            "domusd-tcp",
            l,
            Arc::new(move |r| {
                if domus_http::bearer_ok(r, &token) {
                    api::handle(&h, r)
                } else {
                    domus_http::Response::error(
                        401,
                        "this API needs 'Authorization: Bearer TOKEN' (the daemon's token file)",
                    )
                }
            }),
        )?;
    }
    loop {
        d.monitor_once();
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("domus-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        let t = token(&p).unwrap();
        assert_eq!(t.len(), 64);
        assert_eq!(token(&p).unwrap(), t, "read back, not made again");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(token(&p)
            .unwrap_err()
            .to_string()
            .contains("readable by others"));
        std::fs::write(&p, "short").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(token(&p).unwrap_err().to_string().contains("shorter"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn how_a_domain_ended() {
        assert_eq!(end_kind(Some(0), None), "powered off");
        assert_eq!(end_kind(Some(3), None), "rebooted");
        assert_eq!(end_kind(Some(4), None), "crashed");
        assert_eq!(end_kind(None, None), "crashed");
        // A reboot asked for: the guest powers off, the domain reboots.
        assert_eq!(end_kind(Some(0), Some(Request::Reboot)), "rebooted");
        assert_eq!(end_kind(None, Some(Request::Reboot)), "rebooted");
        assert_eq!(end_kind(None, Some(Request::PowerOff)), "powered off");
        // A guest that panics on the way down has crashed all the same.
        assert_eq!(end_kind(Some(4), Some(Request::PowerOff)), "crashed");
    }

    #[test]
    fn end_statuses_in_words() {
        // Wait statuses as waitpid(2) gives them: exit code in the high byte,
        // a signal in the low bits.
        assert_eq!(
            describe_status(Some(ExitStatus::from_raw(4 << 8))),
            "exit status 4"
        );
        assert_eq!(
            describe_status(Some(ExitStatus::from_raw(9))),
            "killed by signal 9"
        );
        assert!(describe_status(None).contains("no exit file"));
    }

    #[test]
    fn an_adopted_vmm_tells_how_it_ended_in_its_exit_file() {
        let d = std::env::temp_dir().join(format!("domus-exit-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert_eq!(exit_file_status(&d), None);
        std::fs::write(
            d.join("exit"),
            "3 the guest reset (a reboot, or a triple fault)\n",
        )
        .unwrap();
        let st = exit_file_status(&d).unwrap();
        assert_eq!(st.code(), Some(3));
        assert_eq!(end_kind(st.code(), None), "rebooted");
        for bad in ["", "x", "-1 no", "300 no"] {
            std::fs::write(d.join("exit"), bad).unwrap();
            assert_eq!(exit_file_status(&d), None, "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn tail_keeps_the_last_non_blank_lines() {
        let p = std::env::temp_dir().join(format!("domus-tail-{}", std::process::id()));
        std::fs::write(&p, "a\nb\n\nc\nd\n").unwrap();
        assert_eq!(tail(&p, 2), ["c", "d"]);
        assert_eq!(tail(&p, 10), ["a", "b", "c", "d"]);
        let _ = std::fs::remove_file(&p);
        assert!(tail(&p, 3).is_empty());
    }

    #[test]
    fn stat_fields() {
        let s = "123 (a b) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 1 0 777 0 0";
        assert_eq!(cpu_seconds(s).map(|v| (v * 100.0).round()), Some(400.0));
        assert!(start_time(std::process::id().into()).is_some());
        assert_eq!(start_time(-5), None);
    }

    #[test]
    fn cpu_lists_print_as_ranges() {
        assert_eq!(cpulist(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(cpulist(&[]), "");
        assert!(affinity(0).is_some_and(|a| !a.is_empty()));
    }

    #[test]
    fn state_dir_precedence() {
        assert_eq!(state_dir(Some("/x".into())), PathBuf::from("/x"));
    }
}
