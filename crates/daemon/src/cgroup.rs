//! cgroup v2 groups for domains: `/sys/fs/cgroup/domus/<name>`, with
//! `cpu.weight` from the domain's weight, `cpu.max` from its cap,
//! `cpuset.cpus` from its CPU list and `memory.max` from its maximum memory
//! plus an allowance for the VMM itself. The VMM enters its group before it
//! runs (the daemon's fork writes `0` to `cgroup.procs`), so none of its
//! threads ever runs outside it.

use std::path::{Path, PathBuf};

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

/// Removes the group (it must be empty: its processes gone).
pub fn remove(base: &Path, name: &str) {
    let g = group(base, name);
    for _ in 0..50 {
        match std::fs::remove_dir(&g) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            // EBUSY while the last process is still exiting.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let _ = std::fs::remove_dir_all(base);
    }
}
