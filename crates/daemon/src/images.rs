//! Domains booted from an image (`image = "NAME"`): the daemon takes the
//! kernel and initrd from the image, makes the domain's root disk (a qcow2
//! overlay on the image's disk) and its cloud-init seed disk in the
//! overlay directory, and removes them with the domain unless it was told
//! to keep the overlay (`image_keep = 1`). A save or a live migration keeps
//! them: the snapshot or the destination uses them.

use std::path::{Path, PathBuf};

use domus_api::domain::{Disk, DomainConfig};
use domus_api::spec::DiskFormat;
use domus_disk::{create, CreateOptions};
use domus_image::{Seed, Store};

use crate::{db, overlay_dir, Daemon, Error, Result};

/// Whether kernel command line `cmdline` names a `root=` (before a `--`,
/// after which the words are init's).
fn names_root(cmdline: &str) -> bool {
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .any(|w| w.starts_with("root="))
}

/// The vdevs the image's root disk takes (the guest's /dev/vda).
const ROOT_VDEVS: [&str; 4] = ["xvda", "vda", "hda", "sda"];

impl Daemon {
    /// Fills in what `c`'s image gives and makes its disks; a `c` without
    /// an image is left as it is.
    pub(crate) fn use_image(&self, c: &mut DomainConfig) -> Result<()> {
        let Some(u) = c.image.as_mut() else {
            return Ok(());
        };
        let store = Store::new(self.files.image_dirs.clone());
        let info = store
            .find(&u.name)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let rec = &info.record;
        if let Some(d) = c
            .disks
            .iter()
            .find(|d| ROOT_VDEVS.contains(&d.vdev.as_str()))
        {
            return Err(Error::Invalid(format!(
                "disk {} ({}): the image's root disk is the first disk; give the others xvdb, xvdc, ...",
                d.vdev,
                d.path.display()
            )));
        }
        if !names_root(&c.cmdline) {
            let root = rec.root.as_deref().unwrap_or("/dev/vda");
            c.cmdline = format!("root={root} {}", c.cmdline);
        }
        if c.kernel.as_os_str().is_empty() {
            c.kernel = info.dir.join(&rec.kernel);
            if c.ramdisk.is_none() {
                c.ramdisk = Some(info.dir.join(&rec.initrd));
            }
        }
        let dir = overlay_dir(&self.state);
        std::fs::create_dir_all(&dir)?;
        let base = info.dir.join(&rec.disk);
        let overlay = dir.join(format!("{}.qcow2", c.name));
        let reused = overlay.exists();
        if reused {
            // Kept from an earlier domain of this name: used again if it is
            // an overlay on this image.
            let f = std::fs::File::open(&overlay)?;
            let on = domus_disk::header(&f, &overlay)
                .ok()
                .and_then(|h| h.backing_file)
                .map(PathBuf::from);
            if on.as_deref() != Some(base.as_path()) {
                return Err(Error::Invalid(format!(
                    "{} exists and is not an overlay on image {} (kept from an earlier domain \
                     named {}?): remove it or pick another name",
                    overlay.display(),
                    u.name,
                    c.name
                )));
            }
            self.log(&format!(
                "domain {}: using the kept overlay {}",
                c.name,
                overlay.display()
            ));
        } else {
            create(
                &overlay,
                &CreateOptions::overlay(&base, DiskFormat::Qcow2, rec.size_bytes),
            )
            .map_err(|e| Error::Invalid(format!("making the root disk: {e}")))?;
        }
        let seed = dir.join(format!("{}.seed.img", c.name));
        let _ = std::fs::remove_file(&seed);
        let made = domus_image::make_seed(
            &seed,
            &Seed {
                instance_id: format!("domus-{}-{}", c.name, seconds()),
                hostname: c.name.clone(),
                ssh_keys: u.ssh_keys.clone(),
                network_config: None,
            },
        );
        if let Err(e) = made {
            // Only what this call made goes: a kept overlay stays.
            if !reused {
                let _ = std::fs::remove_file(&overlay);
            }
            return Err(Error::Invalid(format!(
                "making the cloud-init seed disk: {e}"
            )));
        }
        c.disks.insert(
            0,
            Disk {
                path: overlay.clone(),
                format: DiskFormat::Qcow2,
                vdev: "xvda".into(),
                read_only: false,
            },
        );
        c.disks.push(Disk {
            path: seed.clone(),
            format: DiskFormat::Raw,
            vdev: next_vdev(&c.disks),
            read_only: true,
        });
        u.overlay = Some(overlay);
        u.seed = Some(seed);
        Ok(())
    }

