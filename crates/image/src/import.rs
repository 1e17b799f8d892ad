//! Importing a disk image a user brings (`domus image import FILE NAME`):
//! Debian's and Ubuntu's cloud images (`genericcloud`: a qcow2, often
//! compressed, with a GPT and the kernel inside), or any raw or qcow2 disk
//! whose Linux root is ext4, partitioned or not. Nothing is mounted:
//! Domus's own partition table reader (`domus_disk::partitions`) finds the
//! ext4 file systems, each is copied out to a sparse scratch file, and
//! e2fsprogs' `debugfs` reads its os-release and `/boot` (or, for a
//! separate boot partition, its top directory). The newest kernel with an
//! initrd is copied beside the image for direct boot, the root file system
//! is named by UUID on the kernel's command line, and the disk becomes a
//! standalone qcow2 of its own (the source is never used again).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use domus_api::image::{ImageRecord, RECORD};
use domus_disk::partitions::{partitions, Kind};
use domus_disk::{create, CreateOptions, Qcow2Image};

use crate::build::{to_qcow2, write};
use crate::{staged, Error, Result};

/// What `domus image import` is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportOptions {
    pub name: String,
    /// A raw or qcow2 disk image (the format is read from its first bytes).
    pub source: PathBuf,
}

/// The disk being imported, read where a guest would see it.
enum Source {
    Raw(fs::File),
    Qcow2(Qcow2Image),
}

impl Source {
    fn open(path: &Path) -> Result<(Source, u64)> {
        let f = fs::File::open(path).map_err(|e| Error::io(path.display(), e))?;
        let header = match domus_disk::header(&f, path) {
            Ok(h) => Some(h),
            Err(domus_disk::Error::NotQcow2 { .. }) => None,
            Err(e) => return Err(e.into()),
        };
        let Some(h) = header else {
            let size = f
                .metadata()
                .map_err(|e| Error::io(path.display(), e))?
                .len();
            return Ok((Source::Raw(f), size));
        };
        if let Some(b) = h.backing_file {
            return Err(Error::Broken {
                dir: path.display().to_string(),
                reason: format!(
                    "an overlay on {b}: import a standalone image (`qemu-img convert -O qcow2` \
                     makes one of the whole chain)"
                ),
            });
        }
        let img = Qcow2Image::open_path(path, false)?;
        let size = img.size();
        Ok((Source::Qcow2(img), size))
    }

    fn read(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        match self {
            Source::Raw(f) => std::os::unix::fs::FileExt::read_exact_at(f, buf, at),
            Source::Qcow2(img) => img.read(buf, at),
        }
    }
}

/// An ext4 file system on the disk: where, and what `debugfs` found in it.
struct Fs {
    number: u32,
    size: u64,
    root_type: bool,
    uuid: String,
    /// Its copy in the scratch directory.
    copy: PathBuf,
    os_release: String,
    /// Kernel versions with an initrd, and the directory they are in.
    kernels: Vec<String>,
    boot_dir: &'static str,
}

