//! Accounting: a domain as `list` shows it (CPU time split into vCPU and
//! I/O time), the host (Domain-0), Prometheus metrics and the daemon's log.

use std::time::Duration;

use domus_api::client::VmmClient;
use domus_api::daemon::{Domain, Info, LogLine, State};
use domus_api::vmm::DomainState;

use crate::host::{cpu_seconds, host_memory_mib, rss_bytes};
use crate::{db, lock, Daemon, Result};

impl Daemon {
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
        // Read once for every domain and the rows below.
        let counts = self.vfr_counters();
        let ds: Vec<(db::Row, Domain)> = rows
            .into_iter()
            .map(|r| {
                let d = self.describe_with(&r, &counts);
                (r, d)
            })
            .collect();
        for (name, kind, text) in help {
            out.push_str(&format!("# HELP {name} {text}\n# TYPE {name} {kind}\n"));
            for (r, d) in &ds {
                let v = match name {
                    "domus_domain_cpu_seconds_total" => d.cpu_time_s,
                    "domus_domain_vcpu_seconds_total" => d.vcpu_time_s,
                    "domus_domain_io_cpu_seconds_total" => d.io_time_s,
                    "domus_domain_memory_bytes" => (r.memory_mib << 20) as f64,
                    "domus_domain_rss_bytes" => r.pid.and_then(rss_bytes).unwrap_or(0) as f64,
                    _ => f64::from(u8::from(d.state == State::Running)),
                };
                out.push_str(&format!(
                    "{name}{{domain=\"{}\",id=\"{}\"}} {v}\n",
                    r.name, r.id
                ));
            }
        }
        // The virtual firewall-router's counts, by interface and verdict.
        if !counts.is_empty() {
            let name = "domus_vif_vfr_packets_total";
            out.push_str(&format!(
                "# HELP {name} packets a domain sent that its interface's virtual \
                 firewall-router rules passed (verdict=\"passed\") or dropped, by reason\n\
                 # TYPE {name} counter\n"
            ));
            for (r, _) in &ds {
                for tap in self.taps(r.id) {
                    for (verdict, n) in counts.get(&tap).into_iter().flatten() {
                        out.push_str(&format!(
                            "{name}{{domain=\"{}\",id=\"{}\",tap=\"{tap}\",verdict=\"{verdict}\"}} {n}\n",
                            r.name, r.id
                        ));
                    }
                }
            }
        }
        Ok(out)
    }

    /// A running domain's vCPU threads and whether it is paused, from the
    /// daemon's model. Only a VMM the model lacks its threads of (one this
    /// daemon found running but could not ask then) is asked, briefly.
    fn model(&self, r: &db::Row) -> (Vec<i32>, bool) {
        if let Some(l) = lock(&self.live).get(&r.id) {
            if !l.vcpu_tids.is_empty() {
                return (l.vcpu_tids.clone(), l.paused);
            }
        }
        let api = VmmClient::new(self.api_sock(r)).with_timeout(Duration::from_secs(2));
        let Ok(info) = api.domain() else {
            return (Vec::new(), false);
        };
        let paused = info.state == DomainState::Paused;
        let tids = crate::jail::host_tids(r.pid.unwrap_or(0), &info.vcpu_tids);
        let known = match lock(&self.live).get_mut(&r.id) {
            Some(l) => {
                l.vcpu_tids = tids.clone();
                l.paused = paused;
                true
            }
            None => false,
        };
        if known {
            self.slice_vcpus(r.id, &tids);
        }
        (tids, paused)
    }

    /// A domain as the API and `list` show it, from the daemon's model and
    /// /proc (no round trip to its VMM), and the VFR's counters.
    pub fn describe(&self, r: &db::Row) -> Domain {
        self.describe_with(r, &self.vfr_counters())
    }

    /// [`Daemon::describe`] with the VFR's counters read once for many.
    fn describe_with(&self, r: &db::Row, vfr: &crate::vfr::Counts) -> Domain {
        let (mut vfr_passed, mut vfr_dropped) = (0, 0);
        for c in self.taps(r.id).iter().filter_map(|t| vfr.get(t)) {
            let (p, d) = crate::vfr::passed_dropped(c);
            vfr_passed += p;
            vfr_dropped += d;
        }
        let c = &r.config;
        let mut state = r.state;
        let (mut cpu, mut vcpu_time) = (0.0, 0.0);
        let mut vcpu_tids = Vec::new();
        if state == State::Running {
            let paused;
            (vcpu_tids, paused) = self.model(r);
            if paused {
                state = State::Paused;
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
        Domain {
            id: r.id,
            name: r.name.clone(),
            state,
            pid: r.pid,
            memory_mib: r.memory_mib.max(0) as u64,
            maxmem_mib: Some(c.maxmem_mib),
            vcpus: Some(c.vcpus),
            cpu_weight: Some(c.cpu_weight),
            cap: Some(c.cap),
            cpu_time_s: cpu,
            vcpu_time_s: vcpu_time,
            io_time_s: (cpu - vcpu_time).max(0.0),
            vcpu_tids,
            restarts: r.restarts,
            shutdown_requested: lock(&self.live)
                .get(&r.id)
                .and_then(|l| l.requested)
                .map(|q| q.as_str().to_string()),
            on_poweroff: Some(c.on_poweroff.as_str().to_string()),
            on_reboot: Some(c.on_reboot.as_str().to_string()),
            on_crash: Some(c.on_crash.as_str().to_string()),
            vsock_cid: c.vsock_cid,
            vfr_passed,
            vfr_dropped,
        }
    }

    /// Domain-0 (the host) and every domain.
    pub fn list(&self) -> Result<Vec<Domain>> {
        let host = host_memory_mib();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut out = vec![Domain {
            id: 0,
            name: "Domain-0".into(),
            state: State::Running,
            pid: Some(i64::from(std::process::id())),
            memory_mib: host.saturating_sub(self.used_mib(None)?),
            maxmem_mib: Some(host),
            vcpus: Some(u32::try_from(cpus).unwrap_or(u32::MAX)),
            cpu_weight: None,
            cap: None,
            cpu_time_s: 0.0,
            vcpu_time_s: 0.0,
            io_time_s: 0.0,
            vcpu_tids: Vec::new(),
            restarts: 0,
            shutdown_requested: None,
            on_poweroff: None,
            on_reboot: None,
            on_crash: None,
            vsock_cid: None,
            vfr_passed: 0,
            vfr_dropped: 0,
        }];
        let rows = lock(&self.db).all()?;
        let vfr = self.vfr_counters();
        out.extend(rows.iter().map(|r| self.describe_with(r, &vfr)));
        Ok(out)
    }

    pub fn dmesg(&self) -> Result<Vec<LogLine>> {
        let lines = lock(&self.db).log_lines()?;
        Ok(lines
            .into_iter()
            .map(|(at, msg)| LogLine { at, msg })
            .collect())
    }

    pub fn info(&self) -> Info {
        let host = host_memory_mib();
        let used = self.used_mib(None).unwrap_or(0);
        Info {
            version: env!("CARGO_PKG_VERSION").into(),
            state_dir: self.state.display().to_string(),
            host_memory_mib: host,
            host_reserve_mib: self.reserve_mib,
            domain_memory_mib: used,
            free_memory_mib: host.saturating_sub(self.reserve_mib).saturating_sub(used),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cgroups: self.host.groups.is_some(),
            image_dirs: crate::paths::shown(&self.files.image_dirs),
            block_devices: crate::paths::shown(&self.files.block_devices),
            tls_fingerprint: self.tls_fingerprint.get().cloned(),
            seccomp: self.seccomp,
            jail_ids: self.jail,
        }
    }
}
