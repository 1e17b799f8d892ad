//! The live-migration stream: what a source VMM sends a destination VMM
//! over one byte stream (a socket the daemons relay), and the one answer
//! that comes back. `docs/migration.md` describes it.
//!
//! Every message is a frame: a 16-byte header (kind, a u32; zero, a u32;
//! the payload's length, a u64; all little-endian), then the payload.
//!
//! | kind | payload |
//! | --- | --- |
//! | `Hello` (1) | JSON [`Hello`]: the format, its version, the memory layout |
//! | `Pages` (2) | a guest address (u64), then whole 4 KiB pages to write from there |
//! | `Zeroes` (3) | a guest address and a page count (u64 each): those pages are zero now |
//! | `Round` (4) | JSON [`Round`]: one pre-copy round's numbers, for progress |
//! | `State` (5) | a snapshot state file (`domus_api::snapshot`), memory inline |
//! | `Abort` (6) | why, in UTF-8: the sender gives up; nothing runs on its account |
//! | `Running` (7) | (destination to source, after `State`) the guest runs here now |
//!
//! The stream is hostile input for the destination (its peer could be
//! anyone a daemon let through): frames are bounded ([`MAX_PAYLOAD`]),
//! pages must lie inside one RAM region of the announced layout, and the
//! state goes through every check a snapshot restore makes.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// The stream's name in [`Hello`].
pub const FORMAT: &str = "domus-migration";
/// The newest version this release speaks.
pub const VERSION: u32 = 1;
/// A guest page.
pub const PAGE: usize = 4096;
/// The largest payload accepted: a Pages frame of 16 MiB (plus its
/// address) or a state file.
pub const MAX_PAYLOAD: u64 = 64 << 20;
/// Pages sent per Pages frame at most.
pub const PAGES_PER_FRAME: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("the migration stream: {0}")]
    Io(#[from] io::Error),
    #[error("the migration stream is not one Domus speaks: {0}")]
    Malformed(String),
    #[error("the other side gave up: {0}")]
    Aborted(String),
}

/// The first frame: what is coming.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub format: String,
    pub version: u32,
    /// The guest's RAM regions as (guest address, bytes).
    pub regions: Vec<(u64, u64)>,
}

/// One pre-copy round, as the source measured it (the daemons relay it
/// as the migration's progress).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Round {
    pub round: u32,
    /// Pages sent in this round (zero pages included).
    pub pages: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Pages the guest dirtied while this round was sent: the next
    /// round's work.
    pub dirty_pages: u64,
    /// How long the guest would stop if the copy stopped now: the dirty
    /// pages at this round's bandwidth.
    pub expected_downtime_ms: f64,
}

/// A frame read from the stream.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Hello(Hello),
    /// Pages at a guest address: `data` is a whole number of pages.
    Pages {
        gpa: u64,
        data: Vec<u8>,
    },
    Zeroes {
        gpa: u64,
        pages: u64,
    },
    Round(Round),
    State(Vec<u8>),
    Abort(String),
    Running,
}

pub const HELLO: u32 = 1;
pub const PAGES: u32 = 2;
pub const ZEROES: u32 = 3;
pub const ROUND: u32 = 4;
pub const STATE: u32 = 5;
pub const ABORT: u32 = 6;
pub const RUNNING: u32 = 7;

fn header(kind: u32, len: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&kind.to_le_bytes());
    h[8..].copy_from_slice(&len.to_le_bytes());
    h
}

fn json<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(v).map_err(io::Error::other)
}

/// Writes a frame of `kind` made of `parts`.
fn write_frame(w: &mut impl Write, kind: u32, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    w.write_all(&header(kind, len as u64))?;
    for p in parts {
        w.write_all(p)?;
    }
    Ok(())
}

pub fn write_hello(w: &mut impl Write, regions: &[(u64, u64)]) -> io::Result<()> {
    let h = Hello {
        format: FORMAT.into(),
        version: VERSION,
        regions: regions.to_vec(),
    };
    write_frame(w, HELLO, &[&json(&h)?])
}

/// Pages at `gpa`: `data` holds whole pages, at most [`PAGES_PER_FRAME`].
pub fn write_pages(w: &mut impl Write, gpa: u64, data: &[u8]) -> io::Result<()> {
    debug_assert!(data.len().is_multiple_of(PAGE) && data.len() <= PAGES_PER_FRAME * PAGE);
    write_frame(w, PAGES, &[&gpa.to_le_bytes(), data])
}

