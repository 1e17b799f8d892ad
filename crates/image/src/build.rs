//! Building an image: a Debian root file system from Debian's packages
//! (mmdebstrap, as root: no loop devices, no mounts of the image), set up
//! for cloud-init's NoCloud seed disk, made into an ext4 file system with
//! `mkfs.ext4 -d` and copied into a qcow2 disk extent by extent.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use domus_api::image::{ImageRecord, RECORD};
use domus_disk::{create, CreateOptions, Qcow2Image};

use crate::{run, staged, Error, Result};

/// Installed in every image: systemd with logind (the ACPI power button
/// powers it off), cloud-init for first-boot configuration from the seed
/// disk, OpenSSH, DHCP through ifupdown (which cloud-init renders), sudo
/// for cloud-init's default user, and Debian's cloud kernel with its
/// initramfs-tools initrd.
pub const BASE_PACKAGES: &[&str] = &[
    "systemd-sysv",
    "udev",
    "dbus",
    "cloud-init",
    "openssh-server",
    "ifupdown",
    "isc-dhcp-client",
    "netbase",
    "iproute2",
    "sudo",
    "linux-image-cloud-amd64",
    "initramfs-tools",
];

/// Changes whenever what a build writes changes: part of the inputs' hash.
const BUILD_VERSION: &str = "domus-image-2";

/// What `domus image build` is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    pub name: String,
    pub suite: String,
    /// The root disk's size in bytes.
    pub size: u64,
    /// More packages to install.
    pub packages: Vec<String>,
    /// The Debian mirror; none: the one this host's apt uses for the
    /// suite, else deb.debian.org.
    pub mirror: Option<String>,
}

impl BuildOptions {
    /// A hash of the inputs: images built from the same ones are the same.
    pub fn inputs(&self) -> String {
        let mut p = self.packages.clone();
        p.sort();
        p.dedup();
        let text = format!(
            "{BUILD_VERSION}\n{}\n{}\n{}",
            self.suite,
            self.size,
            p.join(",")
        );
        let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
        d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The mirror this host's apt uses for `suite`.
fn host_mirror(suite: &str) -> Option<String> {
    let out = Command::new("apt-get")
        .args([
            "indextargets",
            "--format",
            "$(SITE) $(CODENAME) $(TARGET_OF)",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 3 && f[1] == suite && f[2] == "deb").then(|| f[0].to_string())
    })
}

pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).map_err(|e| Error::io(d.display(), e))?;
    }
    fs::write(path, text).map_err(|e| Error::io(path.display(), e))
}

/// Builds image `opts.name` into `images` (a directory of images), saying
/// each step through `progress`; returns its record. Nothing is left of a
/// build that fails.
pub fn build(
    images: &Path,
    opts: &BuildOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageRecord> {
    let checks = || {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Tool {
                tool: "mmdebstrap".into(),
                reason: "building an image needs root (the tree is set up in a chroot)".into(),
            });
        }
        if opts.size < 1 << 30 {
            return Err(Error::Tool {
                tool: "mkfs.ext4".into(),
                reason: format!(
                    "{} bytes is too small for a Debian root (1G at least)",
                    opts.size
                ),
            });
        }
        Ok(())
    };
    staged(images, &opts.name, "build", checks, |work| {
        build_in(work, opts, progress)
    })
}

fn build_in(
    work: &Path,
    opts: &BuildOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageRecord> {
    let root = work.join("root");
    let out = work.join("out");
    let mirror = opts
        .mirror
        .clone()
        .or_else(|| host_mirror(&opts.suite))
        .unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let mut include: Vec<String> = BASE_PACKAGES.iter().map(|s| s.to_string()).collect();
    include.extend(opts.packages.iter().cloned());
    progress(&format!(
        "[1/5] installing {} packages of Debian {} from {mirror} (mmdebstrap; a minute or more)",
        include.len(),
        opts.suite
    ));
    run(
        Command::new("mmdebstrap")
            .args(["--mode=root", "--variant=minbase", "--components=main"])
            .arg(format!("--include={}", include.join(",")))
            .arg(&opts.suite)
            .arg(&root)
            .arg(&mirror),
        Some(&work.join("mmdebstrap.log")),
    )?;
    progress("[2/5] setting it up for cloud-init and the serial console");
    configure(&root)?;
    progress("[3/5] taking out the kernel and its initrd");
    let version = kernel_version(&root)?;
    for (from, to) in [("vmlinuz", "vmlinuz"), ("initrd.img", "initrd.img")] {
        let src = root.join("boot").join(format!("{from}-{version}"));
        fs::copy(&src, out.join(to)).map_err(|e| Error::io(src.display(), e))?;
    }
    progress(&format!(
        "[4/5] making the ext4 file system ({} MiB, mkfs.ext4 -d)",
        opts.size >> 20
    ));
    let raw = work.join("root.raw");
    run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "domus-root", "-E", "discard", "-d"])
            .arg(&root)
            .arg(&raw)
            .arg(format!("{}k", opts.size >> 10)),
        None,
    )?;
    let _ = fs::remove_dir_all(&root);
    progress("[5/5] copying it into a qcow2 disk");
    let disk = out.join("disk.qcow2");
    to_qcow2(&raw, &disk, opts.size)?;
    let _ = fs::remove_file(&raw);
    let built = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let rec = ImageRecord {
        name: opts.name.clone(),
        suite: opts.suite.clone(),
        packages: opts.packages.clone(),
        size_bytes: opts.size,
        disk: "disk.qcow2".into(),
        kernel: "vmlinuz".into(),
        initrd: "initrd.img".into(),
        kernel_version: version,
        built,
        inputs: opts.inputs(),
        root: None,
        source: None,
    };
    let text = serde_json::to_string_pretty(&rec).map_err(|e| Error::io(RECORD, e.into()))?;
    write(&out.join(RECORD), &text)?;
    Ok(rec)
}

