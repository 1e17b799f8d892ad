//! A domain's console through the API: its log, read piece by piece as
//! `tail -F` does (a restart keeps the last run's log as `console.log.1`
//! and starts a new one). When a domain goes away its log is kept a minute
//! as `ended/ID.console.log`, so a reader gets to its end (the last lines
//! of a guest that powers off at once are the ones most wanted).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use domus_api::daemon::ConsoleChunk;

use crate::{domain_dir, Daemon, Error, Result};

/// The most one answer carries.
const CHUNK: usize = 64 << 10;

/// How long an ended domain's console log is kept.
const KEEP_ENDED: Duration = Duration::from_secs(60);

impl Daemon {
    /// The piece of domain `dom`'s console log after byte `from` of the log
    /// `file` (an inode number; None: the current log from `from`).
    /// Types `text` at a running domain's serial console (the VMM takes
    /// what its guest reads within a second).
    pub fn console_input(&self, dom: &str, text: &str) -> Result<domus_api::vmm::ConsoleTaken> {
        let r = self.find(dom)?;
        self.vmm(&r)?
            .console_input(text)
            .map_err(crate::vmm_error(&r))
    }

    pub fn console(&self, dom: &str, file: Option<u64>, from: u64) -> Result<ConsoleChunk> {
        let r = match self.find(dom) {
            Ok(r) => r,
            // A domain that ended within the last minute, asked by id.
            Err(Error::NoSuchDomain(_)) => {
                let kept = dom.parse::<i64>().ok().map(|id| self.ended_console(id));
                return match kept.filter(|p| p.exists()) {
                    Some(p) => {
                        let mut c = read_chunk(&p, from)?;
                        c.ended = true;
                        Ok(c)
                    }
                    None => Err(Error::NoSuchDomain(dom.into())),
                };
            }
            Err(e) => return Err(e),
        };
        let dir = domain_dir(&self.state, r.id);
        let (now, last) = (dir.join("console.log"), dir.join("console.log.1"));
        let ino = |p: &Path| std::fs::metadata(p).ok().map(|m| m.ino());
        // The log the client read is the current one: go on in it. It is
        // the last run's: finish it first. Else: the current one, afresh.
        let (path, from) = match file {
            None => (now, from),
            // The VMM rotated the log in place: what the client was
            // reading is in the last log now, at the same offsets.
            Some(f) if ino(&now) == Some(f) && from > len(&now) && len(&last) > from => {
                (last, from)
            }
            Some(f) if ino(&now) == Some(f) => (now, from),
            Some(f) if ino(&last) == Some(f) && len(&last) > from => (last, from),
            Some(_) => (now, 0),
        };
        read_chunk(&path, from)
    }

    fn ended_console(&self, id: i64) -> PathBuf {
        self.state.join("ended").join(format!("{id}.console.log"))
    }

    /// Keeps the console log of domain `id`, which is going away, for
    /// [`KEEP_ENDED`] (the same file: a reader's offsets hold).
    pub(crate) fn keep_console(&self, id: i64) {
        let to = self.ended_console(id);
        let from = domain_dir(&self.state, id).join("console.log");
        if from.exists() && std::fs::create_dir_all(to.parent().unwrap_or(&self.state)).is_ok() {
            let _ = std::fs::rename(from, to);
        }
    }

    /// Removes the kept console logs that are older than [`KEEP_ENDED`].
    pub(crate) fn sweep_consoles(&self) {
        let Ok(dir) = std::fs::read_dir(self.state.join("ended")) else {
            return;
        };
        for e in dir.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() > KEEP_ENDED);
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

fn len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// Up to [`CHUNK`] bytes of `path` from `from`, cut at the end of the last
/// whole UTF-8 character (the rest comes with the next piece). A log not
/// made yet reads as empty.
fn read_chunk(path: &Path, from: u64) -> Result<ConsoleChunk> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ConsoleChunk {
                file: 0,
                from: 0,
                next: 0,
                data: String::new(),
                ended: false,
            })
        }
        Err(e) => return Err(e.into()),
    };
    let meta = f.metadata()?;
    // A log shorter than `from` is not the one the offset was in.
    let from = if from > meta.len() { 0 } else { from };
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::with_capacity(CHUNK);
    f.take(CHUNK as u64).read_to_end(&mut buf)?;
    let keep = match std::str::from_utf8(&buf) {
        Ok(_) => buf.len(),
        // An incomplete character at the end waits for its other bytes
        // (unless it is all there is to read).
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
        Err(_) => buf.len(),
    };
    buf.truncate(keep);
    Ok(ConsoleChunk {
        file: meta.ino(),
        from,
        next: from + keep as u64,
        data: String::from_utf8_lossy(&buf).into_owned(),
        ended: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_end_on_whole_characters_and_offsets_count_bytes() {
        let dir = std::env::temp_dir().join(format!("domus-console-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("console.log");
        // "é" is two bytes: the first alone is held back.
        std::fs::write(&p, b"ab\xc3").unwrap();
        let c = read_chunk(&p, 0).unwrap();
        assert_eq!((c.data.as_str(), c.next), ("ab", 2));
        std::fs::write(&p, b"ab\xc3\xa9\xff!").unwrap();
        let c = read_chunk(&p, 2).unwrap();
        assert_eq!((c.data.as_str(), c.from, c.next), ("\u{e9}\u{fffd}!", 2, 6));
        // An offset past the end (another log): from the start.
        let c = read_chunk(&p, 100).unwrap();
        assert_eq!((c.from, c.next), (0, 6));
        let big = vec![b'x'; CHUNK + 10];
        std::fs::write(&p, &big).unwrap();
        let c = read_chunk(&p, 0).unwrap();
        assert_eq!(c.next, CHUNK as u64);
        assert_eq!(read_chunk(&p, c.next).unwrap().data, "x".repeat(10));
        let none = read_chunk(&dir.join("nothing"), 5).unwrap();
        assert_eq!((none.next, none.data.as_str()), (0, ""));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_ended_domains_log_is_read_to_its_end_by_id() {
        let state = std::env::temp_dir().join(format!("domus-ended-{}", std::process::id()));
        let d = crate::fakes::on_this_host(&state);
        let dir = domain_dir(&state, 5);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("console.log"), "bye\n").unwrap();
        d.keep_console(5);
        let c = d.console("5", None, 0).unwrap();
        assert_eq!((c.data.as_str(), c.ended), ("bye\n", true));
        let c = d.console("5", Some(c.file), c.next).unwrap();
        assert_eq!((c.data.as_str(), c.ended), ("", true), "read to its end");
        assert!(matches!(
            d.console("6", None, 0),
            Err(Error::NoSuchDomain(_))
        ));
        assert!(matches!(
            d.console("ghost", None, 0),
            Err(Error::NoSuchDomain(_))
        ));
        d.sweep_consoles();
        assert!(d.ended_console(5).exists(), "kept for a minute");
        let _ = std::fs::remove_dir_all(state);
    }
}
