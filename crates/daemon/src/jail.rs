//! The daemon's side of the VMMs' jail ([`domus_jail`]): what each domain's
//! jail holds, the ids a jailed VMM reports (its PID namespace's) turned
//! into the host's, and disks hot-plugged into a jailed VMM, which the
//! daemon opens and passes as descriptors.

use std::os::fd::AsFd;
use std::path::Path;

use domus_api::spec::{JailSpec, VmSpec};

use crate::{db, domain_dir, Daemon, Error, Result};

impl Daemon {
    /// The jail of domain `r`'s VMM, if VMMs are jailed: user and group
    /// `jail + id`, an empty root on `dir/root`, the file-size limit of its
    /// largest disk, a descriptor socket for hot-plug.
    pub(crate) fn jail_spec(&self, r: &db::Row, dir: &Path) -> Result<Option<JailSpec>> {
        let Some(base) = self.jail else {
            return Ok(None);
        };
        let id = u32::try_from(r.id)
            .ok()
            .and_then(|i| base.checked_add(i))
            .filter(|&u| u < u32::MAX)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "domain id {} is past the end of the jail's id range (from {base})",
                    r.id
                ))
            })?;
        let root = dir.join("root");
        std::fs::create_dir_all(&root)?;
        Ok(Some(JailSpec {
            root,
            uid: id,
            gid: id,
            // Nothing to open by name: what it needs later (hot-plugged
            // disks, /dev/net/tun for interfaces) is passed in.
            devices: Vec::new(),
            max_file_bytes: domus_jail::file_limit_for(
                r.config
                    .disks
                    .iter()
                    .map(|d| domus_disk::grows_to(&d.path, d.format)),
                r.config.maxmem_mib << 20,
            ),
            max_threads: domus_jail::MAX_THREADS,
            fd_socket: Some(dir.join("fd.sock")),
        }))
    }

    /// The jail domain `r`'s running VMM was started in (from the spec it
    /// was started from: the daemon may have been restarted since, with
    /// other settings).
    pub(crate) fn running_jail(&self, r: &db::Row) -> Option<JailSpec> {
        let text = std::fs::read(domain_dir(&self.state, r.id).join("vm.json")).ok()?;
        domus_api::parse_body::<VmSpec>(&text).ok()?.jail
    }

    /// For a disk hot-plugged into a jailed VMM: opens the files of its
    /// `chain` (the disk as it asks, its backing files read-only) and
    /// passes the descriptors to the VMM, returning the tags its plug
    /// request names (the disk's, then its backing files' in order). A
    /// disk that may grow past the VMM's file-size limit is refused: the
    /// guest's writes past the limit would fail.
    pub(crate) fn pass_disk(
        &self,
        r: &db::Row,
        jail: &JailSpec,
        disk: &domus_api::domain::Disk,
        chain: &[std::path::PathBuf],
    ) -> Result<(u64, Vec<u64>)> {
        let path = &disk.path;
        let size = domus_disk::grows_to(path, disk.format);
        if size > jail.max_file_bytes {
            return Err(Error::Invalid(format!(
                "{} (up to {size} bytes) is larger than the files domain {}'s jailed VMM may write \
                 ({} bytes, set from its largest disk when it started): restart the domain \
                 with the disk in its configuration",
                path.display(),
                r.name,
                jail.max_file_bytes
            )));
        }
        let tag = self.pass_file(r, jail, path, !disk.read_only)?;
        let backing = chain
            .iter()
            .skip(1)
            .map(|p| self.pass_file(r, jail, p, false))
            .collect::<Result<Vec<_>>>()?;
        Ok((tag, backing))
    }

    /// For an interface hot-plugged into a jailed VMM: passes it an open
    /// /dev/net/tun (its tap must be the jail's user's), returning the tag.
    pub(crate) fn pass_tun(&self, r: &db::Row, jail: &JailSpec) -> Result<u64> {
        self.pass_file(r, jail, Path::new("/dev/net/tun"), true)
    }

    /// Opens `path` for reading (and writing) and passes the descriptor to
    /// domain `r`'s jailed VMM with a new tag, which it returns.
    fn pass_file(&self, r: &db::Row, jail: &JailSpec, path: &Path, write: bool) -> Result<u64> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
        self.pass_open(r, jail, &file, path)
    }

    /// Passes `file` (open at `path`) to domain `r`'s jailed VMM with a new
    /// tag, which it returns.
    pub(crate) fn pass_open(
        &self,
        r: &db::Row,
        jail: &JailSpec,
        file: &std::fs::File,
        path: &Path,
    ) -> Result<u64> {
        let socket = jail.fd_socket.as_ref().ok_or_else(|| {
            Error::Invalid(format!("domain {}'s VMM takes no descriptors", r.name))
        })?;
        let mut tag = [0u8; 8];
        // SAFETY: getrandom(2) fills `tag`.
        unsafe { libc::getrandom(tag.as_mut_ptr().cast(), tag.len(), 0) };
        let tag = u64::from_ne_bytes(tag);
        domus_jail::fdpass::send(socket, tag, file.as_fd()).map_err(|e| Error::Start {
            name: r.name.clone(),
            msg: if crate::vmmcall::vmm_exited(r) {
                format!(
                    "passing {}: {}: {e}",
                    path.display(),
                    crate::vmmcall::VMM_EXITED
                )
            } else {
                format!("passing {} to its VMM: {e}", path.display())
            },
        })?;
        Ok(tag)
    }
}

