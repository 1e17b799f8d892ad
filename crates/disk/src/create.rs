//! Making qcow2 images: empty ones and copy-on-write overlays on a base.

use std::path::{Path, PathBuf};

use imago::qcow2::Qcow2;
use imago::{DenyImplicitOpenGate, FormatCreateBuilder, FormatDriverBuilder};

use crate::{Error, Format};

type Storage = imago::file::File;

/// What [`create`] makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateOptions {
    /// The disk's size in bytes, as the guest sees it.
    pub size: u64,
    /// The base the image reads through to where it has no data of its own,
    /// recorded in the header with its format (an absolute path is recorded
    /// as given; a relative one is taken from the new image's directory).
    pub backing: Option<(PathBuf, Format)>,
    /// Bytes per cluster, a power of two from 512 to 2 MiB (default
    /// 64 KiB, as qemu-img's).
    pub cluster_size: Option<usize>,
}

impl CreateOptions {
    /// An empty image of `size` bytes.
    pub fn size(size: u64) -> Self {
        CreateOptions {
            size,
            backing: None,
            cluster_size: None,
        }
    }

    /// An overlay of `size` bytes on `base`.
    pub fn overlay(base: &Path, format: Format, size: u64) -> Self {
        CreateOptions {
            size,
            backing: Some((base.to_path_buf(), format)),
            cluster_size: None,
        }
    }
}

/// Makes a new qcow2 image at `path` (which must not exist).
pub fn create(path: &Path, opts: &CreateOptions) -> Result<(), Error> {
    let io = |e| Error::io(path, e);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io)?;
    let storage = Storage::from_open_file(
        file,
        imago::StorageOpenOptions::new().write(true).filename(path),
    )
    .map_err(io)?;
    let mut b = Qcow2::<Storage>::create_builder(storage).size(opts.size);
    if let Some(c) = opts.cluster_size {
        b = b.cluster_size(c);
    }
    if let Some((base, format)) = &opts.backing {
        let name = base.to_str().ok_or_else(|| Error::Refused {
            path: base.display().to_string(),
            reason: "a backing file's path must be UTF-8".into(),
        })?;
        b = b.backing(name.to_string(), format.name().to_string());
    }
    let made = b
        .create_open(DenyImplicitOpenGate::default(), |image| {
            Ok(Qcow2::<Storage>::builder(image).backing(None).write(true))
        })
        .map_err(|e| {
            let _ = std::fs::remove_file(path);
            io(e)
        })?;
    let access = imago::FormatAccess::new(made);
    access.flush().map_err(io)?;
    access.sync().map_err(io)?;
    Ok(())
}
