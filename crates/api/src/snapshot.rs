//! The snapshot file (`domus save`, `domus run --restore`): its envelope,
//! the part every reader understands ([`Summary`]), and the checks made
//! before anything in it is trusted. `docs/snapshot-format.md` documents
//! the format and its compatibility promise.
//!
//! A snapshot is two files: the state (this module) and the guest's memory
//! (`Summary::memory`), which the state names relative to itself.
//!
//! The state file is one JSON header line, then the body:
//!
//! ```text
//! {"format":"domus-snapshot","version":1,"body_bytes":N,"body_crc32":C}\n
//! <N bytes of JSON: a SnapshotBody>
//! ```
//!
//! The header is read first, so that a newer format is refused by its
//! version before its body is parsed, and a truncated or corrupt body by
//! its length and CRC-32.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::domain::DomainConfig;
use crate::spec::VmSpec;

pub const FORMAT: &str = "domus-snapshot";
/// The version this release writes. It reads every version from 1 up to
/// this one.
pub const VERSION: u32 = 1;
/// The largest state file read (the memory is in its own file): far more
/// than 255 vCPUs and 31 devices need.
pub const MAX_BODY: u64 = 64 << 20;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    pub format: String,
    pub version: u32,
    pub body_bytes: u64,
    pub body_crc32: u32,
}

/// Where the guest's memory is: a file holding each RAM region at
/// `file_offset`, sparse (pages that were zero are holes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryImage {
    /// The file's name, in the state file's directory.
    pub file: String,
    /// Its length: the sum of the regions.
    pub bytes: u64,
    /// CRC-32 of the 4 KiB pages that are not all zeroes, in order; checked
    /// when memory is loaded eagerly, not when pages are mapped on first
    /// touch.
    pub crc32: u32,
    /// Pages (4 KiB) written; the rest were zero.
    pub pages_stored: u64,
    pub regions: Vec<MemoryRegion>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryRegion {
    pub guest_addr: u64,
    pub bytes: u64,
    pub file_offset: u64,
}

/// What every reader of a snapshot understands: who made it, the domain
/// it holds, and where its memory is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    /// The Domus release that wrote it.
    pub domus: String,
    /// Seconds since the epoch.
    pub created: u64,
    /// The domain as `domus run` was given it, with the devices it had
    /// when saved (host paths, taps); what only concerns the VMM process
    /// (API socket, jail, exit file) left out.
    pub spec: VmSpec,
    /// The daemon's record of the domain, when a daemon saved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<DomainConfig>,
    /// Whether the user had paused the domain (it restores paused).
    pub paused: bool,
    pub memory: MemoryImage,
}

/// The state file's body: the [`Summary`], then the machine state `M`,
/// which only the VMM reads (`domus_vmm::snapshot::Machine`); the daemon
/// reads it as `serde::de::IgnoredAny`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody<M> {
    pub summary: Summary,
    pub machine: M,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: {reason}")]
    Io { path: String, reason: String },
    #[error("snapshot {path}: not a Domus snapshot ({reason})")]
    NotSnapshot { path: String, reason: String },
    #[error("snapshot {path}: format version {version} is newer than this Domus reads (1 to {VERSION}); restore it with a newer Domus")]
    TooNew { path: String, version: u32 },
    #[error("snapshot {path}: truncated ({got} of {want} bytes of state)")]
    Truncated { path: String, got: u64, want: u64 },
    #[error("snapshot {path}: corrupt (checksum {got:#010x}, expected {want:#010x})")]
    Corrupt { path: String, got: u32, want: u32 },
    #[error("snapshot {path}: {reason}")]
    Body { path: String, reason: String },
}

/// Serialises a body into the state file's bytes (header line, body).
pub fn encode<M: Serialize>(body: &SnapshotBody<M>) -> Result<Vec<u8>, String> {
    let b = serde_json::to_vec(body).map_err(|e| e.to_string())?;
    let header = Header {
        format: FORMAT.into(),
        version: VERSION,
        body_bytes: b.len() as u64,
        body_crc32: crc32fast::hash(&b),
    };
    let mut out = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
    out.push(b'\n');
    out.extend_from_slice(&b);
    Ok(out)
}

