//! `domus-disk`: disk image formats.
//!
//! A disk is a raw file or a qcow2 image (read and written through the
//! `imago` crate), whose backing chain Domus opens itself, link by link,
//! through an [`Opener`] the caller chooses: the VMM opens paths (or takes
//! the descriptors a jailed VMM was passed), the daemon opens them under its
//! allow-list of image directories. Nothing in an image's header is trusted:
//!
//! * the format of the disk itself is what the configuration says, never
//!   probed (a guest that writes a qcow2 header into a raw disk must not
//!   get the host to open the files it names);
//! * a backing file's format must be recorded in the header that names it;
//! * a chain is at most [`MAX_CHAIN`] links deep and never names a file it
//!   already holds (compared by device and inode);
//! * external data files are refused.
//!
//! Headers are read by Domus's own parser ([`Header`]) before imago sees a
//! file; [`links`] walks a chain on headers alone, so a supervisor checks a
//! chain without running imago in its process. [`Qcow2Image`] serves a
//! qcow2 disk to several I/O threads at once; [`create`] makes new images
//! and copy-on-write overlays.

mod chain;
mod create;
pub mod fuzz;
mod header;
mod image;
pub mod partitions;

use std::fs::File;
use std::io;
use std::path::Path;
use std::str::FromStr;

pub use chain::{header, links, open, Chain, Link};
pub use create::{create, CreateOptions};
pub use header::Header;
pub use image::Qcow2Image;

/// The deepest backing chain Domus opens, counting the disk itself.
pub const MAX_CHAIN: usize = 16;

/// The 4 bytes every qcow2 image starts with.
pub const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

/// A disk image's format, as configurations and the APIs name it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Raw,
    Qcow2,
}

impl Format {
    pub fn is_raw(&self) -> bool {
        *self == Format::Raw
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "raw" | "" => Ok(Format::Raw),
            "qcow2" => Ok(Format::Qcow2),
            f => Err(format!("format '{f}' is not supported (raw or qcow2)")),
        }
    }
}

/// What went wrong with a disk image; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}: is not a qcow2 image (it does not start with qcow2's magic); if it is raw, say format=raw")]
    NotQcow2 { path: String },
    #[error("{path}: a corrupt or unsupported qcow2 image: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("{path}: its backing chain is deeper than {MAX_CHAIN} images")]
    TooDeep { path: String },
    #[error("{path}: its backing chain loops (it names {again} again)")]
    Loop { path: String, again: String },
    #[error("{path}: names the backing file {backing} without its format; record it with `qemu-img rebase -u -F raw -b {backing} {path}` (or -F qcow2)")]
    NoBackingFormat { path: String, backing: String },
    #[error("{path}: its backing file's format '{format}' is not supported (raw or qcow2)")]
    BackingFormat { path: String, format: String },
    #[error("{path}: uses an external data file, which Domus does not open")]
    DataFile { path: String },
    #[error("{path}: {reason}")]
    Refused { path: String, reason: String },
}

impl Error {
    fn io(path: &Path, source: io::Error) -> Self {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Opens the files of a disk's chain: link 0 is the disk itself, link 1
/// its backing file, and so on. A backing file's path is as its header
/// says, made absolute against the directory of the image that names it.
pub trait Opener {
    fn open(&mut self, path: &Path, link: usize, write: bool) -> Result<File, Error>;
}

/// Opens every path as asked.
#[derive(Debug, Default)]
pub struct ByPath;

impl Opener for ByPath {
    fn open(&mut self, path: &Path, _link: usize, write: bool) -> Result<File, Error> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(|e| Error::io(path, e))
    }
}

/// Whether `file` starts with qcow2's magic (a short file does not).
pub fn is_qcow2(file: &File) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < magic.len() {
        match file.read_at(&mut magic[got..], got as u64) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(magic == QCOW2_MAGIC)
}

/// The largest `path` may grow to as a disk of `format` (what a writer's
/// file-size limit must allow): a raw file's size (0 for a block device);
/// a qcow2 image's virtual size with room for its metadata (tables of 8
/// bytes per 64 KiB cluster and refcounts, far under 1/256 of it) and
/// 64 MiB more. 0 for a file that cannot be read: opening it will say why.
pub fn grows_to(path: &Path, format: Format) -> u64 {
    match format {
        Format::Raw => std::fs::metadata(path)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map_or(0, |m| m.len()),
        Format::Qcow2 => std::fs::File::open(path)
            .ok()
            .and_then(|f| header(&f, path).ok())
            .map_or(0, |h| {
                h.size.saturating_add(h.size / 256).saturating_add(64 << 20)
            }),
    }
}

/// A fresh scratch directory for a unit test.
#[cfg(test)]
fn test_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("domus-disk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
