//! `PUT /v1/domain/snapshot`: where the files come from (a path the VMM
//! opens, or descriptors a jailed VMM is handed), and the answer.
//!
//! Given a path, the files are written under temporary names beside it
//! (`.NAME.part`, `.NAME.mem.part`) and renamed once both are complete, so
//! a failed or interrupted save never leaves a snapshot that looks whole.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use domus_api::snapshot::{memory_file_name, part_path, plain_file_name};
use domus_api::vmm::{SnapshotInfo, SnapshotRequest};
use domus_jail::fdpass::Inbox;

use super::{SnapshotError, Snapshotter, Target};

/// An answer's status and message.
pub type Refusal = (u16, String);

fn bad(m: impl Into<String>) -> Refusal {
    (400, m.into())
}

fn create(p: &Path) -> Result<File, Refusal> {
    File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| {
            (
                409,
                format!("{}: {}", p.display(), crate::config::io_reason(&e)),
            )
        })
}

/// Saves the domain as `r` asks.
pub fn handle(
    snap: &Snapshotter,
    inbox: Option<&Inbox>,
    r: SnapshotRequest,
) -> Result<SnapshotInfo, Refusal> {
    // Files named by path: (final, temporary) for the state and memory.
    let mut renames: Vec<(PathBuf, PathBuf)> = Vec::new();
    let target = match (&r.path, r.state_fd, r.memory_fd, &r.memory_name) {
        (Some(path), None, None, None) => {
            if !path.is_absolute() || path.file_name().is_none() {
                return Err(bad(format!(
                    "path {}: give an absolute path to a file",
                    path.display()
                )));
            }
            let name = memory_file_name(path);
            let mem = path.with_file_name(&name);
            renames.push((path.clone(), part_path(path)));
            renames.push((mem.clone(), part_path(&mem)));
            let state = create(&renames[0].1)?;
            let memory = create(&renames[1].1).inspect_err(|_| {
                let _ = std::fs::remove_file(&renames[0].1);
            })?;
            Target {
                state,
                memory,
                memory_name: name,
            }
        }
        (None, Some(s), Some(m), Some(name)) => {
            if !plain_file_name(name) {
                return Err(bad(format!("memory_name '{name}': give a plain file name")));
            }
            let take = |tag: u64, what: &str| {
                crate::hotplug::passed(inbox, tag, what)
                    .map(File::from)
                    .map_err(|e| bad(e.to_string()))
            };
            Target {
                state: take(s, "the snapshot's state file")?,
                memory: take(m, "the snapshot's memory file")?,
                memory_name: name.clone(),
            }
        }
        _ => {
            return Err(bad(
                "give either path, or state_fd, memory_fd and memory_name",
            ))
        }
    };
    let resume = r.resume;
    match snap.save(target, r.domain, resume) {
        Ok(s) => {
            for (done, tmp) in &renames {
                if let Err(e) = std::fs::rename(tmp, done) {
                    for (_, t) in &renames {
                        let _ = std::fs::remove_file(t);
                    }
                    return Err((500, format!("{}: {e}", done.display())));
                }
            }
            Ok(SnapshotInfo {
                memory_bytes: s.memory_bytes,
                pages_stored: s.pages_stored,
                state_bytes: s.state_bytes,
                paused_ms: s.paused.as_secs_f64() * 1000.0,
                paused: snap.pause.is_paused(),
            })
        }
        Err(e) => {
            for (_, tmp) in &renames {
                let _ = std::fs::remove_file(tmp);
            }
            let status = match e {
                SnapshotError::Busy => 409,
                _ => 500,
            };
            Err((status, e.to_string()))
        }
    }
}
