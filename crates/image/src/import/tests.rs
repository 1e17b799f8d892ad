//! Imports of disks made here the way cloud images are made: a GPT with a
//! BIOS boot partition and an ext4 root (and, as Ubuntu's, a separate boot
//! partition), raw and as a compressed qcow2 (`qemu-img convert -c`), and
//! the disks an import refuses. Needs e2fsprogs and qemu-utils
//! (tools/setup), not root.

use std::os::unix::fs::FileExt;

use domus_disk::partitions::write_gpt;

use super::*;

const UUID: &str = "2f0b8bd2-5c0e-4a5e-9d0e-6b1c3b0a9c11";
const BOOT_UUID: &str = "7a1d2e3f-4b5c-4d6e-8f70-8192a3b4c5d6";
const BIOS_BOOT: [u8; 16] = [
    0x48, 0x61, 0x68, 0x21, 0x49, 0x64, 0x6f, 0x6e, 0x74, 0x4e, 0x65, 0x65, 0x64, 0x45, 0x46, 0x49,
];
const LINUX_DATA: [u8; 16] = [
    0xaf, 0x3d, 0xc6, 0x0f, 0x83, 0x84, 0x72, 0x47, 0x8e, 0x79, 0x3d, 0x69, 0xd8, 0x47, 0x7d, 0xe4,
];

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("domus-import-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An ext4 file system of 16 MiB with UUID `uuid` holding `files`.
fn ext4(dir: &Path, name: &str, uuid: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let tree = dir.join(format!("{name}.tree"));
    for (path, data) in files {
        let p = tree.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, data).unwrap();
    }
    fs::create_dir_all(&tree).unwrap();
    let img = dir.join(format!("{name}.ext4"));
    sh(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-U", uuid, "-d"])
        .arg(&tree)
        .arg(&img)
        .arg("16M"));
    img
}

/// A 40 MiB raw disk: a GPT of a BIOS boot partition and file systems
/// `fss` (each 16 MiB, the first of type `first`), from sector 2048 on.
fn disk(dir: &Path, fss: &[&Path], first: [u8; 16]) -> PathBuf {
    let mut d = vec![0u8; 40 << 20];
    let mut parts = vec![(34, 2047, BIOS_BOOT)];
    for (i, f) in fss.iter().enumerate() {
        let start = 2048 + i as u64 * 32768;
        parts.push((
            start,
            start + 32767,
            if i == 0 { first } else { LINUX_DATA },
        ));
        let data = fs::read(f).unwrap();
        let at = start as usize * 512;
        d[at..at + data.len()].copy_from_slice(&data);
    }
    write_gpt(&mut d, &parts);
    let p = dir.join("disk.raw");
    fs::write(&p, &d).unwrap();
    p
}

fn debian_root(dir: &Path, boot: bool) -> PathBuf {
    let mut files: Vec<(&str, &[u8])> = vec![(
        "usr/lib/os-release",
        b"PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_CODENAME=bookworm\n",
    )];
    if boot {
        files.extend([
            ("boot/vmlinuz-6.1.0-9-cloud-amd64", &b"old kernel"[..]),
            ("boot/initrd.img-6.1.0-9-cloud-amd64", b"old initrd"),
            ("boot/vmlinuz-6.1.0-27-cloud-amd64", b"new kernel"),
            ("boot/initrd.img-6.1.0-27-cloud-amd64", b"new initrd"),
            ("boot/vmlinuz-6.9-no-initrd", b"lone kernel"),
        ]);
    }
    ext4(dir, "root", UUID, &files)
}

fn progress() -> impl FnMut(&str) {
    |s: &str| eprintln!("{s}")
}

fn opts(name: &str, source: &Path) -> ImportOptions {
    ImportOptions {
        name: name.into(),
        source: source.to_path_buf(),
    }
}

/// The imported image's disk, read back whole.
fn read_back(images: &Path, name: &str, size: u64) -> Vec<u8> {
    let p = images.join(name).join("disk.qcow2");
    let c = domus_disk::open(
        &p,
        domus_disk::Format::Qcow2,
        false,
        &mut domus_disk::ByPath,
    )
    .unwrap();
    assert!(c.links.len() == 1, "a standalone qcow2");
    let img = Qcow2Image::open_path(&p, false).unwrap();
    let mut all = vec![0u8; size as usize];
    img.read(&mut all, 0).unwrap();
    all
}

