//! Which host files a domain may be given: kernels, initrds and disk images
//! only from the directories the daemon serves (`--image-dir`), block
//! devices only when listed (`--block-device`). An API client that may
//! create domains must not be able to hand a guest `/etc/shadow` or another
//! domain's disk.
//!
//! Paths are resolved (symbolic links and `..` followed) when they are
//! checked, at every start and hot-plug, so a link inside an image directory
//! that points out of it is refused too.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use domus_api::domain::{Disk, DomainConfig};

use crate::{Error, Result};

/// The host files domains may use.
#[derive(Clone, Debug)]
pub struct Files {
    /// Regular files below these directories.
    pub image_dirs: Vec<PathBuf>,
    /// These block devices (their resolved paths).
    pub block_devices: Vec<PathBuf>,
    /// Tests of other concerns only: any path, unchecked.
    #[cfg(test)]
    pub any: bool,
}

impl Files {
    pub fn new(image_dirs: Vec<PathBuf>, block_devices: Vec<PathBuf>) -> Self {
        Self {
            image_dirs,
            block_devices,
            #[cfg(test)]
            any: false,
        }
    }

    /// Every path a configuration names, each checked.
    pub fn check_config(&self, c: &DomainConfig) -> Result<()> {
        self.check("kernel", &c.kernel)?;
        if let Some(r) = &c.ramdisk {
            self.check("ramdisk", r)?;
        }
        for d in &c.disks {
            self.check_disk(&format!("disk {}", d.vdev), d)?;
        }
        Ok(())
    }

    /// A disk's files: the disk and, for qcow2, every file of its backing
    /// chain, each checked as [`Files::check`] does (read from their
    /// headers by Domus's own parser, opened read-only, under
    /// `domus_disk`'s rules on chains; imago does not run in the daemon).
    /// Returns the chain's paths, the disk first.
    pub fn check_disk(&self, what: &str, d: &Disk) -> Result<Vec<PathBuf>> {
        self.check(what, &d.path)?;
        if d.format.is_raw() {
            return Ok(vec![d.path.clone()]);
        }
        let mut opener = CheckedOpener {
            files: self,
            what,
            refused: None,
        };
        match domus_disk::links(&d.path, d.format, &mut opener) {
            Ok(links) => Ok(links.into_iter().map(|l| l.path).collect()),
            Err(e) => Err(opener
                .refused
                .take()
                .unwrap_or_else(|| Error::Invalid(format!("{what}: {e}")))),
        }
    }

    /// Whether `path` (the domain's `what`) may be given to a guest: a
    /// path that does not resolve is 400, one outside what is served 403.
    pub fn check(&self, what: &str, path: &Path) -> Result<()> {
        #[cfg(test)]
        if self.any {
            return Ok(());
        }
        let real = match path.canonicalize() {
            Ok(real) => real,
            // Whether a file outside the served directories exists is none
            // of the client's business: only a path inside them is told it
            // is missing.
            Err(e) if self.serves(&lexical(path)) => {
                return Err(Error::Invalid(format!("{what} {}: {e}", path.display())))
            }
            Err(_) => return Err(self.refusal(what, &path.display().to_string())),
        };
        let kind = std::fs::metadata(&real)
            .map_err(|e| Error::Invalid(format!("{what} {}: {e}", path.display())))?
            .file_type();
        let shown = if real == path {
            path.display().to_string()
        } else {
            format!("{} (that is {})", path.display(), real.display())
        };
        if kind.is_block_device() {
            if self.block_devices.iter().any(|d| resolved(d) == real) {
                return Ok(());
            }
            return Err(Error::Forbidden(format!(
                "{what} {shown} is a block device the daemon does not serve \
                 (a block device must be listed with `domus daemon --block-device`)"
            )));
        }
        if self.serves(&real) {
            return Ok(());
        }
        Err(self.refusal(what, &shown))
    }