    /// Removes what [`Daemon::use_image`] made for domain `r`: the seed,
    /// and the overlay unless it is to be kept.
    pub(crate) fn drop_image_disks(&self, r: &db::Row) {
        let Some(u) = &r.config.image else { return };
        let mut gone: Vec<&Path> = u.seed.iter().map(PathBuf::as_path).collect();
        if !u.keep {
            gone.extend(u.overlay.as_deref());
        } else if let Some(o) = &u.overlay {
            self.log(&format!(
                "domain {}: its overlay {} is kept (image_keep)",
                r.name,
                o.display()
            ));
        }
        for p in gone {
            // Only what the daemon made, in its own directory.
            if p.parent() == Some(overlay_dir(&self.state).as_path()) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

fn seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The first xvdX name no disk of `disks` has.
fn next_vdev(disks: &[Disk]) -> String {
    (b'b'..=b'z')
        .map(|c| format!("xvd{}", c as char))
        .find(|v| !disks.iter().any(|d| &d.vdev == v))
        .unwrap_or_else(|| "xvdz".into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use domus_api::image::{ImageRecord, RECORD};

    use crate::fakes::{daemon_with, host, StandIn};
    use crate::paths::Files;
    use crate::Policy;

    /// An image `name` in `images` whose record names `root`.
    fn image(images: &std::path::Path, name: &str, root: Option<&str>) {
        let dir = images.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        domus_disk::create(
            &dir.join("disk.qcow2"),
            &domus_disk::CreateOptions::size(1 << 20),
        )
        .unwrap();
        std::fs::write(dir.join("vmlinuz"), b"k").unwrap();
        std::fs::write(dir.join("initrd.img"), b"i").unwrap();
        let rec = ImageRecord {
            name: name.into(),
            suite: "noble".into(),
            packages: vec![],
            size_bytes: 1 << 20,
            disk: "disk.qcow2".into(),
            kernel: "vmlinuz".into(),
            initrd: "initrd.img".into(),
            kernel_version: "6.8".into(),
            built: 0,
            inputs: "x".into(),
            root: root.map(str::to_owned),
            source: None,
        };
        std::fs::write(dir.join(RECORD), serde_json::to_string(&rec).unwrap()).unwrap();
    }

    #[test]
    fn an_image_domain_boots_the_root_its_image_names_unless_told_another() {
        let images = std::env::temp_dir().join(format!("domus-images-root-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&images);
        image(&images, "built", None);
        image(&images, "imported", Some("UUID=2f0b8bd2-5c0e"));
        // The daemon serves its overlays (as `domus daemon` does).
        let overlays = std::env::temp_dir()
            .join(format!("domus-fake-image-root-{}", std::process::id()))
            .join("overlays");
        let policy = Policy {
            reserve_mib: 0,
            files: Files::new(vec![images.clone(), overlays], Vec::new()),
            ..Policy::any()
        };
        let s = StandIn::new(Duration::from_millis(5), None);
        let (d, state) = daemon_with("image-root", policy, host(s));
        for (name, settings, root) in [
            ("a", "image = 'built'", "root=/dev/vda rw console=ttyS0"),
            (
                "b",
                "image = 'imported'",
                "root=UUID=2f0b8bd2-5c0e rw console=ttyS0",
            ),
            (
                "c",
                "image = 'imported'\nroot = '/dev/vda2'",
                "root=/dev/vda2 console=ttyS0",
            ),
        ] {
            let cfg = format!("name = '{name}'\nmemory = 64\n{settings}\n");
            d.create("x.cfg", "/", &cfg, &[]).unwrap();
            assert_eq!(d.find(name).unwrap().config.cmdline, root, "{settings}");
            d.destroy(name).unwrap();
        }
        let _ = std::fs::remove_dir_all(state);
        let _ = std::fs::remove_dir_all(images);
    }

    #[test]
    fn a_root_after_the_double_dash_is_init_s() {
        assert!(super::names_root("quiet root=/dev/vdb"));
        assert!(!super::names_root("rw -- root=/dev/vdb"));
        assert!(!super::names_root("rootwait rw"));
    }
}
