//! `domus-image`: bootable Debian images from Debian's own packages, the
//! directories that hold them, and the cloud-init seed disks that configure
//! a domain booted from one.
//!
//! An image is a directory `NAME/` in an image directory: `disk.qcow2` (for
//! a built image an ext4 root file system on the whole disk, no partition
//! table; for an imported one whatever the user's disk holds), the
//! `vmlinuz` and `initrd.img` of the kernel installed inside, and
//! `image.json` ([`domus_api::image::ImageRecord`]). Domains never write
//! it: each gets a qcow2 overlay on `disk.qcow2`. `domus image build`
//! makes one from Debian's packages ([`build`]); `domus image import`
//! takes a cloud image a user brings ([`import`]).

mod build;
mod import;
mod seed;
mod store;

pub use build::{build, BuildOptions, BASE_PACKAGES};
pub use import::{import, ImportOptions};
pub use seed::{make_seed, Seed};
pub use store::Store;

/// What went wrong; each says what to do where it can.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no image '{name}' in {dirs} (`domus image list` shows what there is; `domus image build {name}` makes it)")]
    NoSuchImage { name: String, dirs: String },
    #[error("an image '{0}' exists (remove it with `domus image rm {0}`, or pick another name)")]
    Exists(String),
    #[error(
        "image name '{0}': 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
    )]
    BadName(String),
    #[error("image '{name}' is the base of {users}: destroy those domains first")]
    InUse { name: String, users: String },
    #[error("image {dir}: {reason}")]
    Broken { dir: String, reason: String },
    #[error("{tool}: {reason}")]
    Tool { tool: String, reason: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Disk(#[from] domus_disk::Error),
}

impl Error {
    fn io(what: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            what: what.to_string(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Whether `name` may name an image (it becomes a directory's name).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::BadName(name.into()))
    }
}

/// Makes image `name` in `images` through a scratch directory of its own
/// (`.TAG-NAME-PID`): refuses a name that is taken, runs `checks`, then
/// `make`, which writes the image's files into the scratch directory's
/// `out/` (made for it), and moves `out/` into place. Nothing is left of a
/// step that fails.
fn staged(
    images: &std::path::Path,
    name: &str,
    tag: &str,
    checks: impl FnOnce() -> Result<()>,
    make: impl FnOnce(&std::path::Path) -> Result<domus_api::image::ImageRecord>,
) -> Result<domus_api::image::ImageRecord> {
    use std::fs;
    check_name(name)?;
    let dest = images.join(name);
    if dest.exists() {
        return Err(Error::Exists(name.into()));
    }
    checks()?;
    fs::create_dir_all(images).map_err(|e| Error::io(images.display(), e))?;
    let work = images.join(format!(".{tag}-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir(&work).map_err(|e| Error::io(work.display(), e))?;
    let out = work.join("out");
    let r = fs::create_dir(&out)
        .map_err(|e| Error::io(out.display(), e))
        .and_then(|()| make(&work))
        .and_then(|rec| {
            fs::rename(&out, &dest).map_err(|e| Error::io(dest.display(), e))?;
            Ok(rec)
        });
    let _ = fs::remove_dir_all(&work);
    r
}

/// Copies `len` bytes a MiB at a time: `read(buf, at)` fills `buf` from
/// byte `at` of the source, and `write(block, at)` is called for each
/// 64 KiB block that is not all zeroes (so a mostly empty disk writes
/// little and its copy stays sparse).
fn copy_nonzero(
    len: u64,
    mut read: impl FnMut(&mut [u8], u64) -> Result<()>,
    mut write: impl FnMut(&[u8], u64) -> Result<()>,
) -> Result<()> {
    const BLOCK: usize = 64 << 10;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < len {
        let n = (len - at).min(buf.len() as u64) as usize;
        read(&mut buf[..n], at)?;
        for (i, block) in buf[..n].chunks(BLOCK).enumerate() {
            if block.iter().any(|b| *b != 0) {
                write(block, at + (i * BLOCK) as u64)?;
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// Runs `cmd`, its output to `log` (or discarded); an error names the tool
/// and ends with the log's last lines.
fn run(cmd: &mut std::process::Command, log: Option<&std::path::Path>) -> Result<()> {
    let tool = cmd.get_program().to_string_lossy().into_owned();
    let (out, err) = match log {
        Some(p) => {
            let f = std::fs::File::create(p).map_err(|e| Error::io(p.display(), e))?;
            let g = f.try_clone().map_err(|e| Error::io(p.display(), e))?;
            (std::process::Stdio::from(f), std::process::Stdio::from(g))
        }
        None => (std::process::Stdio::null(), std::process::Stdio::piped()),
    };
    let child = cmd
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| Error::Tool {
            tool: tool.clone(),
            reason: if e.kind() == std::io::ErrorKind::NotFound {
                "not installed (tools/setup installs what `domus image` needs)".into()
            } else {
                e.to_string()
            },
        })?;
    let done = child.wait_with_output().map_err(|e| Error::io(&tool, e))?;
    if done.status.success() {
        return Ok(());
    }
    let tail = match log {
        Some(p) => std::fs::read_to_string(p).unwrap_or_default(),
        None => String::from_utf8_lossy(&done.stderr).into_owned(),
    };
    let tail: Vec<&str> = tail.lines().rev().take(15).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(Error::Tool {
        tool,
        reason: format!("{}\n{}", done.status, tail.join("\n")),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_names_are_plain_file_names() {
        for good in ["deb12", "web.v2", "a_b-c", "x"] {
            super::check_name(good).unwrap();
        }
        for bad in ["", ".hidden", "-x", "a/b", "..", "a b", &"x".repeat(65)] {
            assert!(super::check_name(bad).is_err(), "{bad}");
        }
    }
}
