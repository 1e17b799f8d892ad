//! clone: many domains started from one snapshot, each with an identity
//! of its own.
//!
//! A clone is a restore (`snapshot.rs`) under a new name, with:
//! - its memory mapped copy-on-write from the snapshot's memory file, as
//!   every restore's is: the pages no clone has written are shared by all
//!   of them in the host's page cache;
//! - a vsock CID of its own (its guest learns it from the transport reset
//!   the vsock device sends as it starts);
//! - a copy of each writable disk beside the original (`STEM-NAME.EXT`),
//!   sparse, and reflinked where the filesystem can; read-only disks are
//!   shared;
//! - new MAC addresses: a guest reads its MAC only when its driver probes
//!   the device, so each interface is restored on a tap whose virtual
//!   firewall-router rules allow only a new MAC (its old one, the same in
//!   every clone, never gets past the bridge's port), then unplugged,
//!   and an interface with a new MAC is plugged on the saved bridge: the
//!   guest sees the old one go and a new one come, as with
//!   network-detach and network-attach;
//! - a new VM generation ID (every restore has one; a guest kernel with
//!   the vmgenid driver reseeds its RNG).
//!
//! Either every clone is made or none is left: a failure destroys the
//! clones made and removes their disk copies.

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use domus_api::daemon::{CloneRequest, Cloned, MAX_CLONES};
use domus_api::domain::{DomainConfig, Vif};

use crate::{lock, vmm_error, Daemon, Error, Result};

/// How long a clone's guest has to let go of an interface it restored
/// with (its ACPI eject).
const UNPLUG_WAIT: Duration = Duration::from_secs(60);

impl Daemon {
    /// clone: `req.count` domains started from the snapshot `req.file`
    /// (see the module's comment).
    pub fn clone_snapshot(&self, req: &CloneRequest) -> Result<Cloned> {
        let started = Instant::now();
        if req.count == 0 || req.count > MAX_CLONES {
            return Err(Error::Invalid(format!(
                "a clone makes 1 to {MAX_CLONES} domains, not {}",
                req.count
            )));
        }
        let path = PathBuf::from(&req.file);
        let (base, _) = self.saved_domain(&path)?;
        let prefix = req.prefix.clone().unwrap_or_else(|| base.name.clone());
        let names: Vec<String> = (1..=req.count).map(|i| format!("{prefix}-{i}")).collect();
        self.clone_named(&path, &names, started)
    }

    /// One clone of the snapshot at `path` (absolute), named `name`: what a
    /// configuration with `clone = "FILE"` creates.
    pub(crate) fn clone_one(&self, path: &Path, name: &str) -> Result<domus_api::daemon::Created> {
        let mut c = self.clone_named(path, &[name.to_string()], Instant::now())?;
        Ok(domus_api::daemon::Created {
            domain: c.domains.remove(0),
            warnings: c
                .disks
                .iter()
                .map(|d| format!("its disk copy is {d}"))
                .collect(),
        })
    }

