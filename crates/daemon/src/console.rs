//! A domain's console through the API: its log, read piece by piece as
//! `tail -F` does (a restart keeps the last run's log as `console.log.1`
//! and starts a new one).

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use domus_api::daemon::ConsoleChunk;

use crate::{domain_dir, Daemon, Result};

/// The most one answer carries.
const CHUNK: usize = 64 << 10;

impl Daemon {
    /// The piece of domain `dom`'s console log after byte `from` of the log
    /// `file` (an inode number; None: the current log from `from`).
    pub fn console(&self, dom: &str, file: Option<u64>, from: u64) -> Result<ConsoleChunk> {
        let r = self.find(dom)?;
        let dir = domain_dir(&self.state, r.id);
        let (now, last) = (dir.join("console.log"), dir.join("console.log.1"));
        let ino = |p: &Path| std::fs::metadata(p).ok().map(|m| m.ino());
        // The log the client read is the current one: go on in it. It is
        // the last run's: finish it first. Else: the current one, afresh.
        let (path, from) = match file {
            None => (now, from),
            Some(f) if ino(&now) == Some(f) => (now, from),
            Some(f) if ino(&last) == Some(f) && len(&last) > from => (last, from),
            Some(_) => (now, 0),
        };
        read_chunk(&path, from)
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
}
