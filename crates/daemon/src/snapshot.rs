//! save and restore: a domain written to a snapshot through its VMM's API
//! (`PUT /v1/domain/snapshot`), then destroyed or left paused; and a
//! domain created again from a snapshot (`domus run --restore`).
//!
//! Snapshots are host files the daemon writes and reads as root on a
//! client's word, so both ends are held to the image directories
//! (`--image-dir`, see `paths.rs`): a save never writes outside them or
//! over an existing file, and a restore reads only what is inside them.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use domus_api::daemon::{Created, RestoreRequest, SaveRequest, Saved};
use domus_api::domain::DomainConfig;
use domus_api::snapshot::{memory_file_name, memory_path, part_path, SnapshotBody};
use domus_api::vmm::SnapshotRequest;

use crate::{lock, vmm_error, Daemon, Error, Result};

fn create_new(p: &Path) -> Result<File> {
    File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| Error::Invalid(format!("{}: {e}", p.display())))
}

impl Daemon {
    /// Checks that a snapshot may be written at `path`: an absolute path
    /// in a served directory, with neither it nor its memory file there
    /// yet. Returns the memory file's path.
    fn check_save_target(&self, path: &Path) -> Result<PathBuf> {
        if !path.is_absolute() || path.file_name().is_none() {
            return Err(Error::Invalid(format!(
                "give the snapshot's absolute path, not '{}'",
                path.display()
            )));
        }
        let dir = path.parent().unwrap_or(Path::new("/"));
        self.files.check_dir("snapshot directory", dir)?;
        let mem = path.with_file_name(memory_file_name(path));
        for p in [path, mem.as_path()] {
            if p.symlink_metadata().is_ok() {
                return Err(Error::Invalid(format!(
                    "{} exists: a save never writes over a file",
                    p.display()
                )));
            }
        }
        Ok(mem)
    }

    /// save: writes domain `dom` to `req.file`, then destroys it (or, with
    /// `req.pause`, leaves it paused).
    pub fn save(&self, dom: &str, req: &SaveRequest) -> Result<Saved> {
        let r = self.find(dom)?;
        let path = PathBuf::from(&req.file);
        let mem = self.check_save_target(&path)?;
        let api = self.vmm(&r)?;
        let mut request = SnapshotRequest {
            domain: Some(r.config.clone()),
            ..SnapshotRequest::default()
        };
        // A jailed VMM cannot create files: it is handed them, made here
        // under temporary names and renamed once the save has succeeded.
        let made = match self.running_jail(&r) {
            Some(jail) => {
                let tmp = [part_path(&path), part_path(&mem)];
                let state = create_new(&tmp[0])?;
                let memory = create_new(&tmp[1]).inspect_err(|_| {
                    let _ = std::fs::remove_file(&tmp[0]);
                })?;
                let tags = self
                    .pass_open(&r, &jail, &state, &tmp[0])
                    .and_then(|s| Ok([s, self.pass_open(&r, &jail, &memory, &tmp[1])?]))
                    .inspect_err(|_| {
                        for p in &tmp {
                            let _ = std::fs::remove_file(p);
                        }
                    })?;
                request.state_fd = Some(tags[0]);
                request.memory_fd = Some(tags[1]);
                request.memory_name = Some(memory_file_name(&path));
                Some(tmp)
            }
            None => {
                request.path = Some(path.clone());
                None
            }
        };
        // The memory file's pages are charged to the VMM's cgroup as it
        // writes them (all of them on a tmpfs): it may use twice its
        // memory while it saves.
        let group = self.cgroup_name(r.id);
        let limits = crate::limits(&r.config);
        if let Some(g) = &self.host.groups {
            let more = crate::cgroup::Limits {
                maxmem_mib: limits.maxmem_mib * 2,
                ..limits.clone()
            };
            g.update(&group, &more)?;
        }
        let saved = api.snapshot(&request);
        // Put back for a domain that goes on (kept paused, or not saved).
        if let (Some(g), true) = (&self.host.groups, req.pause || saved.is_err()) {
            g.update(&group, &limits)?;
        }
        let info = match saved {
            Ok(i) => i,
            Err(e) => {
                for p in made.iter().flatten() {
                    let _ = std::fs::remove_file(p);
                }
                return Err(vmm_error(&r)(e));
            }
        };
        if let Some([state, memory]) = &made {
            std::fs::rename(memory, &mem)?;
            std::fs::rename(state, &path)?;
        }
        if req.pause {
            if let Some(l) = lock(&self.live).get_mut(&r.id) {
                l.paused = true;
            }
        } else {
            self.destroy_keeping(&r.id.to_string(), true)?;
        }
        self.log_domain(
            &r.name,
            false,
            &format!(
                "saved domain {} to {} ({} MiB of memory, {} pages written), {}",
                r.name,
                path.display(),
                info.memory_bytes >> 20,
                info.pages_stored,
                if req.pause {
                    "left paused"
                } else {
                    "destroyed"
                }
            ),
        );
        Ok(Saved {
            file: path.display().to_string(),
            memory_file: mem.display().to_string(),
            memory_bytes: info.memory_bytes,
            pages_stored: info.pages_stored,
            paused_ms: info.paused_ms,
            destroyed: !req.pause,
        })
    }

    /// restore: creates the domain saved in `req.file` again, as it was
    /// when saved (paused if it was).
    pub fn restore(&self, req: &RestoreRequest) -> Result<Created> {
        let path = PathBuf::from(&req.file);
        let (mut c, paused) = self.saved_domain(&path)?;
        if let Some(name) = &req.name {
            domus_xlcfg::check_name(name).map_err(Error::Invalid)?;
            c.name = name.clone();
        }
        let created =
            self.create_config(&c, Vec::new(), crate::lifecycle::Start::Restore(&path))?;
        if paused {
            if let Some(l) = lock(&self.live).get_mut(&created.domain.id) {
                l.paused = true;
            }
        }
        Ok(created)
    }

    /// The domain record in the snapshot at `path` (absolute, in a served
    /// directory, its memory file too), and whether it was saved paused.
    pub(crate) fn saved_domain(&self, path: &Path) -> Result<(DomainConfig, bool)> {
        if !path.is_absolute() {
            return Err(Error::Invalid(format!(
                "give the snapshot's absolute path, not '{}'",
                path.display()
            )));
        }
        self.files.check("snapshot", path)?;
        let body: SnapshotBody<serde::de::IgnoredAny> =
            domus_api::snapshot::read(path).map_err(|e| Error::Invalid(e.to_string()))?;
        let s = body.summary;
        let mem = memory_path(path, &s.memory).map_err(Error::Invalid)?;
        self.files.check("snapshot memory", &mem)?;
        let c = s.domain.ok_or_else(|| {
            Error::Invalid(format!(
                "{} was not saved by a daemon (it has no domain record): start it with \
                 `domus run --restore`",
                path.display()
            ))
        })?;
        Ok((c, s.paused))
    }
}
