//! cgroup v2 groups for domains: `/sys/fs/cgroup/domus/<name>`, with
//! `cpu.weight` from the domain's weight, `cpu.max` from its cap,
//! `cpuset.cpus` from its CPU list and `memory.max` from its maximum memory
//! plus an allowance for the VMM itself. The VMM enters its group before it
//! runs (the daemon's fork writes `0` to `cgroup.procs`), so none of its
//! threads ever runs outside it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the VMM may use beyond the guest's memory (its own heap, stacks,
/// page tables, device buffers).
pub const VMM_ALLOWANCE_MIB: u64 = 64;

pub fn root() -> PathBuf {
    PathBuf::from("/sys/fs/cgroup")
}

/// The group of domain `name` under `base` (normally [`root`]).
pub fn group(base: &Path, name: &str) -> PathBuf {
    base.join("domus").join(name)
}

/// Xen's credit weight (1..=65535, default 256) as cgroup v2's cpu.weight
/// (1..=10000): the same number, so ratios between domains hold exactly
/// (weights above 10000 are cut to it). Domains compete among themselves
/// inside the `domus` group.
pub fn cpu_weight(xen: u32) -> u32 {
    xen.clamp(1, 10_000)
}

/// cpu.max for a cap in percent of one CPU (0: no cap).
pub fn cpu_max(cap: u32) -> String {
    if cap == 0 {
        "max 100000".into()
    } else {
        format!("{} 100000", u64::from(cap) * 1000)
    }
}

fn write(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// The settings of one domain's group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub weight: u32,
    pub cap: u32,
    pub cpus: Option<String>,
    pub maxmem_mib: u64,
}

/// Creates (or updates) the group; returns its path.
pub fn create(base: &Path, name: &str, l: &Limits) -> std::io::Result<PathBuf> {
    let domus = base.join("domus");
    std::fs::create_dir_all(&domus)?;
    // Controllers must be enabled from the root down.
    for dir in [base, domus.as_path()] {
        let _ = write(&dir.join("cgroup.subtree_control"), "+cpu +cpuset +memory");
    }
    let g = group(base, name);
    std::fs::create_dir_all(&g)?;
    update(&g, l)?;
    Ok(g)
}

/// Applies `l` to an existing group.
pub fn update(g: &Path, l: &Limits) -> std::io::Result<()> {
    write(&g.join("cpu.weight"), &cpu_weight(l.weight).to_string())?;
    write(&g.join("cpu.max"), &cpu_max(l.cap))?;
    if let Some(c) = &l.cpus {
        if c != "all" {
            write(&g.join("cpuset.cpus"), c)?;
        }
    }
    write(
        &g.join("memory.max"),
        &((l.maxmem_mib + VMM_ALLOWANCE_MIB) << 20).to_string(),
    )?;
    Ok(())
}

