//! Opening a disk and its backing chain, link by link, under the rules in
//! the crate's documentation.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use imago::qcow2::Qcow2;
use imago::raw::Raw;
use imago::{FormatAccess, StorageOpenOptions};

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
    let image = open_link(path, format, write, opener, &mut links)?;
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

fn dup(file: &File, path: &Path) -> Result<File, Error> {
    file.try_clone().map_err(|e| Error::io(path, e))
}

/// Opens link `links.len()` and everything under it; `None` for a raw disk
/// at the top (served as a plain file).
fn open_link(
    path: &Path,
    format: Format,
    write: bool,
    opener: &mut dyn Opener,
    links: &mut Vec<Link>,
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
    let opts = StorageOpenOptions::new().write(write).filename(path);
    let storage = Storage::from_open_file(file, opts).map_err(|e| Error::io(path, e))?;
    match format {
        Format::Raw if depth == 0 => Ok(None),
        Format::Raw => {
            let raw = Raw::open_image(storage, write).map_err(|e| Error::io(path, e))?;
            Ok(Some(FormatAccess::new(raw)))
        }
        Format::Qcow2 => {
            if !is_qcow2(&links[depth].file).map_err(|e| Error::io(path, e))? {
                return Err(Error::NotQcow2 { path: shown() });
            }
            let corrupt = |e: std::io::Error| Error::Corrupt {
                path: shown(),
                reason: e.to_string(),
            };
            let mut q: Qcow2<Storage> = Qcow2::open_image(storage, write).map_err(corrupt)?;
            if q.requires_external_data_file() {
                return Err(Error::DataFile { path: shown() });
            }
            q.set_data_file(None);
            let backing = match q.implicit_backing_file() {
                None => None,
                Some(name) => {
                    let name = name.clone();
                    let bformat = match q.implicit_backing_format().map(String::as_str) {
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
                    let b = open_link(&bpath, bformat, false, opener, links)?;
                    Some(b.expect("a backing link is never the top"))
                }
            };
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
