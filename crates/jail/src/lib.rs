//! `domus-jail`: confining a VMM. The daemon starts each VMM with
//! [`spawn`] in new mount, PID, IPC and UTS namespaces; the VMM, once it
//! has opened everything it needs and before the guest runs, calls
//! [`enter`] (new root, unprivileged user, no capabilities, rlimits,
//! Landlock) and then installs its seccomp filter; files it needs later
//! (hot-plugged disks) reach it as descriptors through [`fdpass`].

mod enter;
pub mod fdpass;
mod spawn;

pub use enter::{enter, Entered, JailError};
pub use spawn::{spawn, Job, Process};

/// The threads (and processes) a jailed VMM's user may have: vCPUs,
/// device threads, the block I/O pools, API connections.
pub const MAX_THREADS: u64 = 1024;

/// The smallest file-size limit a jailed VMM gets (bytes).
const MIN_FILE_LIMIT: u64 = 1 << 30;

/// A jailed VMM's file-size limit (RLIMIT_FSIZE) for a largest disk of
/// `largest` bytes: that, rounded up to a GiB, 1 GiB at least. It writes
/// only through descriptors it was given: the limit stops a VMM taken over
/// by its guest from growing a disk image past its size, or its console
/// file, until the host's disk is full.
pub fn file_limit(largest: u64) -> u64 {
    largest
        .max(MIN_FILE_LIMIT)
        .checked_next_multiple_of(MIN_FILE_LIMIT)
        .unwrap_or(u64::MAX)
}

/// The file-size limit ([`file_limit`]) for a VMM given disks that may grow
/// to `disk_bytes` each and `memory_bytes` of guest memory (a snapshot
/// writes that much to its memory file).
pub fn file_limit_for(disk_bytes: impl IntoIterator<Item = u64>, memory_bytes: u64) -> u64 {
    file_limit(disk_bytes.into_iter().max().unwrap_or(0).max(memory_bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_file_limit_covers_the_largest_disk_in_whole_gib() {
        use super::file_limit;
        assert_eq!(file_limit(0), 1 << 30);
        assert_eq!(file_limit(1 << 30), 1 << 30);
        assert_eq!(file_limit((1 << 30) + 1), 2 << 30);
        assert_eq!(file_limit(u64::MAX), u64::MAX);
    }
}