    /// Clones named `names` of the snapshot at `path`.
    fn clone_named(&self, path: &Path, names: &[String], started: Instant) -> Result<Cloned> {
        let path = path.to_path_buf();
        let (base, paused) = self.saved_domain(&path)?;
        let prefix = names.first().cloned().unwrap_or_default();
        for n in names {
            domus_xlcfg::check_name(n).map_err(Error::Invalid)?;
        }
        let rows = lock(&self.db).all()?;
        if let Some(n) = names.iter().find(|n| rows.iter().any(|r| &r.name == *n)) {
            return Err(Error::NameInUse(n.clone()));
        }
        let cids = match base.vsock_cid {
            Some(saved) => {
                let used: HashSet<u64> = rows.iter().filter_map(|r| r.config.vsock_cid).collect();
                let host = |c| self.host.launcher.vsock_cid_free(c);
                let cids = free_cids(saved, &used, host, names.len());
                if cids.len() < names.len() {
                    return Err(Error::Invalid(format!(
                        "only {} vsock CIDs are free above the saved {saved}, for {} clones",
                        cids.len(),
                        names.len()
                    )));
                }
                cids.into_iter().map(Some).collect()
            }
            None => vec![None; names.len()],
        };
        // Each clone's configuration, its disks copied.
        let mut copies = Vec::new();
        let mut configs = Vec::new();
        let planned = (|| -> Result<()> {
            for (name, cid) in names.iter().zip(&cids) {
                let mut c = clone_config(&base, name, *cid);
                for d in c.disks.iter_mut().filter(|d| !d.read_only) {
                    let to = clone_disk_path(&d.path, name)?;
                    copy_sparse(&d.path, &to).map_err(|e| {
                        Error::Invalid(format!(
                            "copying {} to {}: {e}",
                            d.path.display(),
                            to.display()
                        ))
                    })?;
                    copies.push(to.clone());
                    d.path = to;
                }
                configs.push(c);
            }
            Ok(())
        })();
        let outcome = planned.and_then(|()| {
            // All at once: each waits for its VMM and then its guest.
            let results: Vec<(Option<i64>, Result<()>)> = std::thread::scope(|s| {
                let handles: Vec<_> = configs
                    .iter()
                    .map(|c| s.spawn(|| self.start_clone(c, &base.vifs, paused, &path)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            (
                                None,
                                Err(Error::Io(std::io::Error::other(
                                    "a clone's thread panicked",
                                ))),
                            )
                        })
                    })
                    .collect()
            });
            let made: Vec<i64> = results.iter().filter_map(|(id, _)| *id).collect();
            match results.into_iter().find_map(|(_, r)| r.err()) {
                None => Ok(made),
                Some(e) => {
                    for id in made {
                        let _ = self.destroy(&id.to_string());
                    }
                    Err(e)
                }
            }
        });
        let made = match outcome {
            Ok(m) => m,
            Err(e) => {
                for p in &copies {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e);
            }
        };
        let mut domains = Vec::new();
        for id in made {
            domains.push(self.describe(&self.find(&id.to_string())?));
        }
        let elapsed = started.elapsed();
        self.log_domain(
            &prefix,
            false,
            &format!(
                "cloned {} domain(s) ({}{}) from {} in {} ms",
                domains.len(),
                prefix,
                if names.len() > 1 { "..." } else { "" },
                path.display(),
                elapsed.as_millis()
            ),
        );
        Ok(Cloned {
            domains,
            disks: copies.iter().map(|p| p.display().to_string()).collect(),
            elapsed_ms: elapsed.as_secs_f64() * 1000.0,
        })
    }

    /// Starts clone `c` from the snapshot at `path` and replaces its
    /// interfaces (`saved`: the vifs as saved, with their bridges). The
    /// domain's id once it exists, and how it went.
    fn start_clone(
        &self,
        c: &DomainConfig,
        saved: &[Vif],
        paused: bool,
        path: &Path,
    ) -> (Option<i64>, Result<()>) {
        let id = match self.create_config(c, Vec::new(), crate::lifecycle::Start::Restore(path)) {
            Ok(created) => created.domain.id,
            Err(e) => return (None, Err(e)),
        };
        let name = id.to_string();
        (Some(id), self.new_interfaces(&name, saved, paused))
    }

    /// A clone's new MACs: each restored interface unplugged (the guest
    /// lets go), and one with a new MAC plugged on its saved bridge. A
    /// domain saved paused runs from now on: only a running guest can let
    /// go of a device.
    fn new_interfaces(&self, dom: &str, saved: &[Vif], paused: bool) -> Result<()> {
        if saved.is_empty() {
            return Ok(());
        }
        if paused {
            self.pause(dom, false)?;
        }
        let r = self.find(dom)?;
        let api = self.vmm(&r)?;
        let nets: Vec<_> = api
            .devices()
            .map_err(vmm_error(&r))?
            .into_iter()
            .filter(|d| d.kind == "net")
            .collect();
        for (dev, vif) in nets.iter().zip(saved) {
            self.network_detach(dom, dev.fact("mac"))?;
            let deadline = Instant::now() + UNPLUG_WAIT;
            while api.device(&dev.id).is_ok() {
                if Instant::now() > deadline {
                    return Err(Error::Start {
                        name: r.name.clone(),
                        msg: format!(
                            "its guest did not let go of {} within {} s, so it cannot be \
                             given a MAC of its own",
                            dev.id,
                            UNPLUG_WAIT.as_secs()
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.attach_vif(
                dom,
                Vif {
                    mac: None,
                    ip: None,
                    ..vif.clone()
                },
            )?;
        }
        Ok(())
    }
}

/// Clone `name`'s configuration before its disks are copied: the saved
/// domain's, with its own name and vsock CID.
fn clone_config(base: &DomainConfig, name: &str, cid: Option<u64>) -> DomainConfig {
    let mut c = base.clone();
    c.name = name.to_string();
    c.vsock_cid = cid;
    // Restored on taps that are replaced: the create gives them MACs of
    // their own, so the virtual firewall-router drops what the guest sends
    // from the saved one meanwhile, and no address (the new interfaces get
    // the default network's, or none).
    for v in &mut c.vifs {
        v.mac = None;
        v.ip = None;
    }
    // The overlay and seed the daemon made for the saved domain stay the
    // snapshot's: the clone's root disk is a copy of the overlay, which
    // stays when the clone is destroyed as every clone's disk copy does,
    // and the seed (read-only) is shared by every clone. Left here, the
    // first clone destroyed removed both, and with them the snapshot's
    // disks: no clone of it could be made again.
    if let Some(u) = &mut c.image {
        u.overlay = None;
        u.seed = None;
    }
    c
}

/// Up to `n` vsock CIDs above `saved` that no domain in `used` has and
/// that `host_free` says no other VM on the host holds (fewer when the
/// CIDs run out: they are below u32::MAX, which means any).
fn free_cids(
    saved: u64,
    used: &HashSet<u64>,
    host_free: impl Fn(u64) -> bool,
    n: usize,
) -> Vec<u64> {
    /// How many CIDs are asked about at most, so that a host that refuses
    /// every one ends the search.
    const ASKED: usize = 1 << 16;
    (saved.max(2).saturating_add(1)..u64::from(u32::MAX))
        .filter(|c| !used.contains(c))
        .take(ASKED)
        .filter(|c| host_free(*c))
        .take(n)
        .collect()
}

/// Where clone `name`'s copy of disk `path` goes: beside it, as
/// `STEM-NAME.EXT`; refused if something is there already.
fn clone_disk_path(path: &Path, name: &str) -> Result<PathBuf> {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let to = path.with_file_name(format!("{stem}-{name}{ext}"));
    if to.symlink_metadata().is_ok() {
        return Err(Error::Invalid(format!(
            "{} exists: a clone's disk copy never writes over a file",
            to.display()
        )));
    }
    Ok(to)
}

/// Copies `from` into the new file `to` with its holes kept: a reflink
/// where the filesystem shares extents (btrfs, XFS), else only the data
/// extents (`SEEK_DATA`/`SEEK_HOLE`) copied in the kernel
/// (`copy_file_range`). The copy has the original's permissions and is
/// synced before this returns.
pub(crate) fn copy_sparse(from: &Path, to: &Path) -> std::io::Result<()> {
    let src = File::open(from)?;
    let meta = src.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let dst = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    let copied = (|| {
        dst.set_permissions(meta.permissions())?;
        // SAFETY: FICLONE on two descriptors this function holds; it only
        // shares the source's extents with the (empty) destination.
        if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
            return dst.sync_all();
        }
        let len = i64::try_from(meta.len()).map_err(std::io::Error::other)?;
        dst.set_len(meta.len())?;
        let mut pos = 0i64;
        while pos < len {
            // SAFETY: lseek on a descriptor this function holds.
            let data = unsafe { libc::lseek(src.as_raw_fd(), pos, libc::SEEK_DATA) };
            if data < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENXIO) {
                    break; // only a hole is left
                }
                return Err(e);
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(src.as_raw_fd(), data, libc::SEEK_HOLE) };
            if hole < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let (mut off_in, mut off_out) = (data, data);
            while off_in < hole {
                let want = usize::try_from(hole - off_in).map_err(std::io::Error::other)?;
                // SAFETY: copy_file_range between two descriptors this
                // function holds, with offsets it owns.
                let n = unsafe {
                    libc::copy_file_range(
                        src.as_raw_fd(),
                        &mut off_in,
                        dst.as_raw_fd(),
                        &mut off_out,
                        want,
                        0,
                    )
                };
                match n {
                    n if n < 0 => return Err(std::io::Error::last_os_error()),
                    0 => return Err(std::io::Error::other("the disk shrank while it was copied")),
                    _ => {}
                }
            }
            pos = hole;
        }
        dst.sync_all()
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(to);
    }
    copied
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_sparse_disk_is_copied_with_its_data_and_its_holes() {
        let dir = std::env::temp_dir().join(format!("domus-clone-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let from = dir.join("d.img");
        let mut f = File::create(&from).unwrap();
        f.set_len(64 << 20).unwrap();
        f.seek(SeekFrom::Start(3 << 20)).unwrap();
        f.write_all(b"first").unwrap();
        f.seek(SeekFrom::Start((64 << 20) - 5)).unwrap();
        f.write_all(b"last!").unwrap();
        f.sync_all().unwrap();
        let to = clone_disk_path(&from, "web-1").unwrap();
        assert_eq!(to, dir.join("d-web-1.img"));
        copy_sparse(&from, &to).unwrap();
        assert_eq!(std::fs::read(&from).unwrap(), std::fs::read(&to).unwrap());
        // Two 4 KiB blocks of data, not 64 MiB.
        assert!(std::fs::metadata(&to).unwrap().blocks() * 512 < 1 << 20);
        // Never over a file.
        assert!(clone_disk_path(&from, "web-1").is_err());
        assert!(copy_sparse(&from, &to).is_err());
        assert_eq!(std::fs::read(&from).unwrap(), std::fs::read(&to).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_clone_owns_neither_the_saved_domains_overlay_nor_its_seed() {
        let mut base = crate::db::test_config("template");
        base.vifs.push(Vif {
            mac: Some("52:54:00:00:00:01".into()),
            ip: Some("10.0.0.5".into()),
            ..Vif::default()
        });
        base.image = Some(domus_api::image::ImageUse {
            name: "deb".into(),
            keep: false,
            ssh_keys: vec!["ssh-ed25519 AAAA k".into()],
            overlay: Some("/state/overlays/template.qcow2".into()),
            seed: Some("/state/overlays/template.seed.img".into()),
        });
        base.vsock_cid = Some(10);
        let c = clone_config(&base, "web-1", Some(12));
        assert_eq!((c.name.as_str(), c.vsock_cid), ("web-1", Some(12)));
        assert_eq!(
            (c.vifs[0].mac.as_ref(), c.vifs[0].ip.as_ref()),
            (None, None)
        );
        // Destroying the clone (Daemon::drop_image_disks) removes what its
        // image record names: nothing of the snapshot's.
        let u = c.image.unwrap();
        assert_eq!((u.overlay, u.seed), (None, None));
        assert_eq!((u.name.as_str(), u.ssh_keys.len()), ("deb", 1));
    }

    #[test]
    fn clones_take_the_free_cids_above_the_saved_one() {
        let used = HashSet::from([11, 13]);
        let any = |_| true;
        assert_eq!(free_cids(10, &used, any, 3), vec![12, 14, 15]);
        assert_eq!(free_cids(0, &HashSet::new(), any, 2), vec![3, 4]);
        // CIDs that other VMs on the host hold are passed over too.
        let held = |c| c != 12 && c != 15;
        assert_eq!(free_cids(10, &used, held, 3), vec![14, 16, 17]);
        // A saved CID at the top of the range: what is left, not a hang;
        // and a host that refuses every CID ends the search.
        let top = u64::from(u32::MAX) - 2;
        assert_eq!(free_cids(top, &HashSet::new(), any, 3), vec![top + 1]);
        assert!(free_cids(u64::MAX, &HashSet::new(), any, 3).is_empty());
        assert!(free_cids(10, &used, |_| false, 3).is_empty());
    }
}