/// The `oom_kill` count from a group's `memory.events` text: how many of
/// its processes its memory limit has killed.
pub fn oom_kills(events: &str) -> Option<u64> {
    events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Kills every process left in the group (cgroup v2's `cgroup.kill`, Linux
/// 5.14 and later; a no-op where the file is missing): nothing a domain
/// started outlives it.
pub fn kill(base: &Path, name: &str) {
    let _ = std::fs::write(group(base, name).join("cgroup.kill"), "1");
}

/// Removes the group. The kernel lets go of a group only once its last task
/// is gone, which can trail the VMM's exit (KVM's own worker threads join
/// the VMM's group and end when the VM is torn down): tries for `patience`,
/// then gives the last error, naming the tasks still inside.
pub fn remove(base: &Path, name: &str, patience: Duration) -> std::io::Result<()> {
    let g = group(base, name);
    let end = Instant::now() + patience;
    loop {
        match std::fs::remove_dir(&g) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() >= end => {
                let tasks = std::fs::read_to_string(g.join("cgroup.threads")).unwrap_or_default();
                let tasks: Vec<&str> = tasks.split_whitespace().collect();
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e} (tasks inside: {tasks:?})", g.display()),
                ));
            }
            // EBUSY while the last task is still exiting.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The names of the groups under `base/domus` that start with `prefix`.
pub fn list(base: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(base.join("domus"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The domains' groups as the daemon uses them, so its tests can stand in
/// for the host's cgroup v2 tree ([`Cgroup2`] is the real one).
pub trait Groups: Send + Sync {
    /// Creates (or updates) group `name` with `l`, and opens its
    /// `cgroup.procs` for the VMM's fork to join it by writing `0`.
    fn create(&self, name: &str, l: &Limits) -> std::io::Result<std::fs::File>;
    /// Applies `l` to group `name`.
    fn update(&self, name: &str, l: &Limits) -> std::io::Result<()>;
    /// Kills every process in group `name`.
    fn kill(&self, name: &str);
    /// Removes group `name`, trying for `patience`.
    fn remove(&self, name: &str, patience: Duration) -> std::io::Result<()>;
    /// The groups whose names start with `prefix`.
    fn list(&self, prefix: &str) -> Vec<String>;
    /// How many processes of group `name` its memory limit has killed.
    fn oom_kills(&self, name: &str) -> Option<u64>;
}

/// The cgroup v2 tree mounted at `base` (normally [`root`]).
pub struct Cgroup2 {
    pub base: PathBuf,
}

impl Cgroup2 {
    /// The host's tree, if it is cgroup v2 with the controllers domains'
    /// limits need; otherwise what is missing.
    pub fn host() -> Result<Self, String> {
        Self::at(root())
    }

    /// The tree mounted at `base`, as [`Cgroup2::host`].
    pub fn at(base: PathBuf) -> Result<Self, String> {
        let file = base.join("cgroup.controllers");
        let text = std::fs::read_to_string(&file).map_err(|e| {
            format!(
                "no cgroup v2 at {} ({}: {e})",
                base.display(),
                file.display()
            )
        })?;
        missing_controllers(&text).map_err(|m| {
            format!(
                "cgroup v2 at {} lacks the {} controller(s)",
                base.display(),
                m.join(", ")
            )
        })?;
        Ok(Self { base })
    }
}

/// The controllers domains need (weights and caps, CPU lists, memory.max).
pub const CONTROLLERS: [&str; 3] = ["cpu", "cpuset", "memory"];

/// Which of [`CONTROLLERS`] a `cgroup.controllers` text lacks.
pub fn missing_controllers(text: &str) -> Result<(), Vec<&'static str>> {
    let have: Vec<&str> = text.split_whitespace().collect();
    let missing: Vec<&str> = CONTROLLERS
        .into_iter()
        .filter(|c| !have.contains(c))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(missing)
    }
}

impl Groups for Cgroup2 {
    fn create(&self, name: &str, l: &Limits) -> std::io::Result<std::fs::File> {
        let g = create(&self.base, name, l)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(g.join("cgroup.procs"))
    }

    fn update(&self, name: &str, l: &Limits) -> std::io::Result<()> {
        update(&group(&self.base, name), l)
    }

    fn kill(&self, name: &str) {
        kill(&self.base, name)
    }

    fn remove(&self, name: &str, patience: Duration) -> std::io::Result<()> {
        remove(&self.base, name, patience)
    }

    fn list(&self, prefix: &str) -> Vec<String> {
        list(&self.base, prefix)
    }

    fn oom_kills(&self, name: &str) -> Option<u64> {
        std::fs::read_to_string(group(&self.base, name).join("memory.events"))
            .ok()
            .and_then(|t| oom_kills(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controllers_limits_need_are_named_when_missing() {
        assert_eq!(
            missing_controllers("cpuset cpu io memory hugetlb pids rdma misc"),
            Ok(())
        );
        assert_eq!(
            missing_controllers("io pids\n"),
            Err(vec!["cpu", "cpuset", "memory"])
        );
        assert_eq!(missing_controllers("cpu memory"), Err(vec!["cpuset"]));
        assert_eq!(missing_controllers(""), Err(CONTROLLERS.to_vec()));
        let dir = std::env::temp_dir().join(format!("domus-cg-controllers-{}", std::process::id()));
        let e = Cgroup2::at(dir.clone()).err().unwrap();
        assert!(e.starts_with("no cgroup v2 at"), "{e}");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cgroup.controllers"), "cpu io pids\n").unwrap();
        let e = Cgroup2::at(dir.clone()).err().unwrap();
        assert!(e.ends_with("lacks the cpuset, memory controller(s)"), "{e}");
        std::fs::write(dir.join("cgroup.controllers"), "cpuset cpu memory\n").unwrap();
        assert!(Cgroup2::at(dir.clone()).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn weights_and_caps_map_onto_cgroup_values() {
        assert_eq!(cpu_weight(256), 256);
        assert_eq!(cpu_weight(1), 1);
        assert_eq!(cpu_weight(4), 4);
        assert_eq!(cpu_weight(0), 1);
        assert_eq!(cpu_weight(65535), 10_000);
        assert_eq!(cpu_max(0), "max 100000");
        assert_eq!(cpu_max(25), "25000 100000");
        assert_eq!(cpu_max(200), "200000 100000");
    }

    #[test]
    fn oom_kills_are_read_from_memory_events() {
        let ev = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills(ev), Some(1));
        assert_eq!(oom_kills("low 0\n"), None);
        assert_eq!(oom_kills("oom_kill x\n"), None);
    }

    #[test]
    fn a_group_gets_its_files() {
        // A plain directory stands in for the cgroup file system.
        let base = std::env::temp_dir().join(format!("domus-cg-{}", std::process::id()));
        let l = Limits {
            weight: 512,
            cap: 25,
            cpus: Some("0-1".into()),
            maxmem_mib: 256,
        };
        let g = create(&base, "web", &l).unwrap();
        let read = |f: &str| std::fs::read_to_string(g.join(f)).unwrap();
        assert_eq!(read("cpu.weight"), "512");
        assert_eq!(read("cpu.max"), "25000 100000");
        assert_eq!(read("cpuset.cpus"), "0-1");
        assert_eq!(read("memory.max"), (320u64 << 20).to_string());
        assert_eq!(list(&base, "we"), ["web"]);
        assert!(list(&base, "x").is_empty());
        // A group with something inside cannot go (here: a plain directory
        // with files); the error says which group.
        let e = remove(&base, "web", Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("web"), "{e}");
        for f in std::fs::read_dir(&g).unwrap() {
            std::fs::remove_file(f.unwrap().path()).unwrap();
        }
        remove(&base, "web", Duration::ZERO).unwrap();
        remove(&base, "web", Duration::ZERO).unwrap();
        assert!(list(&base, "we").is_empty());
        let _ = std::fs::remove_dir_all(base);
    }
}
