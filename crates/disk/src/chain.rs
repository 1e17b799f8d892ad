//! Opening a disk and its backing chain, link by link, under the rules in
//! the crate's documentation.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use imago::qcow2::Qcow2;
use imago::raw::Raw;
use imago::{FormatAccess, StorageOpenOptions};

use crate::header::Header;
use crate::{is_qcow2, Error, Format, Opener, MAX_CHAIN};

type Storage = imago::file::File;

/// One image of a chain.
#[derive(Debug)]
pub struct Link {
    pub path: PathBuf,
    pub format: Format,
    /// The same open file the image reads (a duplicate descriptor): what
    /// the caller locks.
    pub file: File,
    /// Whether it was opened for writing (only link 0 can be).
    pub write: bool,
}

/// An opened disk.
pub struct Chain {
    /// The disk first, then its backing files in order.
    pub links: Vec<Link>,
    /// The disk's size in bytes, as the guest sees it.
    pub size: u64,
    /// The image to read and write through; `None` for a raw disk, which
    /// the caller reads and writes as a plain file (`links[0].file`).
    pub image: Option<FormatAccess<Storage>>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chain")
            .field("links", &self.links)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Opens `path` as `format` (writable if asked) with its whole backing
/// chain; backing files are opened read-only.
pub fn open(
    path: &Path,
    format: Format,
    write: bool,
    opener: &mut dyn Opener,
) -> Result<Chain, Error> {
    let mut links = Vec::new();
    let image = open_link(path, format, write, opener, &mut links, true)?;
    let size = match &image {
        Some(i) => i.size(),
        None => links[0]
            .file
            .metadata()
            .map_err(|e| Error::io(path, e))?
            .len(),
    };
    Ok(Chain { links, size, image })
}

/// The files of a disk's chain, the disk first, read from their headers
/// alone (Domus's own parser: imago does not run), opened read-only and
/// checked as [`open`] checks them: what a supervisor checks against its
/// allow-list before it hands the disk to a VMM.
pub fn links(path: &Path, format: Format, opener: &mut dyn Opener) -> Result<Vec<Link>, Error> {
    let mut links = Vec::new();
    open_link(path, format, false, opener, &mut links, false)?;
    Ok(links)
}

/// The header of a qcow2 file, checked.
pub fn header(file: &File, path: &Path) -> Result<Header, Error> {
    if !is_qcow2(file).map_err(|e| Error::io(path, e))? {
        return Err(Error::NotQcow2 {
            path: path.display().to_string(),
        });
    }
    Header::read(file).map_err(|reason| Error::Corrupt {
        path: path.display().to_string(),
        reason,
    })
}

fn dup(file: &File, path: &Path) -> Result<File, Error> {
    file.try_clone().map_err(|e| Error::io(path, e))
}

/// Opens link `links.len()` and everything under it; with `imago`, the
/// image to read and write it through (`None` for a raw disk at the top,
/// served as a plain file, and always without `imago`).
fn open_link(
    path: &Path,
    format: Format,
    write: bool,
    opener: &mut dyn Opener,
    links: &mut Vec<Link>,
    imago: bool,
) -> Result<Option<FormatAccess<Storage>>, Error> {
    let shown = || path.display().to_string();
    let depth = links.len();
    if depth >= MAX_CHAIN {
        let top = links
            .first()
            .map_or_else(shown, |l| l.path.display().to_string());
        return Err(Error::TooDeep { path: top });
    }
    let file = opener.open(path, depth, write)?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    for l in links.iter() {
        let m = l.file.metadata().map_err(|e| Error::io(&l.path, e))?;
        if (m.dev(), m.ino()) == (meta.dev(), meta.ino()) {
            return Err(Error::Loop {
                path: links[0].path.display().to_string(),
                again: l.path.display().to_string(),
            });
        }
    }
    links.push(Link {
        path: path.to_path_buf(),
        format,
        file: dup(&file, path)?,
        write,
    });
    let corrupt = |reason: String| Error::Corrupt {
        path: shown(),
        reason,
    };
    let header = match format {
        Format::Raw => None,
        Format::Qcow2 => {
            let h = header(&file, path)?;
            if h.data_file {
                return Err(Error::DataFile { path: shown() });
            }
            if write {
                h.check_refcounts(&file).map_err(corrupt)?;
            }
            Some(h)
        }
    };
    // The backing file first: a bad chain is refused before imago runs.
    let backing = match header.as_ref().and_then(|h| h.backing_file.clone()) {
        None => None,
        Some(name) => {
            let h = header.as_ref().expect("a backing file comes from a header");
            let bformat = match h.backing_format.as_deref() {
                None => {
                    return Err(Error::NoBackingFormat {
                        path: shown(),
                        backing: name,
                    })
                }
                Some(f) => f.parse::<Format>().map_err(|_| Error::BackingFormat {
                    path: shown(),
                    format: f.to_string(),
                })?,
            };
            let bpath = backing_path(path, &name);
            open_link(&bpath, bformat, false, opener, links, imago)?
        }
    };
    if !imago {
        return Ok(None);
    }
    let opts = StorageOpenOptions::new().write(write).filename(path);
    let storage = Storage::from_open_file(file, opts).map_err(|e| Error::io(path, e))?;
    match format {
        Format::Raw if depth == 0 => Ok(None),
        Format::Raw => {
            let raw = Raw::open_image(storage, write).map_err(|e| Error::io(path, e))?;
            Ok(Some(FormatAccess::new(raw)))
        }
        Format::Qcow2 => {
            let mut q: Qcow2<Storage> =
                Qcow2::open_image(storage, write).map_err(|e| corrupt(e.to_string()))?;
            q.set_data_file(None);
            q.set_backing(backing);
            Ok(Some(FormatAccess::new(q)))
        }
    }
}

/// A backing file's name as its header gives it, made absolute against the
/// directory of the image that names it (as QEMU does).
fn backing_path(image: &Path, name: &str) -> PathBuf {
    let name = Path::new(name);
    if name.is_absolute() {
        return name.to_path_buf();
    }
    image.parent().unwrap_or(Path::new("/")).join(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{create, ByPath, CreateOptions};

    use crate::test_dir as dir;

    #[test]
    fn a_relative_backing_name_is_taken_from_the_naming_image_directory() {
        assert_eq!(
            backing_path(Path::new("/a/b/top.qcow2"), "base.img"),
            PathBuf::from("/a/b/base.img")
        );
        assert_eq!(
            backing_path(Path::new("/a/b/top.qcow2"), "/c/base.img"),
            PathBuf::from("/c/base.img")
        );
    }

    #[test]
    fn a_chain_that_loops_or_is_too_deep_is_refused() {
        let d = dir("loop");
        let a = d.join("a.qcow2");
        let b = d.join("b.qcow2");
        create(&a, &CreateOptions::size(1 << 20)).unwrap();
        create(&b, &CreateOptions::overlay(&a, Format::Qcow2, 1 << 20)).unwrap();
        // Rewrite a's header to name b: a -> b -> a.
        std::fs::remove_file(&a).unwrap();
        create(&a, &CreateOptions::overlay(&b, Format::Qcow2, 1 << 20)).unwrap();
        let e = open(&a, Format::Qcow2, false, &mut ByPath).unwrap_err();
        assert!(matches!(e, Error::Loop { .. }), "{e}");

        let mut prev = d.join("l0.img");
        std::fs::write(&prev, vec![0u8; 4096]).unwrap();
        let mut fmt = Format::Raw;
        for i in 1..=MAX_CHAIN {
            let p = d.join(format!("l{i}.qcow2"));
            create(&p, &CreateOptions::overlay(&prev, fmt, 4096)).unwrap();
            fmt = Format::Qcow2;
            prev = p;
        }
        // l15 has 16 links (l15..l0); l16 has 17.
        let below = d.join(format!("l{}.qcow2", MAX_CHAIN - 1));
        assert_eq!(
            open(&below, Format::Qcow2, false, &mut ByPath)
                .unwrap()
                .links
                .len(),
            MAX_CHAIN
        );
        let e = open(&prev, Format::Qcow2, false, &mut ByPath).unwrap_err();
        assert!(matches!(e, Error::TooDeep { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_raw_disk_is_never_read_as_qcow2_and_a_qcow2_disk_must_be_one() {
        let d = dir("probe");
        let q = d.join("q.qcow2");
        create(&q, &CreateOptions::size(1 << 20)).unwrap();
        // Asked for raw, a qcow2 file is a raw disk of its own bytes.
        let c = open(&q, Format::Raw, false, &mut ByPath).unwrap();
        assert!(c.image.is_none());
        assert_eq!(c.links.len(), 1);
        let r = d.join("r.img");
        std::fs::write(&r, vec![7u8; 8192]).unwrap();
        let e = open(&r, Format::Qcow2, false, &mut ByPath).unwrap_err();
        assert!(matches!(e, Error::NotQcow2 { .. }), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_corrupt_header_is_an_error_not_a_panic() {
        let d = dir("corrupt");
        let q = d.join("q.qcow2");
        create(&q, &CreateOptions::size(1 << 20)).unwrap();
        let good = std::fs::read(&q).unwrap();
        // Every single-byte change of the first 512 bytes: an error or a
        // usable image, never a panic.
        for at in 0..512 {
            for v in [0x00u8, 0xff, 0x80] {
                let mut b = good.clone();
                b[at] = v;
                std::fs::write(&q, &b).unwrap();
                if let Ok(c) = open(&q, Format::Qcow2, false, &mut ByPath) {
                    let img = c.image.unwrap();
                    let mut buf = vec![0u8; 4096];
                    let _ = img.read(&mut buf[..], 0);
                }
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
