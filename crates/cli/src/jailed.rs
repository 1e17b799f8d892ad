//! `domus run --jail UID[:GID]`: a VMM started by hand, jailed as the
//! daemon jails its VMMs. This process starts itself again as the first
//! process of new mount, PID, IPC and UTS namespaces (which only a new
//! child can be in), waits for it and exits as it did; the child boots the
//! domain and enters the jail once it is set up.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use domus_api::spec::{JailSpec, VmSpec};

/// Set in the child: the jail's root directory, made by the parent.
const ROOT_ENV: &str = "DOMUS_JAIL_ROOT";

/// Parses `UID[:GID]` (GID defaults to UID; neither may be 0).
pub fn parse_ids(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s.split_once(':').unwrap_or((s, s));
    let id = |t: &str| {
        t.parse::<u32>()
            .ok()
            .filter(|&i| i != 0 && i != u32::MAX)
            .ok_or_else(|| format!("'{t}' is not a user or group id other than 0"))
    };
    Ok((id(u)?, id(g)?))
}

/// In the child: the jail for `spec` (its root made by the parent). In the
/// parent: None, and the caller runs [`respawn`].
pub fn child_jail(spec: &VmSpec, (uid, gid): (u32, u32)) -> Option<JailSpec> {
    let root = PathBuf::from(std::env::var_os(ROOT_ENV)?);
    Some(JailSpec {
        root,
        uid,
        gid,
        devices: [Path::new("/dev/net/tun")]
            .into_iter()
            .filter(|p| p.exists())
            .map(PathBuf::from)
            .collect(),
        max_file_bytes: domus_jail::file_limit_for(
            spec.disks
                .iter()
                .map(|d| domus_disk::grows_to(&d.path, d.format)),
            spec.memory_mib << 20,
        ),
        max_threads: domus_jail::MAX_THREADS,
        fd_socket: None,
    })
}

/// Starts this command again in new namespaces and waits for it.
pub fn respawn() -> ExitCode {
    let root = std::env::temp_dir().join(format!("domus-jail-{}", std::process::id()));
    let made = std::fs::create_dir(&root).and_then(|()| {
        let dup = |f: std::io::Result<OwnedFd>| f;
        Ok((
            dup(std::io::stdin().as_fd().try_clone_to_owned())?,
            dup(std::io::stdout().as_fd().try_clone_to_owned())?,
            dup(std::io::stderr().as_fd().try_clone_to_owned())?,
        ))
    });
    let (stdin, stdout, stderr) = match made {
        Ok(fds) => fds,
        Err(e) => {
            eprintln!("domus: the jail's root {}: {e}", root.display());
            return ExitCode::from(1);
        }
    };
    // Single-threaded here: nothing else reads the environment.
    std::env::set_var(ROOT_ENV, &root);
    let job = domus_jail::Job {
        program: PathBuf::from("/proc/self/exe"),
        args: std::env::args_os().skip(1).collect::<Vec<OsString>>(),
        stdin: Some(stdin),
        stdout,
        stderr,
        cgroup_procs: None,
        namespaces: true,
        max_files: 4096,
        dies_with_parent: true,
    };
    let status = domus_jail::spawn(job).and_then(|mut p| p.wait());
    let _ = std::fs::remove_dir(&root);
    match status {
        Ok(s) => ExitCode::from(
            s.code()
                .or(s.signal().map(|n| 128 + n))
                .unwrap_or(1)
                .clamp(0, 255) as u8,
        ),
        Err(e) => {
            eprintln!("domus: starting the jailed VMM: {e}");
            ExitCode::from(1)
        }
    }
}