    /// Whether files may be written in directory `dir` (the domain's
    /// `what`): it must exist and lie in a served directory.
    pub fn check_dir(&self, what: &str, dir: &Path) -> Result<()> {
        #[cfg(test)]
        if self.any {
            return Ok(());
        }
        match dir.canonicalize() {
            Ok(real) if real.is_dir() && self.serves(&real) => Ok(()),
            Ok(real) if self.serves(&real) => Err(Error::Invalid(format!(
                "{what} {} is not a directory",
                dir.display()
            ))),
            Err(e) if self.serves(&lexical(dir)) => {
                Err(Error::Invalid(format!("{what} {}: {e}", dir.display())))
            }
            _ => Err(self.refusal(what, &dir.display().to_string())),
        }
    }

    /// Whether `p` (resolved) lies under an image directory.
    fn serves(&self, p: &Path) -> bool {
        self.image_dirs.iter().any(|d| p.starts_with(resolved(d)))
    }

    fn refusal(&self, what: &str, path: &str) -> Error {
        let dirs = shown(&self.image_dirs);
        Error::Forbidden(format!(
            "{what} {path} is not in a directory the daemon serves images from ({}); \
             put it there or start the daemon with `--image-dir` naming its directory",
            if dirs.is_empty() {
                "none".to_string()
            } else {
                dirs.join(", ")
            }
        ))
    }
}

/// Opens a disk's chain for [`Files::check_disk`], each backing file
/// checked first; the daemon's own refusal is kept to be returned as it is.
struct CheckedOpener<'a> {
    files: &'a Files,
    what: &'a str,
    refused: Option<Error>,
}

impl domus_disk::Opener for CheckedOpener<'_> {
    fn open(
        &mut self,
        path: &Path,
        link: usize,
        write: bool,
    ) -> std::result::Result<std::fs::File, domus_disk::Error> {
        if link > 0 {
            let what = format!("{}'s backing file (link {link} of its chain)", self.what);
            if let Err(e) = self.files.check(&what, path) {
                let reason = e.to_string();
                self.refused = Some(e);
                return Err(domus_disk::Error::Refused {
                    path: path.display().to_string(),
                    reason,
                });
            }
        }
        domus_disk::ByPath.open(path, link, write)
    }
}

/// Paths as the API and the log show them.
pub(crate) fn shown(paths: &[PathBuf]) -> Vec<String> {
    paths.iter().map(|p| p.display().to_string()).collect()
}