pub fn write_zeroes(w: &mut impl Write, gpa: u64, pages: u64) -> io::Result<()> {
    write_frame(w, ZEROES, &[&gpa.to_le_bytes(), &pages.to_le_bytes()])
}

pub fn write_round(w: &mut impl Write, r: &Round) -> io::Result<()> {
    write_frame(w, ROUND, &[&json(r)?])
}

pub fn write_state(w: &mut impl Write, state: &[u8]) -> io::Result<()> {
    write_frame(w, STATE, &[state])
}

pub fn write_abort(w: &mut impl Write, why: &str) -> io::Result<()> {
    write_frame(w, ABORT, &[why.as_bytes()])
}

pub fn write_running(w: &mut impl Write) -> io::Result<()> {
    write_frame(w, RUNNING, &[])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Reads one frame's kind and payload, refusing a header that is
/// malformed or announces too large a payload (before anything is
/// allocated). The daemons relay frames read this way without looking
/// inside (but for progress).
pub fn read_raw(r: &mut impl Read) -> Result<(u32, Vec<u8>), StreamError> {
    let mut h = [0u8; 16];
    r.read_exact(&mut h)?;
    let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let len = u64_at(&h, 8);
    if h[4..8] != [0; 4] {
        return Err(StreamError::Malformed(
            "a frame header's reserved bytes are not zero".into(),
        ));
    }
    if len > MAX_PAYLOAD + 8 {
        return Err(StreamError::Malformed(format!(
            "a frame of {len} bytes (at most {MAX_PAYLOAD})"
        )));
    }
    let mut p = vec![0u8; len as usize];
    r.read_exact(&mut p)?;
    Ok((kind, p))
}

/// Writes a frame read by [`read_raw`] on.
pub fn write_raw(w: &mut impl Write, kind: u32, payload: &[u8]) -> io::Result<()> {
    write_frame(w, kind, &[payload])
}

/// Reads one frame, refusing any that is malformed or too large. An
/// `Abort` comes back as [`StreamError::Aborted`].
pub fn read_frame(r: &mut impl Read) -> Result<Frame, StreamError> {
    let (kind, p) = read_raw(r)?;
    parse(kind, p)
}

/// A frame from its kind and payload (see [`read_frame`]).
pub fn parse(kind: u32, mut p: Vec<u8>) -> Result<Frame, StreamError> {
    let bad = |m: String| Err(StreamError::Malformed(m));
    let parse = |what: &str| format!("a {what} frame that is not its JSON");
    Ok(match kind {
        HELLO => {
            let hello: Hello =
                serde_json::from_slice(&p).map_err(|_| StreamError::Malformed(parse("Hello")))?;
            if hello.format != FORMAT {
                return bad(format!("a stream of '{}'", hello.format));
            }
            if hello.version > VERSION {
                return bad(format!(
                    "version {} of the stream, newer than this release's {VERSION}",
                    hello.version
                ));
            }
            Frame::Hello(hello)
        }
        PAGES => {
            if p.len() < 8
                || !(p.len() - 8).is_multiple_of(PAGE)
                || p.len() - 8 > PAGES_PER_FRAME * PAGE
            {
                return bad(format!("a Pages frame of {} bytes", p.len()));
            }
            let gpa = u64_at(&p, 0);
            p.drain(..8);
            Frame::Pages { gpa, data: p }
        }
        ZEROES => {
            if p.len() != 16 {
                return bad(format!("a Zeroes frame of {} bytes", p.len()));
            }
            Frame::Zeroes {
                gpa: u64_at(&p, 0),
                pages: u64_at(&p, 8),
            }
        }
        ROUND => Frame::Round(
            serde_json::from_slice(&p).map_err(|_| StreamError::Malformed(parse("Round")))?,
        ),
        STATE => Frame::State(p),
        ABORT => {
            return Err(StreamError::Aborted(
                String::from_utf8_lossy(&p).into_owned(),
            ))
        }
        RUNNING if p.is_empty() => Frame::Running,
        other => return bad(format!("a frame of kind {other}")),
    })
}

/// Where pages of `bytes` at `gpa` go: the region of `regions` (guest
/// address, bytes) that holds them all, as (its index, the offset in it).
/// None if they do not lie inside one region (a hostile or broken
/// sender).
pub fn place(regions: &[(u64, u64)], gpa: u64, bytes: u64) -> Option<(usize, u64)> {
    if !gpa.is_multiple_of(PAGE as u64) {
        return None;
    }
    let end = gpa.checked_add(bytes)?;
    regions
        .iter()
        .position(|&(start, len)| gpa >= start && end <= start.saturating_add(len))
        .map(|i| (i, gpa - regions[i].0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(write: impl FnOnce(&mut Vec<u8>) -> io::Result<()>) -> Frame {
        let mut b = Vec::new();
        write(&mut b).unwrap();
        let mut r = &b[..];
        let f = read_frame(&mut r).unwrap();
        assert!(r.is_empty(), "the frame was read whole");
        f
    }

    #[test]
    fn every_frame_reads_back_as_written() {
        let regions = [(0, 1 << 20), (1 << 32, 2 << 20)];
        assert_eq!(
            round_trip(|w| write_hello(w, &regions)),
            Frame::Hello(Hello {
                format: FORMAT.into(),
                version: 1,
                regions: regions.to_vec()
            })
        );
        let data = vec![7u8; 2 * PAGE];
        assert_eq!(
            round_trip(|w| write_pages(w, 0x3000, &data)),
            Frame::Pages {
                gpa: 0x3000,
                data: data.clone()
            }
        );
        assert_eq!(
            round_trip(|w| write_zeroes(w, 0x5000, 9)),
            Frame::Zeroes {
                gpa: 0x5000,
                pages: 9
            }
        );
        let r = Round {
            round: 2,
            pages: 10,
            bytes: 40960,
            seconds: 0.5,
            dirty_pages: 3,
            expected_downtime_ms: 1.5,
        };
        assert_eq!(round_trip(|w| write_round(w, &r)), Frame::Round(r));
        assert_eq!(
            round_trip(|w| write_state(w, b"{}")),
            Frame::State(b"{}".to_vec())
        );
        assert_eq!(round_trip(write_running), Frame::Running);
        let mut b = Vec::new();
        write_abort(&mut b, "cancelled").unwrap();
        assert!(
            matches!(read_frame(&mut &b[..]), Err(StreamError::Aborted(m)) if m == "cancelled")
        );
    }

    #[test]
    fn malformed_frames_are_refused() {
        let frame = |kind: u32, payload: &[u8]| {
            let mut b = header(kind, payload.len() as u64).to_vec();
            b.extend_from_slice(payload);
            b
        };
        let refused =
            |b: Vec<u8>| matches!(read_frame(&mut &b[..]), Err(StreamError::Malformed(_)));
        // Too large, announced before anything is allocated.
        assert!(refused(header(PAGES, u64::MAX).to_vec()));
        // Pages: not whole, no address, too many.
        assert!(refused(frame(PAGES, &[0; 8 + 100])));
        assert!(refused(frame(PAGES, &[0; 4])));
        assert!(refused(frame(
            PAGES,
            &vec![0; 8 + (PAGES_PER_FRAME + 1) * PAGE]
        )));
        assert!(refused(frame(ZEROES, &[0; 15])));
        assert!(refused(frame(RUNNING, &[1])));
        assert!(refused(frame(99, &[])));
        // Another format, a newer version, unknown fields.
        assert!(refused(frame(
            HELLO,
            br#"{"format":"x","version":1,"regions":[]}"#
        )));
        assert!(refused(frame(
            HELLO,
            br#"{"format":"domus-migration","version":2,"regions":[]}"#
        )));
        assert!(refused(frame(
            HELLO,
            br#"{"format":"domus-migration","version":1,"regions":[],"x":1}"#
        )));
        let mut reserved = header(RUNNING, 0);
        reserved[5] = 1;
        assert!(refused(reserved.to_vec()));
        // Cut short: an I/O error, not a frame.
        let cut = &frame(STATE, b"abc")[..17];
        assert!(matches!(read_frame(&mut &cut[..]), Err(StreamError::Io(_))));
    }

    #[test]
    fn pages_are_placed_only_inside_one_region() {
        let regions = [(0, 0x10_0000), (0x1_0000_0000, 0x20_0000)];
        assert_eq!(place(&regions, 0x1000, 0x2000), Some((0, 0x1000)));
        assert_eq!(place(&regions, 0x1_0000_1000, 0x1000), Some((1, 0x1000)));
        // Across the end of a region, unaligned, past the address space.
        assert_eq!(place(&regions, 0xf_f000, 0x2000), None);
        assert_eq!(place(&regions, 0x800, 0x1000), None);
        assert_eq!(place(&regions, u64::MAX - 0xfff, 0x2000), None);
        assert_eq!(place(&regions, 0x8000_0000, 0x1000), None);
    }
}
