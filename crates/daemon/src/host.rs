//! Facts about the host and its processes, read from /proc and the
//! scheduler: memory, a process's start time, CPU time, RSS, affinity.

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

/// The host CPUs thread `tid` of process `pid` may run on, as the kernel
/// writes them (`0-3,6`).
pub fn allowed_cpus(pid: i64, tid: i64) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    let l = s
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    Some(l.trim().to_string())
}

/// Whether `pid` is still the process that started at `start` and has not
/// exited (a zombie has).
pub(crate) fn alive(pid: i64, start: Option<i64>) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with(['Z', 'X'])))
        .unwrap_or(true);
    start.is_some() && !zombie && start_time(pid) == start
}

/// Whether `path` lies on a tmpfs (or ramfs): memory the writer's cgroup
/// is charged for and, with no swap, cannot get back.
pub fn in_memory_fs(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: libc::statfs is plain integers; all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs reads the NUL-terminated path and writes only the
    // struct it is given; both pointers are valid for the call.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let s = "123 (a b) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0 1 0 777 0 0";
        assert_eq!(cpu_seconds(s).map(|v| (v * 100.0).round()), Some(400.0));
        assert!(start_time(std::process::id().into()).is_some());
        assert_eq!(start_time(-5), None);
    }

    #[test]
    fn allowed_cpus_read_as_a_list() {
        let me = i64::from(std::process::id());
        let l = allowed_cpus(me, me).unwrap();
        assert!(
            !l.is_empty() && l.chars().all(|c| c.is_ascii_digit() || ",-".contains(c)),
            "{l}"
        );
        assert_eq!(allowed_cpus(me, -1), None);
    }

    #[test]
    fn dev_shm_is_in_memory_and_a_missing_path_is_not() {
        // /dev/shm is a tmpfs wherever glibc's shm_open works.
        if std::path::Path::new("/dev/shm").is_dir() {
            assert!(in_memory_fs(std::path::Path::new("/dev/shm")));
        }
        assert!(!in_memory_fs(std::path::Path::new("/proc")));
        assert!(!in_memory_fs(std::path::Path::new("/no/such/path")));
    }
}