/// `p` with `.` and `..` taken away by the letter (it need not exist).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `p` with its links followed where it exists (an image directory made
/// after the daemon started counts from then on).
fn resolved(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("domus-paths-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("images/sub")).unwrap();
        std::fs::create_dir_all(d.join("elsewhere")).unwrap();
        std::fs::write(d.join("images/sub/disk.img"), b"x").unwrap();
        std::fs::write(d.join("elsewhere/secret"), b"x").unwrap();
        d
    }

    fn status(r: Result<()>) -> u16 {
        r.map_or_else(|e| e.status(), |()| 200)
    }

    #[test]
    fn only_files_under_the_image_dirs_are_served() {
        let d = scratch("dirs");
        let f = Files::new(vec![d.join("images")], vec![]);
        assert_eq!(status(f.check("disk", &d.join("images/sub/disk.img"))), 200);
        let e = f.check("ramdisk", Path::new("/etc/shadow")).unwrap_err();
        assert_eq!(e.status(), 403);
        assert!(e.to_string().contains("--image-dir"), "{e}");
        assert_eq!(status(f.check("disk", &d.join("elsewhere/secret"))), 403);
        // Out by `..` or by a link: what counts is where the path leads.
        let dotdot = d.join("images/sub/../../elsewhere/secret");
        let e = f.check("disk", &dotdot).unwrap_err();
        assert!(e.to_string().contains("that is"), "{e}");
        assert_eq!(e.status(), 403);
        std::os::unix::fs::symlink(d.join("elsewhere/secret"), d.join("images/link")).unwrap();
        assert_eq!(status(f.check("disk", &d.join("images/link"))), 403);
        // A link that stays inside is fine; so is an image dir given through
        // a link.
        std::os::unix::fs::symlink(d.join("images/sub/disk.img"), d.join("images/in")).unwrap();
        assert_eq!(status(f.check("disk", &d.join("images/in"))), 200);
        std::os::unix::fs::symlink(d.join("images"), d.join("alias")).unwrap();
        let f2 = Files::new(vec![d.join("alias")], vec![]);
        assert_eq!(
            status(f2.check("disk", &d.join("images/sub/disk.img"))),
            200
        );
        // A missing file in a served directory is the user's mistake (400),
        // named; outside them, missing or not, it is refused the same way,
        // so a client learns nothing of the host's files.
        let e = f.check("kernel", &d.join("images/none")).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(e.to_string().starts_with("kernel "), "{e}");
        assert_eq!(
            status(f.check("kernel", Path::new("/etc/no-such-file"))),
            403
        );
        assert_eq!(
            status(f.check("kernel", &d.join("images/../elsewhere/none"))),
            403
        );
        // A directory whose name only begins like an image dir is not in it.
        std::fs::create_dir_all(d.join("images2")).unwrap();
        std::fs::write(d.join("images2/x"), b"x").unwrap();
        assert_eq!(status(f.check("disk", &d.join("images2/x"))), 403);
        // No image dirs: nothing is served.
        let none = Files::new(vec![], vec![]);
        let e = none
            .check("disk", &d.join("images/sub/disk.img"))
            .unwrap_err();
        assert!(e.to_string().contains("(none)"), "{e}");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_qcow2_disk_is_served_only_with_its_whole_chain_and_a_bad_one_is_named() {
        use domus_disk::{create, CreateOptions, Format};
        let d = scratch("chain");
        let f = Files::new(vec![d.join("images")], vec![]);
        let disk = |p: &Path| Disk {
            path: p.to_path_buf(),
            format: Format::Qcow2,
            vdev: "xvda".into(),
            read_only: false,
        };
        let base = d.join("images/sub/disk.img");
        let top = d.join("images/top.qcow2");
        create(&top, &CreateOptions::overlay(&base, Format::Raw, 4096)).unwrap();
        assert_eq!(
            f.check_disk("disk xvda", &disk(&top)).unwrap(),
            vec![top.clone(), base]
        );
        // A backing file outside the image directories: 403, named.
        let out = d.join("images/out.qcow2");
        create(
            &out,
            &CreateOptions::overlay(&d.join("elsewhere/secret"), Format::Raw, 4096),
        )
        .unwrap();
        let e = f.check_disk("disk xvda", &disk(&out)).unwrap_err();
        assert_eq!(e.status(), 403, "{e}");
        assert!(e.to_string().contains("backing file"), "{e}");
        // A corrupt header, a loop and a raw file said to be qcow2: 400.
        let bad = d.join("images/bad.qcow2");
        let mut b = std::fs::read(&top).unwrap();
        b[20..24].copy_from_slice(&[0xff; 4]); // cluster_bits
        std::fs::write(&bad, b).unwrap();
        let e = f.check_disk("disk xvda", &disk(&bad)).unwrap_err();
        assert_eq!(e.status(), 400, "{e}");
        assert!(e.to_string().contains("corrupt"), "{e}");
        let (a, l) = (d.join("images/a.qcow2"), d.join("images/l.qcow2"));
        create(&l, &CreateOptions::overlay(&a, Format::Qcow2, 4096)).unwrap();
        create(&a, &CreateOptions::overlay(&l, Format::Qcow2, 4096)).unwrap();
        let e = f.check_disk("disk xvda", &disk(&a)).unwrap_err();
        assert!(e.to_string().contains("loops"), "{e}");
        let e = f
            .check_disk("disk xvda", &disk(&d.join("images/sub/disk.img")))
            .unwrap_err();
        assert!(e.to_string().contains("not a qcow2 image"), "{e}");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn block_devices_only_when_listed() {
        // /dev/loop0 or any block device the test host has; none: nothing
        // to test here (the guest tests' nested host has them).
        let Some(dev) = std::fs::read_dir("/dev")
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
        else {
            return;
        };
        let f = Files::new(vec![PathBuf::from("/dev")], vec![]);
        assert_eq!(
            status(f.check("disk", &dev)),
            403,
            "an image dir is not enough"
        );
        let f = Files::new(vec![], vec![dev.clone()]);
        assert_eq!(status(f.check("disk", &dev)), 200);
    }
}
