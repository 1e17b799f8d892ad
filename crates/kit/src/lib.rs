//! `domus kit`: the default guest, built from Debian's packages without
//! installing anything on the host and without root:
//!
//! * `vmlinuz`: the bzImage of `linux-image-cloud-amd64`'s versioned package;
//! * `vmlinux`: the same kernel's ELF, decompressed from the bzImage payload;
//! * `initramfs.cpio`: busybox (`busybox-static`), the virtio, vsock and
//!   pvpanic modules with their dependencies, and an `/init` that runs the
//!   command given after ` -- ` on the kernel command line;
//! * `rootfs.ext4`: an ext4 image with the same contents (`mkfs.ext4 -d`).
//!
//! The kit is rebuilt only when its inputs (package versions, the init script,
//! the module list) change: a stamp file records them.

mod cpio;
mod payload;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use payload::decompress_payload;

const INIT: &str = include_str!("init.sh");
/// What busybox acpid runs when the power button is pressed.
const POWER_BUTTON: &str = include_str!("power-button.sh");
const POWER_BUTTON_PATH: &str = "etc/acpi/PWRF/00000080";
/// Bumped when the kit's layout changes.
const KIT_FORMAT: u32 = 1;
const KERNEL_META: &str = "linux-image-cloud-amd64";
const BUSYBOX: &str = "busybox-static";
/// Modules the guest loads at boot, dependencies resolved from modules.dep.
pub const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_blk",
    "virtio_net",
    "vmw_vsock_virtio_transport",
    "virtio_balloon",
    "virtio_rng",
    "virtio_console",
    "pvpanic_mmio",
    // The ACPI power button and the input events acpid reads from it.
    "button",
    "evdev",
];
const ROOTFS_MIB: u64 = 64;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{cmd}` failed: {detail}")]
    Command { cmd: String, detail: String },
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The kit's files.
#[derive(Clone, Debug)]
pub struct Kit {
    pub kernel: PathBuf,
    pub vmlinux: PathBuf,
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
}

impl Kit {
    fn in_dir(dir: &Path) -> Kit {
        Kit {
            kernel: dir.join("vmlinuz"),
            vmlinux: dir.join("vmlinux"),
            initrd: dir.join("initramfs.cpio"),
            rootfs: dir.join("rootfs.ext4"),
        }
    }

    /// `kernel=PATH` lines for `eval` in a shell.
    pub fn print(&self) -> String {
        let mut s = String::new();
        for (k, v) in [
            ("kernel", &self.kernel),
            ("vmlinux", &self.vmlinux),
            ("initrd", &self.initrd),
            ("rootfs", &self.rootfs),
        ] {
            let _ = writeln!(s, "{k}={}", shell_quote(&v.display().to_string()));
        }
        s
    }

    fn all_exist(&self) -> bool {
        [&self.kernel, &self.vmlinux, &self.initrd, &self.rootfs]
            .iter()
            .all(|p| p.is_file())
    }
}

fn shell_quote(s: &str) -> String {
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Writes to `out` the initramfs `base` with `files` (path in the guest,
/// permissions, contents) added: a second cpio archive after the first,
/// which Linux unpacks over it. The tests add the guest agent
/// (`domus-guest`) this way; the kit itself does not carry it.
pub fn extend_initrd(base: &Path, files: &[(&str, u32, &[u8])], out: &Path) -> Result<()> {
    let mut data = io("reading", base, std::fs::read(base))?;
    let mut w = cpio::CpioWriter::new(Vec::new());
    for (name, perm, contents) in files {
        io("archiving", out, w.file(name, *perm, contents))?;
    }
    // The kernel reads concatenated archives from 4-byte boundaries.
    data.resize(data.len().div_ceil(4) * 4, 0);
    data.extend(io("archiving", out, w.finish())?);
    io("writing", out, std::fs::write(out, data))
}

/// `$XDG_CACHE_HOME/domus/kit`, or `~/.cache/domus/kit`.
pub fn default_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into())).join(".cache")
        });
    base.join("domus").join("kit")
}

fn progress(step: usize, msg: &str) {
    eprintln!("domus kit: [{step}/6] {msg}");
}

fn run(cmd: &mut Command) -> Result<String> {
    let desc = format!("{cmd:?}").replace('"', "");
    let out = cmd.output().map_err(|e| Error::Command {
        cmd: desc.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Command {
            cmd: desc,
            detail: err.lines().last().unwrap_or("no message").to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn io<T>(what: &'static str, path: &Path, r: std::io::Result<T>) -> Result<T> {
    r.map_err(|source| Error::Io {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The versioned kernel package behind the metapackage, e.g.
/// `linux-image-6.1.0-56-cloud-amd64`.
fn kernel_package() -> Result<String> {
    let out = run(Command::new("apt-cache").args(["depends", KERNEL_META]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| {
            p.starts_with("linux-image-") && p.as_bytes().get(12).is_some_and(u8::is_ascii_digit)
        })
        .map(str::to_string)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "apt-cache depends {KERNEL_META}: no versioned kernel package"
            ))
        })
}

fn package_version(pkg: &str) -> Result<String> {
    let out = run(Command::new("apt-cache").args(["show", "--no-all-versions", pkg]))?;
    out.lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .map(str::to_string)
        .ok_or_else(|| Error::Invalid(format!("apt-cache show {pkg}: no version")))
}

/// Builds the kit in `dir`, or reuses it if its inputs have not changed.
pub fn build(dir: &Path, force: bool) -> Result<Kit> {
    let kit = Kit::in_dir(dir);
    progress(1, "resolving packages");
    let kpkg = kernel_package()?;
    let stamp = format!(
        "format={KIT_FORMAT}\n{kpkg}={}\n{BUSYBOX}={}\nmodules={}\ninit={:016x}\npower-button={:016x}\n",
        package_version(&kpkg)?,
        package_version(BUSYBOX)?,
        MODULES.join(","),
        fnv1a(INIT.as_bytes()),
        fnv1a(POWER_BUTTON.as_bytes()),
    );
    let stamp_path = dir.join("kit.stamp");
    if !force
        && kit.all_exist()
        && std::fs::read_to_string(&stamp_path).ok().as_deref() == Some(&stamp)
    {
        eprintln!("domus kit: up to date in {}", dir.display());
        return Ok(kit);
    }
    io("creating", dir, std::fs::create_dir_all(dir))?;
    let _ = std::fs::remove_file(&stamp_path);
    let work = dir.join("work");
    let _ = std::fs::remove_dir_all(&work);
    io("creating", &work, std::fs::create_dir_all(&work))?;

    progress(
        2,
        &format!("downloading {kpkg} and {BUSYBOX} with apt-get download"),
    );
    let mut dl = Command::new("apt-get");
    dl.current_dir(&work).args(["download", "-q"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // As root, apt would try to drop to the _apt user, who cannot write here.
        dl.args(["-o", "APT::Sandbox::User=root"]);
    }
    run(dl.args([kpkg.as_str(), BUSYBOX]))?;
    let root = work.join("pkg");
    for entry in io("reading", &work, std::fs::read_dir(&work))? {
        let p = io("reading", &work, entry)?.path();
        if p.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg-deb").arg("-x").arg(&p).arg(&root))?;
        }
    }
    let kver = kpkg.trim_start_matches("linux-image-").to_string();

    progress(3, "extracting the kernel and decompressing vmlinux");
    let bz = root.join("boot").join(format!("vmlinuz-{kver}"));
    let bz_bytes = io("reading", &bz, std::fs::read(&bz))?;
    let elf = decompress_payload(&bz_bytes)?;
    io("writing", &kit.vmlinux, std::fs::write(&kit.vmlinux, elf))?;
    io(
        "writing",
        &kit.kernel,
        std::fs::write(&kit.kernel, &bz_bytes),
    )?;

    progress(4, "resolving modules");
    let mdir = root.join("lib/modules").join(&kver);
    run(Command::new("depmod").arg("-b").arg(&root).arg(&kver))?;
    let dep = io(
        "reading",
        &mdir,
        std::fs::read_to_string(mdir.join("modules.dep")),
    )?;
    let order = module_order(&dep, MODULES)?;

    progress(5, "writing the initramfs");
    let busybox = io(
        "reading busybox",
        &root,
        std::fs::read(root.join("bin/busybox")),
    )?;
    let applets = run(Command::new(root.join("bin/busybox")).arg("--list-full"))?;
    let tree = GuestTree {
        busybox: &busybox,
        applets: applets.lines().map(str::to_string).collect(),
        modules: order
            .iter()
            .map(|m| {
                let p = mdir.join(m);
                let data = io("reading module", &p, std::fs::read(&p))?;
                Ok((basename(m).to_string(), data))
            })
            .collect::<Result<_>>()?,
    };
    let cpio = tree.cpio().map_err(|e| Error::Io {
        what: "building",
        path: kit.initrd.clone(),
        source: e,
    })?;
    io("writing", &kit.initrd, std::fs::write(&kit.initrd, cpio))?;

    progress(
        6,
        &format!("making the {ROOTFS_MIB} MiB ext4 root filesystem"),
    );
    let rdir = work.join("rootfs");
    io("writing", &rdir, tree.write_dir(&rdir))?;
    let _ = std::fs::remove_file(&kit.rootfs);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", "domus-root", "-E", "root_owner=0:0", "-d"])
        .arg(&rdir)
        .arg(&kit.rootfs)
        .arg(format!("{ROOTFS_MIB}M")))?;

    let _ = std::fs::remove_dir_all(&work);
    io("writing", &stamp_path, std::fs::write(&stamp_path, stamp))?;
    eprintln!("domus kit: done in {}", dir.display());
    Ok(kit)
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Load order for `wanted` modules from a modules.dep text: every module after
/// its dependencies, each once. Names match with `-` and `_` equivalent.
pub fn module_order(dep: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let mut deps = std::collections::HashMap::new();
    let mut by_name = std::collections::HashMap::new();
    for line in dep.lines() {
        let Some((m, d)) = line.split_once(':') else {
            continue;
        };
        let name = basename(m).trim_end_matches(".ko").replace('-', "_");
        by_name.insert(name, m.to_string());
        deps.insert(
            m.to_string(),
            d.split_whitespace().map(str::to_string).collect::<Vec<_>>(),
        );
    }
    fn visit(
        m: &str,
        deps: &std::collections::HashMap<String, Vec<String>>,
        out: &mut Vec<String>,
        depth: usize,
    ) -> Result<()> {
        if out.iter().any(|x| x == m) {
            return Ok(());
        }
        if depth > 64 {
            return Err(Error::Invalid(format!("module dependency loop at {m}")));
        }
        let ds = deps
            .get(m)
            .ok_or_else(|| Error::Invalid(format!("module {m} is not in modules.dep")))?;
        // modules.dep lists dependencies so that loading them last-first works.
        for d in ds.iter().rev() {
            visit(d, deps, out, depth + 1)?;
        }
        out.push(m.to_string());
        Ok(())
    }
    let mut out = Vec::new();
    for w in wanted {
        let path = by_name
            .get(&w.replace('-', "_"))
            .ok_or_else(|| Error::Invalid(format!("the kernel has no module {w}")))?;
        visit(path, &deps, &mut out, 0)?;
    }
    Ok(out)
}

/// The guest's files, written either as a cpio archive or as a directory
/// for mkfs.ext4.
struct GuestTree<'a> {
    busybox: &'a [u8],
    applets: Vec<String>,
    modules: Vec<(String, Vec<u8>)>,
}

const DIRS: &[&str] = &[
    "bin",
    "sbin",
    "usr",
    "usr/bin",
    "usr/sbin",
    "etc",
    "etc/domus",
    "etc/acpi",
    "etc/acpi/PWRF",
    "lib",
    "lib/modules",
    "proc",
    "sys",
    "dev",
    "tmp",
    "run",
    "root",
    "mnt",
    "newroot",
    "var",
];

impl GuestTree<'_> {
    fn module_list(&self) -> String {
        self.modules.iter().map(|(n, _)| format!("{n}\n")).collect()
    }

    fn links(&self) -> impl Iterator<Item = (&str, String)> {
        self.applets
            .iter()
            .map(|a| a.trim_start_matches('/'))
            .filter(|a| *a != "bin/busybox" && !a.is_empty())
            .map(|a| {
                let up = "../".repeat(a.matches('/').count());
                (a, format!("{up}bin/busybox"))
            })
    }

    fn cpio(&self) -> std::io::Result<Vec<u8>> {
        let mut w = cpio::CpioWriter::new(Vec::new());
        for d in DIRS {
            w.dir(d)?;
        }
        w.char_dev("dev/console", 0o600, 5, 1)?;
        w.file("bin/busybox", 0o755, self.busybox)?;
        for (a, target) in self.links() {
            w.symlink(a, &target)?;
        }
        w.file("init", 0o755, INIT.as_bytes())?;
        w.file(POWER_BUTTON_PATH, 0o755, POWER_BUTTON.as_bytes())?;
        w.file("etc/domus/modules", 0o644, self.module_list().as_bytes())?;
        for (name, data) in &self.modules {
            w.file(&format!("lib/modules/{name}"), 0o644, data)?;
        }
        w.finish()
    }

    fn write_dir(&self, root: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::remove_dir_all(root);
        for d in DIRS {
            std::fs::create_dir_all(root.join(d))?;
        }
        let bb = root.join("bin/busybox");
        std::fs::write(&bb, self.busybox)?;
        std::fs::set_permissions(&bb, std::fs::Permissions::from_mode(0o755))?;
        for (a, target) in self.links() {
            std::os::unix::fs::symlink(target, root.join(a))?;
        }
        for (p, text) in [
            ("init", INIT),
            ("sbin/domus-init", INIT),
            (POWER_BUTTON_PATH, POWER_BUTTON),
        ] {
            let f = root.join(p);
            std::fs::write(&f, text)?;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::write(root.join("etc/domus/modules"), self.module_list())?;
        // Tells /init it runs on the root disk, past the initramfs.
        std::fs::write(root.join("etc/domus/on-root"), "")?;
        for (name, data) in &self.modules {
            std::fs::write(root.join("lib/modules").join(name), data)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
";

    #[test]
    fn an_extended_initrd_is_the_base_then_one_more_archive() {
        let dir = std::env::temp_dir().join(format!("domus-kit-extend-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("base.cpio");
        let mut w = cpio::CpioWriter::new(Vec::new());
        w.file("init", 0o755, b"#!/bin/sh\n").unwrap();
        let mut first = w.finish().unwrap();
        first.push(0); // not 4-aligned
        std::fs::write(&base, &first).unwrap();
        let out = dir.join("out.cpio");
        extend_initrd(&base, &[("bin/agent", 0o755, b"ELF")], &out).unwrap();
        let data = std::fs::read(&out).unwrap();
        assert_eq!(&data[..first.len()], &first[..]);
        let second = &data[first.len().div_ceil(4) * 4..];
        assert!(second.starts_with(b"070701"));
        let text = String::from_utf8_lossy(second);
        assert!(text.contains("bin/agent") && text.contains("ELF") && text.contains("TRAILER!!!"));
        assert!(extend_initrd(&dir.join("missing"), &[], &out).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn dependencies_come_first_once() {
        let o = module_order(DEP, &["virtio_pci", "virtio_blk", "virtio_rng"]).unwrap();
        let names: Vec<&str> = o.iter().map(|m| basename(m)).collect();
        assert_eq!(
            names,
            vec![
                "virtio_ring.ko",
                "virtio.ko",
                "virtio_pci_modern_dev.ko",
                "virtio_pci_legacy_dev.ko",
                "virtio_pci.ko",
                "virtio_blk.ko",
                "virtio-rng.ko"
            ]
        );
    }

    #[test]
    fn unknown_module_is_an_error() {
        let e = module_order(DEP, &["nope"]).unwrap_err();
        assert_eq!(e.to_string(), "the kernel has no module nope");
        let e = module_order("a.ko: b.ko\n", &["a"]).unwrap_err();
        assert!(e.to_string().contains("b.ko is not in modules.dep"));
    }

    #[test]
    fn print_is_shell_evaluable() {
        let k = Kit::in_dir(Path::new("/tmp/my kit"));
        let p = k.print();
        assert!(p.starts_with("kernel='/tmp/my kit/vmlinuz'\n"));
        assert_eq!(p.lines().count(), 4);
        assert_eq!(shell_quote("/a/b"), "/a/b");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn applet_links_point_at_busybox() {
        let t = GuestTree {
            busybox: b"",
            applets: vec![
                "/bin/sh".into(),
                "/usr/sbin/chroot".into(),
                "/bin/busybox".into(),
            ],
            modules: vec![],
        };
        let l: Vec<_> = t.links().collect();
        assert_eq!(
            l,
            vec![
                ("bin/sh", "../bin/busybox".to_string()),
                ("usr/sbin/chroot", "../../bin/busybox".to_string())
            ]
        );
    }
}