/// The host's ids of the threads `tids` of process `pid`, which gives them
/// as its own PID namespace numbers them (a jailed VMM is PID 1 of its
/// own); ids it does not have are left as they are.
pub(crate) fn host_tids(pid: i64, tids: &[i32]) -> Vec<i32> {
    let mut map = Vec::new();
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for e in dir.flatten() {
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            if let Some(ids) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) {
                let ids: Vec<i32> = ids
                    .split_whitespace()
                    .filter_map(|t| t.parse().ok())
                    .collect();
                if let (Some(host), Some(own)) = (ids.first(), ids.last()) {
                    map.push((*own, *host));
                }
            }
        }
    }
    tids.iter()
        .map(|t| map.iter().find(|(own, _)| own == t).map_or(*t, |(_, h)| *h))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::FakeTaps;
    use crate::fakes::{config, daemon_with, StandIn};
    use crate::{HostOps, Policy};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_jailed_domain_gets_its_own_ids_root_and_taps() {
        let taps = Arc::new(FakeTaps::default());
        let host = HostOps {
            launcher: Box::new(StandIn::new(Duration::ZERO, None)),
            taps: taps.clone(),
            groups: None,
            firewall: None,
        };
        let policy = Policy {
            jail: Some(70_000),
            ..Policy::any()
        };
        let (d, state) = daemon_with("jailed", policy, host);
        d.create("a.cfg", "/", &config("a", "vif = ['bridge=br0']"), &[])
            .unwrap();
        let r = d.find("a").unwrap();
        let jail = d.running_jail(&r).expect("a jail in its VM spec");
        let id = 70_000 + u32::try_from(r.id).unwrap();
        assert_eq!((jail.uid, jail.gid), (id, id));
        assert!(jail.root.is_dir() && jail.root.starts_with(&state));
        assert_eq!(jail.max_file_bytes, 1 << 30);
        assert!(jail.fd_socket.is_some());
        let owners = taps.owners.lock().unwrap().clone();
        assert_eq!(
            owners.values().collect::<Vec<_>>(),
            [&(id, id)],
            "{owners:?}"
        );

        // A disk larger than the VMM may write is refused, nothing passed.
        let big = state.join("big.img");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(3 << 30)
            .unwrap();
        let e = d
            .block_attach("a", &format!("{},raw,xvdb,rw", big.display()))
            .unwrap_err();
        assert_eq!(e.status(), 400, "{e}");
        assert!(e.to_string().contains("larger than the files"), "{e}");
        assert!(d.find("a").unwrap().config.disks.is_empty());
        d.destroy("a").unwrap();
        let _ = std::fs::remove_dir_all(state);
    }

    #[test]
    fn thread_ids_outside_a_pid_namespace_stay_as_they_are() {
        let me = i64::from(std::process::id());
        // SAFETY: gettid(2) has no arguments.
        let tid = unsafe { libc::gettid() };
        assert_eq!(host_tids(me, &[tid, -5]), vec![tid, -5]);
        assert_eq!(host_tids(-1, &[3]), vec![3]);
    }
}
