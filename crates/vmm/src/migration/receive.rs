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
    let (s, _) = listener.accept().map_err(sock)?;
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
    let zero = vec![0u8; 64 * PAGE];
    loop {
        match stream::read_frame(&mut r)? {
            Frame::Pages { gpa, data } => {
                stream::place(&regions, gpa, data.len() as u64)
                    .ok_or_else(|| outside(gpa, data.len() as u64))?;
                mem.write_slice(&data, GuestAddress(gpa))
                    .map_err(|e| ReceiveError::Refused(e.to_string()))?;
                received += data.len() as u64;
            }
            Frame::Zeroes { gpa, pages } => {
                let len = pages
                    .checked_mul(PAGE as u64)
                    .ok_or_else(|| outside(gpa, u64::MAX))?;
                stream::place(&regions, gpa, len).ok_or_else(|| outside(gpa, len))?;
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(zero.len() as u64);
                    mem.write_slice(&zero[..n as usize], GuestAddress(gpa + at))
                        .map_err(|e| ReceiveError::Refused(e.to_string()))?;
                    at += n;
                }
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

fn outside(gpa: u64, len: u64) -> ReceiveError {
    ReceiveError::Refused(format!(
        "pages at {gpa:#x} ({len} bytes) outside guest memory"
    ))
}