#[test]
fn a_cloud_style_disk_imports_raw_and_as_a_compressed_qcow2() {
    let s = Scratch::new("cloud");
    let root = debian_root(&s.0, true);
    let raw = disk(&s.0, &[&root], Kind::LINUX_ROOT_X86_64);
    let qcow2 = s.0.join("cloud.qcow2");
    sh(Command::new("qemu-img")
        .args(["convert", "-c", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2));
    let images = s.0.join("images");
    for (name, source) in [("raw", &raw), ("compressed", &qcow2)] {
        let rec = import(&images, &opts(name, source), &mut progress()).unwrap();
        assert_eq!(rec.root.as_deref(), Some(&*format!("UUID={UUID}")));
        assert_eq!(rec.suite, "bookworm");
        assert_eq!(rec.kernel_version, "6.1.0-27-cloud-amd64", "the newest");
        assert_eq!(rec.size_bytes, 40 << 20);
        assert_eq!(
            rec.source.as_deref(),
            Some(&*source.canonicalize().unwrap())
        );
        let dir = images.join(name);
        assert_eq!(fs::read(dir.join("vmlinuz")).unwrap(), b"new kernel");
        assert_eq!(fs::read(dir.join("initrd.img")).unwrap(), b"new initrd");
        assert_eq!(read_back(&images, name, 40 << 20), fs::read(&raw).unwrap());
        // The store reads it back; nothing of the work is left beside it.
        let found = crate::Store::new(vec![images.clone()]).find(name).unwrap();
        assert_eq!(found.record, rec);
    }
    let left: Vec<_> = fs::read_dir(&images).unwrap().flatten().collect();
    assert_eq!(left.len(), 2, "{left:?}");
    // The name is taken now.
    let e = import(&images, &opts("raw", &raw), &mut progress()).unwrap_err();
    assert!(matches!(e, Error::Exists(_)), "{e}");
}

#[test]
fn a_separate_boot_partition_gives_the_kernel_and_a_bare_file_system_imports_too() {
    let s = Scratch::new("boot");
    let root = debian_root(&s.0, false);
    let boot = ext4(
        &s.0,
        "boot",
        BOOT_UUID,
        &[
            ("vmlinuz-6.8.0-45-generic", b"ubuntu kernel"),
            ("initrd.img-6.8.0-45-generic", b"ubuntu initrd"),
        ],
    );
    // Ubuntu's layout: the root first, /boot on a later partition, both of
    // the plain Linux data type.
    let raw = disk(&s.0, &[&root, &boot], LINUX_DATA);
    let images = s.0.join("images");
    let rec = import(&images, &opts("split", &raw), &mut progress()).unwrap();
    assert_eq!(rec.root.as_deref(), Some(&*format!("UUID={UUID}")));
    assert_eq!(rec.kernel_version, "6.8.0-45-generic");
    assert_eq!(
        fs::read(images.join("split/vmlinuz")).unwrap(),
        b"ubuntu kernel"
    );
    // A file system on the whole disk, no partition table.
    let w = Scratch::new("whole");
    let whole = debian_root(&w.0, true);
    let rec = import(&images, &opts("whole", &whole), &mut progress()).unwrap();
    assert_eq!(rec.root.as_deref(), Some(&*format!("UUID={UUID}")));
    assert_eq!(
        fs::read(images.join("whole/initrd.img")).unwrap(),
        b"new initrd"
    );
}

#[test]
fn disks_an_import_cannot_boot_are_refused_and_leave_nothing() {
    let s = Scratch::new("refused");
    let images = s.0.join("images");
    let refused = |source: &Path| {
        let e = import(&images, &opts("x", source), &mut progress()).unwrap_err();
        assert!(!images.join("x").exists());
        assert_eq!(
            fs::read_dir(&images).map_or(0, |d| d.count()),
            0,
            "no work left"
        );
        e.to_string()
    };
    // No ext4 at all.
    let zeros = s.0.join("zeros.raw");
    fs::File::create(&zeros).unwrap().set_len(4 << 20).unwrap();
    let e = refused(&zeros);
    assert!(e.contains("no Linux root file system"), "{e}");
    // A root without a kernel.
    let root = debian_root(&s.0, false);
    let e = refused(&disk(&s.0, &[&root], Kind::LINUX_ROOT_X86_64));
    assert!(e.contains("no kernel with an initrd"), "{e}");
    // An overlay: its backing file would be needed.
    let base = s.0.join("base.qcow2");
    sh(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&base)
        .arg("4M"));
    let over = s.0.join("over.qcow2");
    sh(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&base)
        .arg(&over));
    let e = refused(&over);
    assert!(e.contains("an overlay on"), "{e}");
    // A corrupt qcow2 header.
    let bad = s.0.join("bad.qcow2");
    let f = fs::File::create(&bad).unwrap();
    f.write_all_at(b"QFI\xfb\0\0\0\x07", 0).unwrap();
    f.set_len(4096).unwrap();
    let e = refused(&bad);
    assert!(e.contains("version 7"), "{e}");
    // A partition table that points off the disk.
    let mut d = fs::read(disk(&s.0, &[&root], Kind::LINUX_ROOT_X86_64)).unwrap();
    d.truncate(10 << 20);
    let cut = s.0.join("cut.raw");
    fs::write(&cut, &d).unwrap();
    let e = refused(&cut);
    assert!(e.contains("not on the disk"), "{e}");
    // No such file.
    let e = refused(&s.0.join("nothing.qcow2"));
    assert!(e.contains("nothing.qcow2"), "{e}");
}
