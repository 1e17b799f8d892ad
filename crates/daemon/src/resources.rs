//! Memory and CPU of a domain: mem-set, mem-max, sched-credit, vcpu-list
//! and vcpu-pin.

use domus_api::daemon::{Maxmem, Sched, State, Vcpu};
use domus_api::vmm::{BalloonInfo, VcpuPin};

use crate::host::{allowed_cpus, cpu_seconds, host_memory_mib};
use crate::{cgroup, limits, lock, vmm_error, Daemon, Error, Result};

impl Daemon {
    /// mem-set: the memory the guest keeps (its balloon's target), within
    /// 64 MiB and maxmem. The domain was admitted on its maxmem, so any
    /// target up to it is already reserved.
    pub fn mem_set(&self, dom: &str, mib: u64) -> Result<BalloonInfo> {
        let r = self.find(dom)?;
        let c = &r.config;
        if mib > c.maxmem_mib || mib < 64 {
            return Err(Error::Invalid(format!(
                "{mib} MiB is outside 64 MiB to maxmem ({} MiB)",
                c.maxmem_mib
            )));
        }
        let b = self.vmm(&r)?.set_balloon(mib).map_err(vmm_error(&r))?;
        lock(&self.db).set_memory(r.id, mib as i64)?;
        Ok(b)
    }

    /// mem-max: the most memory the domain may have. It bounds `mem-set` at
    /// once and, through the group's memory.max, what the domain's
    /// processes may use. The guest's RAM is sized when it starts, so a
    /// maximum above it takes effect at the domain's next start.
    pub fn mem_max(&self, dom: &str, mib: u64) -> Result<Maxmem> {
        let r = self.find(dom)?;
        let groups = self.enforcing("mem-max (the domain's memory.max)")?;
        let mut c = r.config.clone();
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
        let ram = match r.state {
            State::Running => Some(self.vmm(&r)?.domain().map_err(vmm_error(&r))?.memory_mib),
            _ => None,
        };
        // A domain holding memory (not kept stopped) holds its maxmem: a
        // raise is admitted as a create is, under the same lock, and kept
        // before another admission can count without it.
        let _admission = lock(&self.lifecycle);
        if mib > c.maxmem_mib && !matches!(r.state, State::Shutdown | State::Crashed) {
            self.admit(mib, Some(r.id))?;
        }
        c.maxmem_mib = mib;
        groups.update(
            &self.cgroup_name(r.id),
            &cgroup::Limits {
                maxmem_mib: ram.map_or(mib, |ram| ram.min(mib)),
                ..limits(&c)
            },
        )?;
        self.update_config(r.id, |c| {
            c.maxmem_mib = mib;
            Ok(())
        })?;
        Ok(Maxmem {
            id: r.id,
            name: r.name,
            maxmem_mib: mib,
            memory_mib: r.memory_mib.max(0) as u64,
            ram_mib: ram,
            at_next_start: ram.is_some_and(|ram| mib > ram),
        })
    }

    /// sched-credit: changes a domain's weight and/or cap (enforced through
    /// its cgroup at once, kept for restarts).
    pub fn sched(&self, dom: &str, weight: Option<u32>, cap: Option<u32>) -> Result<Sched> {
        let r = self.find(dom)?;
        let groups = self.enforcing("sched-credit (the domain's CPU weight and cap)")?;
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
        let c = self.update_config(r.id, |c| {
            if let Some(w) = weight {
                c.cpu_weight = w;
            }
            if let Some(cp) = cap {
                c.cap = cp;
            }
            // Kept only once enforced.
            groups.update(&self.cgroup_name(r.id), &limits(c))?;
            Ok(())
        })?;
        Ok(Sched {
            id: r.id,
            name: r.name,
            weight: c.cpu_weight,
            cap: c.cap,
        })
    }

    /// vcpu-list: each vCPU's thread, CPU time and affinity.
    pub fn vcpus(&self, dom: &str) -> Result<Vec<Vcpu>> {
        let r = self.find(dom)?;
        let d = self.describe(&r);
        let pid = r.pid.unwrap_or(0);
        Ok(d.vcpu_tids
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let tid = i64::from(*t);
                let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                    .unwrap_or_default();
                Vcpu {
                    name: r.name.clone(),
                    id: r.id,
                    vcpu: i,
                    tid,
                    // Field 39 of stat: the CPU it last ran on.
                    cpu: stat
                        .rsplit(')')
                        .next()
                        .and_then(|x| x.split(' ').nth(37))
                        .and_then(|x| x.parse().ok()),
                    cpu_time_s: cpu_seconds(&stat),
                    affinity: allowed_cpus(pid, tid),
                }
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
        let vcpu = vcpu
            .map(|v| u32::try_from(v).map_err(|_| Error::Invalid(format!("no vCPU {v}"))))
            .transpose()?;
        // The VMM pins its own threads.
        let pin = VcpuPin { vcpu, cpus: list };
        self.vmm(&r)?.pin_vcpus(&pin).map_err(vmm_error(&r))?;
        Ok(())
    }
}
