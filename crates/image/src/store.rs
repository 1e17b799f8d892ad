//! The image directories: finding an image by name, listing and removing
//! them.

use std::fs;
use std::path::{Path, PathBuf};

use domus_api::image::{ImageInfo, ImageRecord, RECORD};

use crate::build::files;
use crate::{check_name, Error, Result};

/// The directories images are looked up in, in order; builds go to the
/// first.
#[derive(Clone, Debug)]
pub struct Store {
    pub dirs: Vec<PathBuf>,
}

fn host_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).map_or(0, |m| m.blocks() * 512)
}

impl Store {
    pub fn new(dirs: Vec<PathBuf>) -> Self {
        Store { dirs }
    }

    fn shown(&self) -> String {
        let d: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
        if d.is_empty() {
            "no image directory".into()
        } else {
            d.join(", ")
        }
    }

    /// Image `name`'s record and files, checked to be there.
    pub fn find(&self, name: &str) -> Result<ImageInfo> {
        check_name(name)?;
        for d in &self.dirs {
            let dir = d.join(name);
            if dir.join(RECORD).is_file() {
                return read(&dir);
            }
        }
        Err(Error::NoSuchImage {
            name: name.into(),
            dirs: self.shown(),
        })
    }

    /// Every image, by name (the first of a name wins, as for `find`);
    /// broken ones are left out.
    pub fn list(&self) -> Vec<ImageInfo> {
        let mut out: Vec<ImageInfo> = Vec::new();
        for d in &self.dirs {
            let Ok(rd) = fs::read_dir(d) else { continue };
            for e in rd.flatten() {
                let dir = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if check_name(&name).is_err() || out.iter().any(|i| i.record.name == name) {
                    continue;
                }
                if let Ok(info) = read(&dir) {
                    out.push(info);
                }
            }
        }
        out.sort_by(|a, b| a.record.name.cmp(&b.record.name));
        out
    }

    /// Removes image `name`, unless a qcow2 overlay in `overlays` names its
    /// disk as its backing file.
    pub fn remove(&self, name: &str, overlays: &Path) -> Result<()> {
        let info = self.find(name)?;
        let users = users(&info, overlays);
        if !users.is_empty() {
            let u: Vec<String> = users.iter().map(|p| p.display().to_string()).collect();
            return Err(Error::InUse {
                name: name.into(),
                users: u.join(", "),
            });
        }
        fs::remove_dir_all(&info.dir).map_err(|e| Error::io(info.dir.display(), e))
    }
}

/// The overlays in `overlays` whose backing file is `info`'s disk.
pub fn users(info: &ImageInfo, overlays: &Path) -> Vec<PathBuf> {
    let disk = info.dir.join(&info.record.disk);
    let Ok(rd) = fs::read_dir(overlays) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.path())
        .filter(|p| {
            let Ok(f) = fs::File::open(p) else {
                return false;
            };
            domus_disk::header(&f, p)
                .ok()
                .and_then(|h| h.backing_file)
                .is_some_and(|b| Path::new(&b) == disk)
        })
        .collect()
}

/// The image in `dir`, its record checked against its files.
fn read(dir: &Path) -> Result<ImageInfo> {
    let broken = |reason: String| Error::Broken {
        dir: dir.display().to_string(),
        reason,
    };
    let text =
        fs::read_to_string(dir.join(RECORD)).map_err(|e| broken(format!("{RECORD}: {e}")))?;
    let record: ImageRecord =
        serde_json::from_str(&text).map_err(|e| broken(format!("{RECORD}: {e}")))?;
    let mut bytes = 0;
    for f in files(dir, &record) {
        // The record names files in its own directory, nothing else.
        if f.parent() != Some(dir) || !f.is_file() {
            return Err(broken(format!(
                "{} is missing or not in the image's directory",
                f.display()
            )));
        }
        bytes += host_bytes(&f);
    }
    Ok(ImageInfo {
        dir: dir.to_path_buf(),
        record,
        host_bytes: bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use domus_disk::{create, CreateOptions, Format};

    fn fake(images: &Path, name: &str) -> PathBuf {
        let dir = images.join(name);
        fs::create_dir_all(&dir).unwrap();
        create(&dir.join("disk.qcow2"), &CreateOptions::size(1 << 20)).unwrap();
        fs::write(dir.join("vmlinuz"), b"k").unwrap();
        fs::write(dir.join("initrd.img"), b"i").unwrap();
        let rec = ImageRecord {
            name: name.into(),
            suite: "bookworm".into(),
            packages: vec![],
            size_bytes: 1 << 20,
            disk: "disk.qcow2".into(),
            kernel: "vmlinuz".into(),
            initrd: "initrd.img".into(),
            kernel_version: "6.1".into(),
            built: 0,
            inputs: "x".into(),
            root: None,
            source: None,
        };
        fs::write(dir.join(RECORD), serde_json::to_string(&rec).unwrap()).unwrap();
        dir
    }

    #[test]
    fn images_are_found_listed_and_removed_unless_an_overlay_uses_them() {
        let d = std::env::temp_dir().join(format!("domus-image-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let (a, b, ov) = (d.join("a"), d.join("b"), d.join("overlays"));
        fs::create_dir_all(&ov).unwrap();
        let one = fake(&a, "one");
        fake(&b, "one"); // hidden behind a's
        fake(&b, "two");
        let s = Store::new(vec![a.clone(), b.clone()]);
        assert_eq!(s.find("one").unwrap().dir, one);
        let names: Vec<String> = s.list().into_iter().map(|i| i.record.name).collect();
        assert_eq!(names, ["one", "two"]);
        let e = s.find("three").unwrap_err();
        assert!(e.to_string().contains("domus image build three"), "{e}");
        assert!(matches!(s.find("../x"), Err(Error::BadName(_))));
        // A record naming a file outside its directory is broken.
        fs::write(
            b.join("two").join(RECORD),
            fs::read_to_string(b.join("two").join(RECORD))
                .unwrap()
                .replace("\"vmlinuz\"", "\"/etc/passwd\""),
        )
        .unwrap();
        assert!(matches!(s.find("two"), Err(Error::Broken { .. })));
        // In use by an overlay: refused, named.
        let o = ov.join("dom.qcow2");
        create(
            &o,
            &CreateOptions::overlay(&one.join("disk.qcow2"), Format::Qcow2, 1 << 20),
        )
        .unwrap();
        let e = s.remove("one", &ov).unwrap_err();
        assert!(e.to_string().contains("dom.qcow2"), "{e}");
        fs::remove_file(&o).unwrap();
        s.remove("one", &ov).unwrap();
        assert!(!one.exists());
        fs::remove_dir_all(&d).unwrap();
    }
}