/// Imports `opts.source` as image `opts.name` into `images`, saying each
/// step through `progress`; nothing is left of an import that fails.
pub fn import(
    images: &Path,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageRecord> {
    staged(
        images,
        &opts.name,
        "import",
        || Ok(()),
        |work| import_in(work, opts, progress),
    )
}

fn import_in(
    work: &Path,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ImageRecord> {
    let out = work.join("out");
    let src_path = &opts.source;
    let (src, size) = Source::open(src_path)?;
    let broken = |reason: String| Error::Broken {
        dir: src_path.display().to_string(),
        reason,
    };
    progress(&format!(
        "[1/4] reading the partition table of {} ({} MiB)",
        src_path.display(),
        size >> 20
    ));
    let parts =
        partitions(&mut |b, at| src.read(b, at), size).map_err(|e| broken(e.to_string()))?;
    let areas: Vec<(u32, u64, u64, bool)> = if parts.is_empty() {
        vec![(0, 0, size, false)]
    } else {
        parts
            .iter()
            .map(|p| {
                let root =
                    p.kind == Kind::Gpt(Kind::LINUX_ROOT_X86_64) || p.kind == Kind::Mbr(0x83);
                (p.number, p.start, p.size, root)
            })
            .collect()
    };
    let mut found = Vec::new();
    for (number, start, len, root_type) in areas {
        let mut sb = [0u8; 2048];
        if len < sb.len() as u64 || src.read(&mut sb, start).is_err() {
            continue;
        }
        let Some(uuid) = ext4_uuid(&sb) else { continue };
        let where_ = if number == 0 {
            "the whole disk".to_string()
        } else {
            format!("partition {number}")
        };
        progress(&format!(
            "[2/4] reading the ext4 file system on {where_} ({} MiB)",
            len >> 20
        ));
        let copy = work.join(format!("fs{number}.raw"));
        copy_out(&src, start, len, &copy)?;
        let os_release = ["/usr/lib/os-release", "/etc/os-release"]
            .iter()
            .map(|f| debugfs(&copy, &format!("cat {f}")).unwrap_or_default())
            .find(|t| t.contains("ID="))
            .unwrap_or_default();
        let (boot_dir, names) = if os_release.is_empty() {
            ("/", ls(&copy, "/"))
        } else {
            ("/boot", ls(&copy, "/boot"))
        };
        found.push(Fs {
            number,
            size: len,
            root_type,
            uuid,
            copy,
            os_release,
            kernels: kernels(&names),
            boot_dir,
        });
    }
    // The root: a file system with an os-release, of the root type if
    // several are; the kernel: the root's /boot, else a boot partition's.
    let root = found
        .iter()
        .filter(|f| !f.os_release.is_empty())
        .max_by_key(|f| (f.root_type, f.size))
        .ok_or_else(|| {
            broken(format!(
                "no Linux root file system found: {} ext4 file system(s), none with an \
                 os-release (Domus imports images whose root is ext4)",
                found.len()
            ))
        })?;
    let boot = std::iter::once(root)
        .chain(found.iter().filter(|f| f.os_release.is_empty()))
        .find(|f| !f.kernels.is_empty())
        .ok_or_else(|| {
            broken(
                "no kernel with an initrd (vmlinuz-VERSION and initrd.img-VERSION) in the root's \
                 /boot or on a boot partition"
                    .into(),
            )
        })?;
    let version = boot.kernels.last().cloned().unwrap_or_default();
    progress(&format!(
        "[3/4] taking out kernel {version} and its initrd (from {}{})",
        if boot.number == 0 {
            "the disk".to_string()
        } else {
            format!("partition {}, ", boot.number)
        },
        boot.boot_dir
    ));
    let dir = boot.boot_dir.trim_end_matches('/');
    for (from, to) in [("vmlinuz", "vmlinuz"), ("initrd.img", "initrd.img")] {
        let file = format!("{dir}/{from}-{version}");
        dump(&boot.copy, &file, &out.join(to))?;
    }
    progress(&format!(
        "[4/4] copying the disk into a standalone qcow2 ({} MiB)",
        size >> 20
    ));
    let disk = out.join("disk.qcow2");
    match &src {
        Source::Raw(_) => to_qcow2(src_path, &disk, size)?,
        Source::Qcow2(img) => qcow2_to_qcow2(img, &disk, size)?,
    }
    let field = |key: &str| {
        root.os_release.lines().find_map(|l| {
            let v = l.strip_prefix(key)?.strip_prefix('=')?;
            Some(v.trim_matches('"').to_string())
        })
    };
    let meta = fs::metadata(src_path).map_err(|e| Error::io(src_path.display(), e))?;
    let stamp = format!(
        "import\n{}\n{}\n{:?}",
        src_path.display(),
        meta.len(),
        meta.modified().ok()
    );
    let d = ring::digest::digest(&ring::digest::SHA256, stamp.as_bytes());
    let rec = ImageRecord {
        name: opts.name.clone(),
        suite: field("VERSION_CODENAME")
            .or_else(|| field("ID"))
            .unwrap_or_else(|| "unknown".into()),
        packages: Vec::new(),
        size_bytes: size,
        disk: "disk.qcow2".into(),
        kernel: "vmlinuz".into(),
        initrd: "initrd.img".into(),
        kernel_version: version,
        built: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        inputs: d.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect(),
        root: Some(format!("UUID={}", root.uuid)),
        source: Some(src_path.canonicalize().unwrap_or_else(|_| src_path.clone())),
    };
    let text = serde_json::to_string_pretty(&rec).map_err(|e| Error::io(RECORD, e.into()))?;
    write(&out.join(RECORD), &text)?;
    Ok(rec)
}

/// The UUID of the ext2/3/4 file system whose first 2 KiB are `sb`.
fn ext4_uuid(sb: &[u8; 2048]) -> Option<String> {
    let s = &sb[1024..];
    if s[56..58] != [0x53, 0xef] {
        return None;
    }
    let u = &s[104..120];
    let hex: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    ))
}

