//! The destination side of a live migration (`domus run --incoming
//! SOCKET`): one connection on a Unix socket, the guest's memory as it
//! comes, then its state, which goes through every check a snapshot
//! restore makes. The stream is hostile input: frames are bounded, pages
//! must lie inside one region of a layout this domain may have, and the
//! memory is never larger than the domain's own.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use domus_api::migration::{self as stream, Frame, PAGE};
use vm_memory::{Bytes, GuestAddress};

use crate::snapshot::Body;
use domus_virtio::Memory;

/// The longest the stream may fall silent (between two frames) before the
/// destination gives up.
const IDLE: Duration = Duration::from_secs(60);
/// The longest the destination waits for the source to connect.
const CONNECT_WAIT: Duration = Duration::from_secs(600);

/// The first connection on `l` within `wait`.
fn accept_within(l: &UnixListener, wait: Duration) -> std::io::Result<UnixStream> {
    let until = Instant::now() + wait;
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no source connected within {} s", wait.as_secs()),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("the migration socket {path}: {source}")]
    Socket {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Stream(#[from] stream::StreamError),
    #[error("the migration stream: {0}")]
    Refused(String),
    #[error("the migration's state: {0}")]
    State(#[from] domus_api::snapshot::SnapshotError),
    #[error("allocating guest memory: {0}")]
    Memory(String),
}

/// What came in: the guest's memory, its state, and the stream to answer
/// the source on once the guest runs.
pub struct Incoming {
    pub body: Body,
    pub mem: Memory,
    pub stream: UnixStream,
}

/// Waits on `listener` for the source, then takes the guest: its memory
/// (at most `max_bytes`) and its state.
pub fn receive(
    listener: &UnixListener,
    path: &Path,
    max_bytes: u64,
) -> Result<Incoming, ReceiveError> {
    let sock = |source| ReceiveError::Socket {
        path: path.display().to_string(),
        source,
    };
    let s = accept_within(listener, CONNECT_WAIT).map_err(sock)?;
    s.set_read_timeout(Some(IDLE)).map_err(sock)?;
    let mut r = std::io::BufReader::with_capacity(1 << 20, &s);
    let regions = match stream::read_frame(&mut r)? {
        Frame::Hello(h) => h.regions,
        _ => return Err(ReceiveError::Refused("it does not start with Hello".into())),
    };
    let total = regions
        .iter()
        .try_fold(0u64, |a, r| a.checked_add(r.1))
        .filter(|&t| t > 0 && t <= max_bytes && t.is_multiple_of(1 << 20))
        .ok_or_else(|| {
            ReceiveError::Refused(format!(
                "guest memory of {regions:x?}: not a layout of at most {} MiB",
                max_bytes >> 20
            ))
        })?;
    let expected = domus_boot::layout::ram_ranges(total);
    if regions != expected {
        return Err(ReceiveError::Refused(format!(
            "memory regions {regions:x?}, but a domain of {} MiB has {expected:x?}",
            total >> 20
        )));
    }
    let mem =
        crate::memory::allocate(&expected).map_err(|e| ReceiveError::Memory(e.to_string()))?;
    let t0 = Instant::now();
    let mut received = 0u64;
    loop {
        match stream::read_frame(&mut r)? {
            f @ (Frame::Pages { .. } | Frame::Zeroes { .. }) => {
                received += land(&mem, &regions, &f)?;
            }
            Frame::Round(round) => eprintln!(
                "domus: incoming: round {} ({} pages, {:.1} MiB in {:.2} s; {} dirty)",
                round.round,
                round.pages,
                round.bytes as f64 / f64::from(1 << 20),
                round.seconds,
                round.dirty_pages
            ),
            Frame::State(bytes) => {
                let body: Body =
                    domus_api::snapshot::decode(&bytes[..], Path::new("(the migration stream)"))?;
                if body.summary.memory.bytes != total {
                    return Err(ReceiveError::Refused(format!(
                        "a state for {} bytes of memory, {total} sent",
                        body.summary.memory.bytes
                    )));
                }
                eprintln!(
                    "domus: incoming: {:.1} MiB of memory in {:.2} s, and the state",
                    received as f64 / f64::from(1 << 20),
                    t0.elapsed().as_secs_f64()
                );
                drop(r);
                return Ok(Incoming {
                    body,
                    mem,
                    stream: s,
                });
            }
            Frame::Hello(_) | Frame::Running => {
                return Err(ReceiveError::Refused("a frame out of place".into()))
            }
            Frame::Abort(why) => return Err(stream::StreamError::Aborted(why).into()),
        }
    }
}

/// Writes a Pages or Zeroes frame into `mem` (laid out as `regions`);
/// returns the bytes it wrote.
fn land(mem: &Memory, regions: &[(u64, u64)], f: &Frame) -> Result<u64, ReceiveError> {
    static ZERO: [u8; 64 * PAGE] = [0; 64 * PAGE];
    let write = |data: &[u8], at: u64| {
        mem.write_slice(data, GuestAddress(at))
            .map_err(|e| ReceiveError::Refused(e.to_string()))
    };
    match f {
        Frame::Pages { gpa, data } => {
            let len = data.len() as u64;
            stream::place(regions, *gpa, len).ok_or_else(|| outside(*gpa, len))?;
            write(data, *gpa)?;
            Ok(len)
        }
        Frame::Zeroes { gpa, pages } => {
            let len = pages
                .checked_mul(PAGE as u64)
                .ok_or_else(|| outside(*gpa, u64::MAX))?;
            stream::place(regions, *gpa, len).ok_or_else(|| outside(*gpa, len))?;
            let mut at = 0;
            while at < len {
                let n = (len - at).min(ZERO.len() as u64);
                write(&ZERO[..n as usize], gpa + at)?;
                at += n;
            }
            Ok(len)
        }
        _ => Ok(0),
    }
}

fn outside(gpa: u64, len: u64) -> ReceiveError {
    ReceiveError::Refused(format!(
        "pages at {gpa:#x} ({len} bytes) outside guest memory"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Runs `receive` (at most `max` bytes of memory) on a stream whose
    /// frames `send` writes.
    fn receive_from(
        max: u64,
        send: impl FnOnce(&mut UnixStream) -> std::io::Result<()> + Send + 'static,
    ) -> Result<Incoming, ReceiveError> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("domus-recv-{}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let p = path.clone();
        let writer = std::thread::spawn(move || {
            let mut s = UnixStream::connect(&p).unwrap();
            let _ = send(&mut s).and_then(|()| s.flush());
        });
        let r = receive(&l, &path, max);
        writer.join().unwrap();
        let _ = std::fs::remove_file(&path);
        r
    }

    fn refused(r: Result<Incoming, ReceiveError>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn hostile_streams_are_refused() {
        // More memory than the domain may have; a layout no domain has.
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 32 * MIB)])
        }));
        assert!(e.contains("at most 16 MiB"), "{e}");
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0x1000, 8 * MIB)])
        }));
        assert!(e.contains("a domain of 8 MiB has"), "{e}");
        // Pages outside the announced memory, or across its end.
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 8 * MIB)])?;
            stream::write_pages(s, 8 * MIB, &[1; PAGE])
        }));
        assert!(e.contains("outside guest memory"), "{e}");
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 8 * MIB)])?;
            stream::write_zeroes(s, 4 * MIB, u64::MAX / 2)
        }));
        assert!(e.contains("outside guest memory"), "{e}");
        // Not starting with Hello; a second Hello; a state that is not one;
        // the source giving up; the stream cut short.
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_pages(s, 0, &[1; PAGE])
        }));
        assert!(e.contains("Hello"), "{e}");
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 8 * MIB)])?;
            stream::write_hello(s, &[(0, 8 * MIB)])
        }));
        assert!(e.contains("out of place"), "{e}");
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 8 * MIB)])?;
            stream::write_state(s, b"{\"format\":\"domus-snapshot\"}\n{}")
        }));
        assert!(e.contains("migration stream"), "{e}");
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 8 * MIB)])?;
            stream::write_abort(s, "cancelled")
        }));
        assert!(e.contains("cancelled"), "{e}");
        let e = refused(receive_from(16 * MIB, |s| {
            stream::write_hello(s, &[(0, 8 * MIB)])?;
            s.write_all(&[2, 0, 0, 0])
        }));
        assert!(e.contains("migration stream"), "{e}");
    }

    #[test]
    fn a_source_that_never_connects_is_given_up_on() {
        let path = std::env::temp_dir().join(format!("domus-recv-none-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let e = accept_within(&l, Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn pages_and_zeroes_land_where_they_were_sent() {
        let regions = [(0, 8 * MIB)];
        let mem = Memory::from_ranges(&[(GuestAddress(0), 8 * MIB as usize)]).unwrap();
        mem.write_slice(&[9; 3 * PAGE], GuestAddress(0x4000))
            .unwrap();
        let pages = Frame::Pages {
            gpa: 0x3000,
            data: vec![7; 2 * PAGE],
        };
        assert_eq!(land(&mem, &regions, &pages).unwrap(), 2 * PAGE as u64);
        let zeroes = Frame::Zeroes {
            gpa: 0x5000,
            pages: 1,
        };
        assert_eq!(land(&mem, &regions, &zeroes).unwrap(), PAGE as u64);
        let mut got = vec![0u8; 5 * PAGE];
        mem.read_slice(&mut got, GuestAddress(0x2000)).unwrap();
        assert_eq!(got[..PAGE], [0; PAGE], "untouched");
        assert_eq!(got[PAGE..3 * PAGE], [7; 2 * PAGE], "the pages sent");
        assert_eq!(got[3 * PAGE..4 * PAGE], [0; PAGE], "zeroed");
        let mut after = [0u8; PAGE];
        mem.read_slice(&mut after, GuestAddress(0x6000)).unwrap();
        assert_eq!(after, [9; PAGE], "beyond the zeroes");
        // Outside: nothing written.
        let far = Frame::Pages {
            gpa: 8 * MIB - PAGE as u64,
            data: vec![1; 2 * PAGE],
        };
        assert!(land(&mem, &regions, &far).is_err());
        let mut last = [0u8; PAGE];
        mem.read_slice(&mut last, GuestAddress(8 * MIB - PAGE as u64))
            .unwrap();
        assert_eq!(last, [0; PAGE]);
    }
}