/// Reads and checks a state file from `r` (`path` names it in errors):
/// header, version, length, checksum, then the body.
pub fn decode<M: DeserializeOwned>(
    r: impl Read,
    path: &Path,
) -> Result<SnapshotBody<M>, SnapshotError> {
    let p = || path.display().to_string();
    let mut r = std::io::BufReader::new(r);
    let mut line = Vec::new();
    (&mut r)
        .take(4096)
        .read_until(b'\n', &mut line)
        .map_err(|e| SnapshotError::Io {
            path: p(),
            reason: e.to_string(),
        })?;
    if line.last() != Some(&b'\n') {
        return Err(SnapshotError::NotSnapshot {
            path: p(),
            reason: "no header line".into(),
        });
    }
    // The version is looked at before the rest of the header, so a newer
    // header with other fields is still refused as newer.
    let loose: serde_json::Value =
        serde_json::from_slice(&line).map_err(|e| SnapshotError::NotSnapshot {
            path: p(),
            reason: e.to_string(),
        })?;
    if loose.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return Err(SnapshotError::NotSnapshot {
            path: p(),
            reason: "no \"format\": \"domus-snapshot\" in its header".into(),
        });
    }
    match loose.get("version").and_then(|v| v.as_u64()) {
        Some(v) if v > u64::from(VERSION) => {
            return Err(SnapshotError::TooNew {
                path: p(),
                version: u32::try_from(v).unwrap_or(u32::MAX),
            })
        }
        Some(v) if v >= 1 => {}
        _ => {
            return Err(SnapshotError::NotSnapshot {
                path: p(),
                reason: "no valid version in its header".into(),
            })
        }
    }
    let h: Header = serde_json::from_value(loose).map_err(|e| SnapshotError::NotSnapshot {
        path: p(),
        reason: e.to_string(),
    })?;
    if h.body_bytes > MAX_BODY {
        return Err(SnapshotError::NotSnapshot {
            path: p(),
            reason: format!("a state of {} bytes (at most {MAX_BODY})", h.body_bytes),
        });
    }
    let mut body = Vec::new();
    (&mut r)
        .take(h.body_bytes + 1)
        .read_to_end(&mut body)
        .map_err(|e| SnapshotError::Io {
            path: p(),
            reason: e.to_string(),
        })?;
    if (body.len() as u64) < h.body_bytes {
        return Err(SnapshotError::Truncated {
            path: p(),
            got: body.len() as u64,
            want: h.body_bytes,
        });
    }
    if body.len() as u64 > h.body_bytes {
        return Err(SnapshotError::NotSnapshot {
            path: p(),
            reason: "bytes after the state".into(),
        });
    }
    let crc = crc32fast::hash(&body);
    if crc != h.body_crc32 {
        return Err(SnapshotError::Corrupt {
            path: p(),
            got: crc,
            want: h.body_crc32,
        });
    }
    serde_json::from_slice(&body).map_err(|e| SnapshotError::Body {
        path: p(),
        reason: e.to_string(),
    })
}

