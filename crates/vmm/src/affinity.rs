//! vCPU threads' host CPUs: `sched_setaffinity` and `sched_getaffinity`
//! on the VMM's own threads, for the API's vcpu-pin.

/// The host CPUs thread `tid` may run on.
pub fn get(tid: i32) -> std::io::Result<Vec<u32>> {
    // SAFETY: cpu_set_t is plain data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the pointer and size describe `set`.
    let r =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as u32)
        // SAFETY: CPU_ISSET reads the set at an index below CPU_SETSIZE.
        .filter(|c| unsafe { libc::CPU_ISSET(*c as usize, &set) })
        .collect())
}

/// Lets thread `tid` run on `cpus` only; each must be below CPU_SETSIZE
/// (checked by the caller against the host's CPUs).
pub fn set(tid: i32, cpus: &[u32]) -> std::io::Result<()> {
    // SAFETY: as in `get`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for c in cpus
        .iter()
        .filter(|c| (**c as usize) < libc::CPU_SETSIZE as usize)
    {
        // SAFETY: CPU_SET writes the set at an index below CPU_SETSIZE.
        unsafe { libc::CPU_SET(*c as usize, &mut set) };
    }
    // SAFETY: the pointer and size describe `set`.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_is_pinned_and_reads_back() {
        std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            let me = unsafe { libc::gettid() };
            let all = get(me).unwrap();
            assert!(!all.is_empty());
            set(me, &all[..1]).unwrap();
            assert_eq!(get(me).unwrap(), &all[..1]);
            assert!(set(me, &[]).is_err(), "an empty set is refused");
        })
        .join()
        .unwrap();
    }
}