/// Copies `len` bytes at `start` of `src` into a new sparse file `to`,
/// writing only blocks that are not zero.
fn copy_out(src: &Source, start: u64, len: u64, to: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = fs::File::create(to).map_err(|e| Error::io(to.display(), e))?;
    f.set_len(len).map_err(|e| Error::io(to.display(), e))?;
    crate::copy_nonzero(
        len,
        |buf, at| {
            src.read(buf, start + at)
                .map_err(|e| Error::io(format!("reading the disk at byte {}", start + at), e))
        },
        |block, at| {
            f.write_all_at(block, at)
                .map_err(|e| Error::io(to.display(), e))
        },
    )
}

/// Copies qcow2 disk `img` (compressed or not) into a new qcow2 `disk`.
fn qcow2_to_qcow2(img: &Qcow2Image, disk: &Path, size: u64) -> Result<()> {
    create(disk, &CreateOptions::size(size))?;
    let new = Qcow2Image::open_path(disk, true)?;
    let io = |e| Error::io(disk.display(), e);
    crate::copy_nonzero(
        size,
        |buf, at| img.read(buf, at).map_err(io),
        |block, at| new.write(block, at).map_err(io),
    )?;
    new.flush().map_err(io)
}

/// Runs `debugfs -R REQUEST` on file system image `fs`: its output.
fn debugfs(fs: &Path, request: &str) -> Result<String> {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(request)
        .arg(fs)
        .output()
        .map_err(|e| Error::Tool {
            tool: "debugfs".into(),
            reason: if e.kind() == std::io::ErrorKind::NotFound {
                "not installed (Debian's e2fsprogs; tools/setup installs it)".into()
            } else {
                e.to_string()
            },
        })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The names in directory `dir` of file system image `fs` (none if it is
/// not there).
fn ls(fs: &Path, dir: &str) -> Vec<String> {
    // `ls -p`: one `/inode/mode/uid/gid/name/size/` line per entry.
    debugfs(fs, &format!("ls -p {dir}"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split('/').nth(5).map(str::to_owned))
        .filter(|n| !n.is_empty())
        .collect()
}

/// The kernel versions in `names` that have both `vmlinuz-V` and
/// `initrd.img-V`, oldest first. Only versions of plain characters: a name
/// is the image's word, and goes into a debugfs request.
fn kernels(names: &[String]) -> Vec<String> {
    let plain = |v: &&str| {
        !v.is_empty()
            && v.len() <= 128
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+~-".contains(&b))
    };
    let mut v: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_prefix("vmlinuz-"))
        .filter(plain)
        .filter(|v| names.iter().any(|n| *n == format!("initrd.img-{v}")))
        .map(str::to_owned)
        .collect();
    v.sort_by_key(|a| version_key(a));
    v
}

/// A version's numbers in order, then the whole: 6.1.0-27 sorts after
/// 6.1.0-9, as a plain string would not.
fn version_key(v: &str) -> (Vec<u64>, String) {
    let nums = v
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(u64::MAX))
        .collect();
    (nums, v.to_string())
}

/// Copies `file` out of file system image `fs` into `to`, through
/// `debugfs -R 'dump FILE OUT'`, run beside `to` so that its path has no
/// spaces for debugfs to split.
fn dump(fs: &Path, file: &str, to: &Path) -> Result<()> {
    let (Some(dir), Some(name)) = (to.parent(), to.file_name()) else {
        return Err(Error::io(
            to.display(),
            std::io::ErrorKind::InvalidInput.into(),
        ));
    };
    let out = Command::new("debugfs")
        .current_dir(dir)
        .arg("-R")
        .arg(format!("dump {file} {}", name.to_string_lossy()))
        .arg(fs)
        .output()
        .map_err(|e| Error::io("debugfs", e))?;
    // debugfs exits 0 whatever a request did: the file says.
    if fs::metadata(to).map_or(0, |m| m.len()) == 0 {
        return Err(Error::Tool {
            tool: "debugfs".into(),
            reason: format!(
                "could not copy {file} out: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod names {
    #[test]
    fn kernels_pair_with_initrds_sort_by_version_and_odd_names_are_left_out() {
        let names: Vec<String> = [
            "vmlinuz-6.1.0-9-amd64",
            "initrd.img-6.1.0-9-amd64",
            "vmlinuz-6.1.0-27-amd64",
            "initrd.img-6.1.0-27-amd64",
            "vmlinuz-7.0",
            "vmlinuz-6.2 /tmp/x",
            "initrd.img-6.2 /tmp/x",
            "config-6.1.0-27-amd64",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(super::kernels(&names), ["6.1.0-9-amd64", "6.1.0-27-amd64"]);
    }
}
