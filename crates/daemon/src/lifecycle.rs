//! Domain lifecycle: recovering after a daemon restart, admission
//! control, create (and the VMM's start), destroy, rename, pause and the
//! power button.

use domus_jail::Job;
use std::path::Path;
use std::time::{Duration, Instant};

use domus_api::client::VmmClient;
use domus_api::daemon::{Created, State};
use domus_api::spec::{ConsoleSpec, DiskSpec, NetSpec, VmSpec};
use domus_api::vmm::RateLimit;
use domus_api::vmm::{DeviceInfo, DomainState};

use crate::cgroup::VMM_ALLOWANCE_MIB;
use crate::host::{alive, host_memory_mib, start_time};
use crate::supervise::{exit_file_status, Live, Request};
use crate::watch;
use crate::{db, domain_dir, limits, lock, overlay_dir, vmm_error, Daemon, Error, Result};

impl Daemon {
    pub(crate) fn recover(&self) -> Result<()> {
        let rows = lock(&self.db).all()?;
        // Groups of domains that ended while no daemon ran, or that the last
        // daemon had not removed yet.
        if let Some(groups) = &self.host.groups {
            let known: Vec<String> = rows.iter().map(|r| self.cgroup_name(r.id)).collect();
            let prefix = format!("{}-d", self.tag);
            lock(&self.stale_cgroups).extend(
                groups
                    .list(&prefix)
                    .into_iter()
                    .filter(|n| !known.contains(n)),
            );
        }
        for r in rows {
            match r.state {
                // A create the last daemon did not finish (its VMM's API had
                // not answered): undo it. A destroy it did not finish:
                // finish it.
                State::Creating | State::Destroying => {
                    if let Some(pid) = r.pid {
                        if alive(pid, r.start_time) {
                            // SAFETY: kill(2) on a pid we started.
                            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                        }
                    }
                    self.cleanup(&r)?;
                    self.log_domain(
                        &r.name,
                        false,
                        &if r.state == State::Creating {
                            format!("removed half-created domain {}", r.name)
                        } else {
                            format!("finished destroying domain {}", r.name)
                        },
                    );
                }
                State::Running if r.pid.is_some_and(|p| alive(p, r.start_time)) => {
                    // What the model keeps of it, asked once (a VMM that
                    // does not answer now is asked again by describe()).
                    let api =
                        VmmClient::new(self.api_sock(&r)).with_timeout(Duration::from_secs(2));
                    let info = api.domain().ok();
                    let vcpu_tids = info
                        .as_ref()
                        .map(|i| crate::jail::host_tids(r.pid.unwrap_or(0), &i.vcpu_tids))
                        .unwrap_or_default();
                    lock(&self.live).insert(
                        r.id,
                        Live {
                            paused: info
                                .as_ref()
                                .is_some_and(|i| i.state == DomainState::Paused),
                            vcpu_tids: vcpu_tids.clone(),
                            // Checked after it is made: the pid may have
                            // been reused since the alive() above.
                            pidfd: r
                                .pid
                                .and_then(watch::pidfd)
                                .filter(|_| r.pid.is_some_and(|p| alive(p, r.start_time))),
                            ..Live::default()
                        },
                    );
                    self.slice_vcpus(r.id, &vcpu_tids);
                    self.log_domain(
                        &r.name,
                        false,
                        &format!("found domain {} (pid {:?})", r.name, r.pid),
                    );
                }
                State::Running => {
                    self.log_domain(
                        &r.name,
                        true,
                        &format!("domain {} ended while no daemon ran", r.name),
                    );
                    self.ended(&r, exit_file_status(&domain_dir(&self.state, r.id)))?;
                }
                // A restart the last daemon had not finished (or not begun):
                // what it started goes, and the restart is made again.
                State::Restarting => {
                    if let Some(pid) = r.pid.filter(|p| alive(*p, r.start_time)) {
                        // SAFETY: kill(2) on the VMM a daemon started for this
                        // row (its start time matches).
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    }
                    lock(&self.live).insert(
                        r.id,
                        Live {
                            restart_at: Some(Instant::now()),
                            ..Live::default()
                        },
                    );
                    self.log_domain(
                        &r.name,
                        false,
                        &format!("restarting domain {} (a restart was under way)", r.name),
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Memory reserved by domains (all but `except`): each holds the most
    /// it may ever have (its maxmem, however far it is ballooned down, plus
    /// the VMM's allowance) while it runs or waits to restart, and gives it
    /// back when it is kept stopped (shutdown, crashed).
    pub(crate) fn used_mib(&self, except: Option<i64>) -> Result<u64> {
        let rows = lock(&self.db).all()?;
        Ok(reserved_mib(
            rows.iter()
                .filter(|r| Some(r.id) != except)
                .map(|r| (r.state, r.config.maxmem_mib)),
        ))
    }

    /// Admission control: whether a domain that may grow to `maxmem` MiB
    /// fits beside the domains (all but `except`) and the host's reserve.
    /// Nothing is overcommitted: a ballooned-down domain still holds its
    /// maxmem, so any domain can balloon up to its maximum at any time.
    pub(crate) fn admit(&self, maxmem: u64, except: Option<i64>) -> Result<()> {
        admit(
            footprint_mib(maxmem),
            host_memory_mib(),
            self.used_mib(except)?,
            self.reserve_mib,
        )
    }

    /// Creates and starts a domain from a configuration file's text (its
    /// relative paths are relative to `dir`), parsed once into the domain's
    /// stored configuration.
    pub fn create(
        &self,
        file: &str,
        dir: &str,
        text: &str,
        overrides: &[String],
    ) -> Result<Created> {
        if !Path::new(dir).is_absolute() {
            return Err(Error::Invalid(format!(
                "the configuration's directory must be an absolute path, not '{dir}'"
            )));
        }
        // `clone = "FILE"`: the domain is a clone of that snapshot.
        if let Some((name, snap)) = domus_xlcfg::clone_source(file, text, overrides)? {
            return self.clone_one(&Path::new(dir).join(snap), &name);
        }
        let mut loaded = domus_xlcfg::load(file, text, overrides)?;
        loaded.config.make_absolute(Path::new(dir));
        if loaded.config.image.is_none() {
            return self.create_config(&loaded.config, loaded.warnings, Start::Boot);
        }
        // A name in use is refused before its disks are made.
        refuse_taken(&lock(&self.db).all()?, &loaded.config)?;
        let kept = overlay_dir(&self.state)
            .join(format!("{}.qcow2", loaded.config.name))
            .exists();
        self.use_image(&mut loaded.config)?;
        let r = self.create_config(&loaded.config, loaded.warnings, Start::Boot);
        if r.is_err() {
            let mut c = loaded.config.clone();
            if let Some(u) = c.image.as_mut() {
                u.keep |= kept;
            }
            self.drop_image_disks(&db::Row {
                id: 0,
                name: c.name.clone(),
                config: c,
                pid: None,
                start_time: None,
                state: State::Creating,
                restarts: 0,
                memory_mib: 0,
            });
        }
        r
    }

    /// Creates and starts domain `c`: booted, restored from a snapshot, or
    /// taken from a live migration, as `how` says.
    pub(crate) fn create_config(
        &self,
        c: &domus_api::domain::DomainConfig,
        warnings: Vec<String>,
        how: Start<'_>,
    ) -> Result<Created> {
        // Refused before anything is reserved or started.
        self.files.check_config(c)?;
        self.check_limits(c)?;
        // The name check, admission and the row (which reserves the name and
        // the memory) happen under the lifecycle lock; starting the VMM does
        // not, so creates run side by side.
        let guard = lock(&self.lifecycle);
        let rows = lock(&self.db).all()?;
        refuse_taken(&rows, c)?;
        // Its interfaces' MACs given, their addresses checked.
        let mut c = c.clone();
        self.check_vifs(&rows, &mut c)?;
        let c = &c;
        self.admit(c.maxmem_mib, None)?;
        let row = db::Row {
            id: 0,
            name: c.name.clone(),
            config: c.clone(),
            pid: None,
            start_time: None,
            state: State::Creating,
            restarts: 0,
            memory_mib: c.memory_mib as i64,
        };
        let id = lock(&self.db).insert(&row)?;
        drop(guard);
        let row = db::Row { id, ..row };
        let verb = match how {
            Start::Boot => "created",
            Start::Restore(_) => "restored",
            Start::Incoming(_) => "migrated in",
        };
        match self.start_from(&row, how) {
            Ok(()) => {
                let Some(r) = self.still_there(&row)? else {
                    return Err(Error::NoSuchDomain(format!(
                        "{} (destroyed while it was being created)",
                        c.name
                    )));
                };
                self.log_domain(
                    &c.name,
                    false,
                    &format!("{verb} domain {} (id {id})", c.name),
                );
                Ok(Created {
                    domain: self.describe(&r),
                    warnings,
                })
            }
            Err(e) => {
                // A destroy that came in meanwhile (it holds the lifecycle
                // lock throughout, so it has finished once this has the
                // lock) removed the row; what the start made after that
                // (directory, cgroup, taps) goes now, and the start's failure
                // (its directory vanished, its VMM was killed) is that
                // destroy's doing.
                let _guard = lock(&self.lifecycle);
                let Some(r) = lock(&self.db).get(id)? else {
                    self.cleanup(&row)?;
                    return Err(Error::NoSuchDomain(format!(
                        "{} (destroyed while it was being created)",
                        c.name
                    )));
                };
                self.log_domain(&c.name, true, &format!("creating {} failed: {e}", c.name));
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

    /// After a start, which runs outside the lifecycle lock: the domain's
    /// row, or None when a destroy removed it meanwhile, in which case what
    /// the start made (the VMM, its directory, cgroup and taps) goes now.
    pub(crate) fn still_there(&self, row: &db::Row) -> Result<Option<db::Row>> {
        let _guard = lock(&self.lifecycle);
        let now = lock(&self.db).get(row.id)?;
        if now.is_none() {
            // cleanup() also stops the VMM the start left in `live`.
            self.cleanup(row)?;
        }
        Ok(now)
    }

    /// Starts the VMM of a domain whose row exists; waits until its API
    /// answers.
    pub(crate) fn start(&self, r: &db::Row) -> Result<()> {
        self.start_from(r, Start::Boot)
    }

    /// [`Daemon::start`], booting or as `how` says instead.
    pub(crate) fn start_from(&self, r: &db::Row, how: Start<'_>) -> Result<()> {
        let c = &r.config;
        // Again at every (re)start: a file may have been replaced by a link
        // since the domain was created.
        self.files.check_config(c)?;
        let dir = domain_dir(&self.state, r.id);
        std::fs::create_dir_all(&dir)?;
        let api = dir.join("api.sock");
        // What the VMM boots, as one typed document it reads with --config.
        let mut spec = VmSpec {
            name: c.name.clone(),
            kernel: c.kernel.clone(),
            initrd: c.ramdisk.clone(),
            cmdline: c.cmdline.clone(),
            vcpus: c.vcpus,
            memory_mib: c.maxmem_mib,
            console: ConsoleSpec::File(dir.join("console.log")),
            disks: c.disks.iter().map(disk_spec).collect(),
            nets: Vec::new(),
            vsock_cid: c.vsock_cid,
            rng: true,
            balloon: true,
            // Below maxmem, the guest starts ballooned down to what the
            // domain keeps (its memory, or what mem-set made it), before
            // its driver first looks.
            balloon_target_mib: Some(keep_mib(r)).filter(|&m| m < c.maxmem_mib),
            prefault: false,
            mergeable: c.mergeable,
            cpuid: c.cpuid.clone(),
            seccomp: self.seccomp,
            api_socket: Some(api.clone()),
            exit_file: Some(dir.join("exit")),
            jail: self.jail_spec(r, &dir)?,
        };
        let owner = spec.jail.as_ref().map(|j| (j.uid, j.gid));
        // A restart finds the taps of the VMM that ended (hot-plugged ones
        // too): start afresh.
        for t in self.taps(r.id) {
            self.unplug_tap(&t);
        }
        for (i, v) in c.vifs.iter().enumerate() {
            let tap = self.tap_name(r.id, i);
            self.plug_tap(&tap, v, owner)?;
            spec.nets.push(net_spec(tap, v, v.mac.clone()));
        }
        let spec_file = dir.join("vm.json");
        let text = serde_json::to_string_pretty(&spec).map_err(|e| Error::Start {
            name: c.name.clone(),
            msg: format!("writing its VM spec: {e}"),
        })?;
        std::fs::write(&spec_file, text)?;
        // A restart keeps the last run's logs, as vmm.log.1 and console.log.1.
        let _ = std::fs::remove_file(dir.join("exit"));
        for f in ["vmm.log", "console.log"] {
            let _ = std::fs::rename(dir.join(f), dir.join(format!("{f}.1")));
        }
        let log = std::fs::File::create(dir.join("vmm.log"))?;
        let procs = match &self.host.groups {
            Some(groups) => Some(groups.create(&self.cgroup_name(r.id), &limits(c))?),
            None => None,
        };
        // `domus run` in a new session, its cgroup, no_new_privs, no core
        // dumps, no descriptor of ours; jailed, in namespaces of its own.
        let mut args: Vec<std::ffi::OsString> =
            vec!["run".into(), "--config".into(), spec_file.into()];
        // An incoming VMM waits for the stream first: its API answers once
        // the guest runs, however long the copy takes (the VMM gives up
        // on a stream that falls silent).
        let mut start_timeout = self.start_timeout;
        let mut incoming = None;
        match how {
            Start::Boot => {}
            Start::Restore(file) => args.extend(["--restore".into(), file.into()]),
            Start::Incoming(tx) => {
                let sock = dir.join("incoming.sock");
                args.extend(["--incoming".into(), sock.clone().into()]);
                start_timeout = INCOMING_TIMEOUT;
                incoming = Some((tx, sock));
            }
        }
        let job = Job {
            program: self.domus.clone(),
            args,
            stdin: None,
            stdout: log.try_clone()?.into(),
            stderr: log.into(),
            cgroup_procs: procs.map(Into::into),
            namespaces: spec.jail.is_some(),
            max_files: VMM_FILES,
            // A VMM outlives a daemon restart.
            dies_with_parent: false,
        };
        let mut child = self.host.launcher.launch(job, &spec)?;
        if let Some((tx, sock)) = incoming {
            let _ = tx.send(sock);
        }
        let pid = i64::from(child.id());
        let st = start_time(pid).unwrap_or(0);
        // The row has the pid (a destroy or a new daemon finds the VMM by
        // it) but says running only once the API has answered: a daemon
        // killed before that undoes the start instead of adopting a VMM
        // that may never come up.
        lock(&self.db).set_pid(r.id, pid, st)?;
        // Wait for the API to answer (or the VMM to fail).
        let deadline = Instant::now() + start_timeout;
        let info = loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("vmm.log")).unwrap_or_default();
                let (name, log) = (c.name.clone(), log.trim());
                // 2: `domus run`'s status for input it refuses, which it
                // explains in one line.
                return Err(if status.code() == Some(2) {
                    Error::Refused {
                        name,
                        msg: log.strip_prefix("domus: ").unwrap_or(log).to_string(),
                    }
                } else {
                    Error::Start {
                        name,
                        msg: format!("domus run exited ({status}): {log}"),
                    }
                });
            }
            // Each vCPU thread registers as it starts: wait for all.
            let info = VmmClient::new(&api).domain();
            if let Some(info) = info.ok().filter(|i| i.vcpu_tids.len() >= c.vcpus as usize) {
                break info;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Start {
                    name: c.name.clone(),
                    msg: format!(
                        "its API did not answer within {} s (a busy host may need a longer \
                         `domus daemon --start-timeout`)",
                        start_timeout.as_secs()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let vcpu_tids = crate::jail::host_tids(pid, &info.vcpu_tids);
        lock(&self.live).insert(
            r.id,
            Live {
                child: Some(child),
                vcpu_tids: vcpu_tids.clone(),
                pidfd: watch::pidfd(pid),
                ..Live::default()
            },
        );
        self.slice_vcpus(r.id, &vcpu_tids);
        lock(&self.db).set_running(r.id)?;
        self.waker.wake();
        Ok(())
    }

    /// Removes everything of a domain: taps, cgroup, files, row.
    pub(crate) fn cleanup(&self, r: &db::Row) -> Result<()> {
        let n = r.config.vifs.len();
        let mut taps: Vec<String> = (0..n).map(|i| self.tap_name(r.id, i)).collect();
        taps.extend(self.taps(r.id));
        taps.dedup();
        for t in taps {
            self.unplug_tap(&t);
        }
        if let Some(groups) = &self.host.groups {
            let name = self.cgroup_name(r.id);
            groups.kill(&name);
            if let Err(e) = groups.remove(&name, Duration::from_secs(1)) {
                self.log(&format!("{e}: removing it later"));
                lock(&self.stale_cgroups).push(name);
                self.waker.wake();
            }
        }
        lock(&self.restart_log).remove(&r.id);
        // Its console log outlives it a minute, for a `console` still
        // reading it (crate::console).
        self.keep_console(r.id);
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
        self.destroy_keeping(dom, false)
    }

    /// [`Daemon::destroy`]; with `keep_disks` (a save: the snapshot uses
    /// them), the disks made for an image domain stay.
    pub(crate) fn destroy_keeping(&self, dom: &str, keep_disks: bool) -> Result<()> {
        let _guard = lock(&self.lifecycle);
        let r = self.find(dom)?;
        lock(&self.db).set_state(r.id, State::Destroying)?;
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
        if !keep_disks {
            self.drop_image_disks(&r);
        }
        self.cleanup(&r)?;
        self.log_domain(&r.name, false, &format!("destroyed domain {}", r.name));
        Ok(())
    }

    /// rename: a new unique name.
    pub fn rename(&self, dom: &str, new: &str) -> Result<()> {
        let _guard = lock(&self.lifecycle);
        let r = self.find(dom)?;
        domus_xlcfg::check_name(new).map_err(Error::Invalid)?;
        if lock(&self.db).all()?.iter().any(|x| x.name == new) {
            return Err(Error::NameInUse(new.into()));
        }
        self.update_config(r.id, |c| {
            c.name = new.into();
            Ok(())
        })?;
        self.log_domain(
            &r.name,
            false,
            &format!("renamed domain {} to {new}", r.name),
        );
        Ok(())
    }

    /// Pauses (or, with `false`, resumes) a running domain's vCPUs.
    pub fn pause(&self, dom: &str, paused: bool) -> Result<()> {
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let done = if paused { api.pause() } else { api.resume() };
        let info = done.map_err(vmm_error(&r))?;
        if let Some(l) = lock(&self.live).get_mut(&r.id) {
            l.paused = info.state == DomainState::Paused;
        }
        Ok(())
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
        self.log_domain(
            &r.name,
            false,
            &format!(
                "asked domain {} to {} (power button)",
                r.name,
                what.as_str()
            ),
        );
        Ok(())
    }

    /// A running domain's devices, as its VMM shows them; an interface
    /// with a lease on the default network shows its address (`ip`), and
    /// each its virtual firewall-router's counts (`vfr_passed`, and
    /// `vfr_mac`, `vfr_ip`, ... for each reason to drop, `vfr_dropped` in
    /// all).
    pub fn devices(&self, dom: &str) -> Result<Vec<DeviceInfo>> {
        let r = self.find(dom)?;
        let mut devs = self.vmm(&r)?.devices().map_err(vmm_error(&r))?;
        let counts = self.vfr_counters();
        for d in devs.iter_mut().filter(|d| d.kind == "net") {
            if let Some(c) = counts.get(d.fact("tap")) {
                let (_, dropped) = crate::vfr::passed_dropped(c);
                for (k, n) in c {
                    d.counters.insert(format!("vfr_{k}"), *n);
                }
                d.counters.insert("vfr_dropped".into(), dropped);
            }
        }
        if let Some(net) = self.network.get() {
            let leases = net.leases();
            for d in devs.iter_mut().filter(|d| d.kind == "net") {
                let mac = d.fact("mac").to_ascii_lowercase();
                let Some(l) = leases.iter().find(|l| l.mac == mac) else {
                    continue;
                };
                // The VFR lets the interface send from its lease from the
                // moment the lease is shown, not at the next look
                // (crate::vifs::watch_leases).
                if let Some(fw) = &self.host.firewall {
                    let _ = fw.learn(d.fact("tap"), &[l.ip]);
                }
                if let Some(info) = d.info.as_object_mut() {
                    info.insert("ip".into(), l.ip.to_string().into());
                }
            }
        }
        Ok(devs)
    }
}

/// A configuration's disk as the VMM takes it.
pub(crate) fn disk_spec(d: &domus_xlcfg::Disk) -> DiskSpec {
    DiskSpec {
        path: d.path.clone(),
        format: d.format,
        read_only: d.read_only,
        ..DiskSpec::default()
    }
}

/// A configuration's interface on `tap` as the VMM takes it.
pub(crate) fn net_spec(tap: String, v: &domus_xlcfg::Vif, mac: Option<String>) -> NetSpec {
    NetSpec {
        tap,
        mac,
        rate_limit: RateLimit {
            bandwidth: v.rate,
            iops: None,
        },
        passed: None,
        mrg_rxbuf: v.mrg_rxbuf,
        indirect_desc: v.indirect_desc,
    }
}

/// What a domain of at most `maxmem` MiB holds of the host's memory: its
/// guest's RAM and its VMM's own (the allowance its cgroup is given too).
fn footprint_mib(maxmem: u64) -> u64 {
    maxmem.saturating_add(VMM_ALLOWANCE_MIB)
}

/// What domains in these (state, maxmem) pairs hold of the host's memory.
fn reserved_mib(domains: impl Iterator<Item = (State, u64)>) -> u64 {
    domains
        .filter(|(state, _)| !matches!(state, State::Shutdown | State::Crashed))
        .map(|(_, maxmem)| footprint_mib(maxmem))
        .fold(0, u64::saturating_add)
}

/// Whether `need` MiB fit in a host of `total` MiB of which domains hold
/// `used` and `reserve` stays the host's.
fn admit(need: u64, total: u64, used: u64, reserve: u64) -> Result<()> {
    let free = total.saturating_sub(reserve).saturating_sub(used);
    if need > free {
        return Err(Error::NoMemory {
            need,
            free,
            total,
            used,
            reserve,
        });
    }
    Ok(())
}

/// The memory domain `r` keeps (its balloon's target): what mem-set last
/// made it, within 64 MiB and maxmem, else its configured memory.
fn keep_mib(r: &db::Row) -> u64 {
    u64::try_from(r.memory_mib)
        .ok()
        .filter(|m| (64..=r.config.maxmem_mib).contains(m))
        .unwrap_or(r.config.memory_mib)
}

/// The most descriptors a VMM may hold (disks, taps, eventfds, sockets).
const VMM_FILES: u64 = 4096;

/// Refuses domain `c` if one of `rows` has its name or its vsock CID.
pub(crate) fn refuse_taken(rows: &[db::Row], c: &domus_api::domain::DomainConfig) -> Result<()> {
    if rows.iter().any(|r| r.name == c.name) {
        return Err(Error::NameInUse(c.name.clone()));
    }
    if let Some(cid) = c.vsock_cid {
        if let Some(r) = rows.iter().find(|r| r.config.vsock_cid == Some(cid)) {
            return Err(Error::CidInUse {
                cid,
                name: r.name.clone(),
            });
        }
    }
    Ok(())
}

/// How long a VMM taking a live migration may take before its API answers
/// (it ends on its own when the stream falls silent for a minute).
const INCOMING_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// How a domain's VMM starts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Start<'a> {
    Boot,
    /// From this snapshot (its state file, already checked).
    Restore(&'a Path),
    /// From a live migration: the VMM waits on a socket in the domain's
    /// directory, whose path is sent here once it is started.
    Incoming(&'a std::sync::mpsc::Sender<std::path::PathBuf>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopped_domains_give_their_memory_back() {
        let ds = [
            (State::Running, 512),
            (State::Restarting, 256),
            (State::Creating, 128),
            (State::Shutdown, 1024),
            (State::Crashed, 2048),
        ];
        let vmm = VMM_ALLOWANCE_MIB;
        assert_eq!(
            reserved_mib(ds.into_iter()),
            (512 + vmm) + (256 + vmm) + (128 + vmm)
        );
        assert_eq!(
            reserved_mib([(State::Running, u64::MAX)].into_iter()),
            u64::MAX
        );
    }

    #[test]
    fn admission_keeps_the_reserve_and_says_why() {
        assert!(admit(512, 4096, 3072, 512).is_ok(), "exactly what is free");
        let e = admit(513, 4096, 3072, 512).unwrap_err();
        assert!(matches!(
            e,
            Error::NoMemory {
                need: 513,
                free: 512,
                ..
            }
        ));
        assert!(e.to_string().contains("512 MiB kept for the host"), "{e}");
        // More promised than the host has: nothing is free, nothing wraps.
        assert!(matches!(
            admit(1, 1024, 4096, 512),
            Err(Error::NoMemory { free: 0, .. })
        ));
        assert!(admit(0, 0, 0, 0).is_ok());
    }
}