/// Reads the state file at `path`.
pub fn read<M: DeserializeOwned>(path: &Path) -> Result<SnapshotBody<M>, SnapshotError> {
    let f = std::fs::File::open(path).map_err(|e| SnapshotError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    decode(f, path)
}

/// The memory file of the state file at `state`: `memory.file` in the same
/// directory. A name with a directory in it is refused (a snapshot must
/// not point a restore at another file of the host).
pub fn memory_path(state: &Path, memory: &MemoryImage) -> Result<PathBuf, String> {
    let name = Path::new(&memory.file);
    if !plain_file_name(&memory.file) {
        return Err(format!(
            "the memory file '{}' is not a plain file name",
            memory.file
        ));
    }
    Ok(state.parent().unwrap_or(Path::new(".")).join(name))
}

/// Whether `n` is a plain file name: one component, not `.` or `..`.
pub fn plain_file_name(n: &str) -> bool {
    let p = Path::new(n);
    p.components().count() == 1
        && matches!(p.components().next(), Some(std::path::Component::Normal(_)))
}

/// `.NAME.part` beside `p`: where a snapshot's file is written until it is
/// whole, then renamed to `p`.
pub fn part_path(p: &Path) -> PathBuf {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    p.with_file_name(format!(".{name}.part"))
}

/// The memory file's name for a state file called `state`: `NAME.mem`.
pub fn memory_file_name(state: &Path) -> String {
    let base = state
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    format!("{base}.mem")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> SnapshotBody<serde_json::Value> {
        SnapshotBody {
            summary: Summary {
                domus: "0.1.0".into(),
                created: 1,
                spec: crate::parse_body(br#"{"kernel": "/k"}"#).unwrap(),
                domain: None,
                paused: false,
                memory: MemoryImage {
                    file: "s.mem".into(),
                    bytes: 4096,
                    crc32: 0,
                    pages_stored: 0,
                    regions: vec![MemoryRegion {
                        guest_addr: 0,
                        bytes: 4096,
                        file_offset: 0,
                    }],
                },
            },
            machine: serde_json::json!({"x": 1}),
        }
    }

    fn decoded(b: &[u8]) -> Result<SnapshotBody<serde_json::Value>, SnapshotError> {
        decode(b, Path::new("s"))
    }

    #[test]
    fn a_snapshot_reads_back_and_every_damage_is_refused() {
        let good = encode(&body()).unwrap();
        assert_eq!(decoded(&good).unwrap().summary, body().summary);
        // Truncated anywhere in the body.
        for cut in [good.len() - 1, good.len() - 20] {
            assert!(
                matches!(decoded(&good[..cut]), Err(SnapshotError::Truncated { .. })),
                "{cut}"
            );
        }
        // One byte of the body changed.
        let mut bad = good.clone();
        let at = bad.len() - 5;
        bad[at] ^= 0x20;
        assert!(matches!(decoded(&bad), Err(SnapshotError::Corrupt { .. })));
        // Bytes after the body.
        let mut long = good.clone();
        long.push(b' ');
        assert!(matches!(
            decoded(&long),
            Err(SnapshotError::NotSnapshot { .. })
        ));
        // Not a snapshot at all, and an empty file.
        assert!(matches!(
            decoded(b"hello\n"),
            Err(SnapshotError::NotSnapshot { .. })
        ));
        assert!(matches!(
            decoded(b""),
            Err(SnapshotError::NotSnapshot { .. })
        ));
        // A newer version, even with a header this release does not know.
        let newer = String::from_utf8(good.clone()).unwrap().replacen(
            "\"version\":1",
            "\"version\":2,\"pages\":\"zstd\"",
            1,
        );
        assert!(matches!(
            decoded(newer.as_bytes()),
            Err(SnapshotError::TooNew { version: 2, .. })
        ));
        // A header claiming a huge body.
        let huge =
            String::from_utf8(good)
                .unwrap()
                .replacen("\"body_bytes\":", "\"body_bytes\":9", 1);
        assert!(decoded(huge.as_bytes()).is_err());
    }

    #[test]
    fn the_memory_file_must_sit_beside_the_state() {
        let mut m = body().summary.memory;
        let st = Path::new("/snaps/web.snap");
        assert_eq!(memory_path(st, &m).unwrap(), Path::new("/snaps/s.mem"));
        for bad in ["../etc/shadow", "/etc/shadow", "a/b", "..", ""] {
            m.file = bad.into();
            assert!(memory_path(st, &m).is_err(), "{bad}");
        }
        assert_eq!(memory_file_name(st), "web.snap.mem");
        assert_eq!(part_path(st), Path::new("/snaps/.web.snap.part"));
    }
}