/// The files that make the tree a Domus guest.
fn configure(root: &Path) -> Result<()> {
    write(&root.join("etc/hostname"), "debian\n")?;
    write(
        &root.join("etc/hosts"),
        "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
    )?;
    write(
        &root.join("etc/fstab"),
        "# The root file system is the whole of /dev/vda (domus image build).\n\
         LABEL=domus-root / ext4 rw,discard,errors=remount-ro 0 1\n",
    )?;
    // Only the seed disk Domus makes (or nothing): no probing for clouds.
    write(
        &root.join("etc/cloud/cloud.cfg.d/90-domus.cfg"),
        "# domus image build: configured from the NoCloud seed disk (label cidata).\n\
         datasource_list: [ NoCloud, None ]\n\
         # No locales package in the image: C.UTF-8 is built into libc.\n\
         locale: C.UTF-8\n",
    )?;
    // Every domain makes its own host keys and machine id at first boot
    // (cloud-init's ssh module, systemd).
    for e in fs::read_dir(root.join("etc/ssh")).map_err(|e| Error::io("etc/ssh", e))? {
        let p = e.map_err(|e| Error::io("etc/ssh", e))?.path();
        if p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("ssh_host_"))
        {
            fs::remove_file(&p).map_err(|e| Error::io(p.display(), e))?;
        }
    }
    write(&root.join("etc/machine-id"), "")?;
    let _ = fs::remove_file(root.join("var/lib/dbus/machine-id"));
    Ok(())
}

/// The version of the one kernel in the tree's /boot.
fn kernel_version(root: &Path) -> Result<String> {
    let boot = root.join("boot");
    let mut versions: Vec<String> = fs::read_dir(&boot)
        .map_err(|e| Error::io(boot.display(), e))?
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().into_owned();
            n.strip_prefix("vmlinuz-").map(str::to_owned)
        })
        .collect();
    versions.sort();
    match versions.as_slice() {
        [v] if boot.join(format!("initrd.img-{v}")).exists() => Ok(v.clone()),
        _ => Err(Error::Broken {
            dir: boot.display().to_string(),
            reason: format!("expected one kernel with its initrd, found {versions:?}"),
        }),
    }
}

/// Copies raw image `raw` into a new qcow2 `disk` of `size` bytes, only
/// its data extents (SEEK_DATA/SEEK_HOLE) and of those only blocks that
/// are not zero.
pub(crate) fn to_qcow2(raw: &Path, disk: &Path, size: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    create(disk, &CreateOptions::size(size))?;
    let img = Qcow2Image::open_path(disk, true)?;
    let f = fs::File::open(raw).map_err(|e| Error::io(raw.display(), e))?;
    let len = f
        .metadata()
        .map_err(|e| Error::io(raw.display(), e))?
        .len()
        .min(size);
    let io = |e| Error::io(disk.display(), e);
    let mut at = 0u64;
    while at < len {
        // SAFETY: lseek on our own descriptor; no memory is involved.
        let data = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, libc::SEEK_DATA) };
        if data < 0 {
            break; // no data after `at`
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let (start, end) = (data as u64, (hole.max(data) as u64).min(len));
        crate::copy_nonzero(
            end - start,
            |buf, p| {
                f.read_exact_at(buf, start + p)
                    .map_err(|e| Error::io(raw.display(), e))
            },
            |block, p| img.write(block, start + p).map_err(io),
        )?;
        at = end.max(start + 1);
    }
    img.flush().map_err(io)?;
    Ok(())
}

/// An image's files, where its record says they are.
pub(crate) fn files(dir: &Path, rec: &ImageRecord) -> [PathBuf; 3] {
    [
        dir.join(&rec.disk),
        dir.join(&rec.kernel),
        dir.join(&rec.initrd),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_hash_what_was_asked_whatever_the_package_order() {
        let a = BuildOptions {
            name: "a".into(),
            suite: "bookworm".into(),
            size: 4 << 30,
            packages: vec!["curl".into(), "vim".into()],
            mirror: None,
        };
        let b = BuildOptions {
            name: "b".into(),
            packages: vec!["vim".into(), "curl".into(), "vim".into()],
            ..a.clone()
        };
        assert_eq!(a.inputs(), b.inputs());
        let c = BuildOptions {
            size: 8 << 30,
            ..a.clone()
        };
        assert_ne!(a.inputs(), c.inputs());
        assert_eq!(a.inputs().len(), 16);
    }

    #[test]
    fn a_raw_file_system_becomes_a_qcow2_disk_with_the_same_bytes() {
        let d = std::env::temp_dir().join(format!("domus-image-q-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let raw = d.join("r.raw");
        let f = fs::File::create(&raw).unwrap();
        f.set_len(8 << 20).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&[7u8; 5000], 3 << 20).unwrap();
        f.write_all_at(&[9u8; 10], (8 << 20) - 10).unwrap();
        let q = d.join("d.qcow2");
        to_qcow2(&raw, &q, 8 << 20).unwrap();
        let img = Qcow2Image::open_path(&q, false).unwrap();
        let mut all = vec![1u8; 8 << 20];
        img.read(&mut all, 0).unwrap();
        assert_eq!(all, fs::read(&raw).unwrap());
        fs::remove_dir_all(&d).unwrap();
    }
}
