//! Parsing virtio-blk requests out of a descriptor chain. Everything here
//! is guest-controlled: every address, length, direction and sector is
//! checked before the I/O code sees it, and a request that cannot be
//! answered (no writable status byte in guest memory) is reported as such
//! so the device completes it with a zero length instead.
//!
//! Layout accepted: a 16-byte device-readable header in the first
//! descriptor, data descriptors, and the status byte as the last byte of
//! the last descriptor, which must be device-writable (what Linux sends).

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

pub const SECTOR_SIZE: u64 = 512;
pub const HEADER_SIZE: u32 = 16;
/// Bytes of a GET_ID answer.
pub const ID_BYTES: usize = 20;
/// Discard and write-zeroes segments per request (what we advertise).
pub const MAX_SEGMENTS: u32 = 16;
const SEGMENT_SIZE: u64 = 16;

use virtio_bindings::virtio_blk as vb;

pub const T_IN: u32 = vb::VIRTIO_BLK_T_IN;
pub const T_OUT: u32 = vb::VIRTIO_BLK_T_OUT;
pub const T_FLUSH: u32 = vb::VIRTIO_BLK_T_FLUSH;
pub const T_GET_ID: u32 = vb::VIRTIO_BLK_T_GET_ID;
pub const T_DISCARD: u32 = vb::VIRTIO_BLK_T_DISCARD;
pub const T_WRITE_ZEROES: u32 = vb::VIRTIO_BLK_T_WRITE_ZEROES;

pub const S_OK: u8 = vb::VIRTIO_BLK_S_OK as u8;
pub const S_IOERR: u8 = vb::VIRTIO_BLK_S_IOERR as u8;
pub const S_UNSUPP: u8 = vb::VIRTIO_BLK_S_UNSUPP as u8;

/// Write-zeroes flag: the device may deallocate.
pub const WZ_UNMAP: u32 = 1;

/// One descriptor, as far as a request is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    /// Device-writable.
    pub write: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    In,
    Out,
    Flush,
    GetId,
    Discard,
    WriteZeroes,
}

/// A discard or write-zeroes range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub sector: u64,
    pub sectors: u32,
    pub flags: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    pub sector: u64,
    /// Data buffers, each inside one guest memory region.
    pub data: Vec<Desc>,
    pub data_len: u64,
    pub segments: Vec<Segment>,
    pub status: GuestAddress,
}

impl Request {
    /// Bytes the device writes into the chain on success (data + status).
    pub fn used_len(&self) -> u32 {
        match self.kind {
            Kind::In => (self.data_len + 1) as u32,
            Kind::GetId => (self.data_len.min(ID_BYTES as u64) + 1) as u32,
            _ => 1,
        }
    }

    /// Bytes moved, for rate limiting and counters.
    pub fn bytes(&self) -> u64 {
        match self.kind {
            Kind::In | Kind::Out => self.data_len,
            _ => 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the chain has no device-writable status byte in guest memory")]
    NoStatus,
    #[error("the chain has no readable 16-byte header")]
    BadHeader,
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("a buffer has the wrong direction for the request")]
    WrongDirection,
    #[error("a buffer is outside guest memory or spans a hole")]
    BadAddress,
    #[error("the data length is not a whole number of sectors")]
    Unaligned,
    #[error("the request reaches past the end of the disk")]
    OutOfRange,
    #[error("malformed discard or write-zeroes segments")]
    BadSegments,
}

impl Error {
    /// The status the guest gets (if it can get one).
    pub fn status(&self) -> u8 {
        match self {
            Error::Unsupported(_) => S_UNSUPP,
            _ => S_IOERR,
        }
    }
}

/// A request that failed to parse, with where to put the error status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub status: Option<GuestAddress>,
    pub error: Error,
}

fn in_memory<M: GuestMemoryBackend>(mem: &M, d: &Desc) -> bool {
    d.len == 0 || mem.get_slice(GuestAddress(d.addr), d.len as usize).is_ok()
}

/// Parses a chain for a disk of `capacity` sectors.
pub fn parse<M: GuestMemoryBackend>(
    mem: &M,
    descs: &[Desc],
    capacity: u64,
) -> Result<Request, Rejected> {
    let status = descs
        .last()
        .filter(|d| d.write && d.len > 0)
        .and_then(|d| d.addr.checked_add(u64::from(d.len) - 1))
        .map(GuestAddress)
        .filter(|a| mem.get_slice(*a, 1).is_ok())
        .ok_or(Rejected {
            status: None,
            error: Error::NoStatus,
        })?;
    let reject = |error| Rejected {
        status: Some(status),
        error,
    };
    if descs.len() < 2 {
        return Err(reject(Error::BadHeader));
    }
    let h = descs[0];
    if h.write || h.len < HEADER_SIZE {
        return Err(reject(Error::BadHeader));
    }
    let mut hdr = [0u8; 16];
    mem.read_slice(&mut hdr, GuestAddress(h.addr))
        .map_err(|_| reject(Error::BadHeader))?;
    let ty = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&hdr[8..]);
    let sector = u64::from_le_bytes(s);
    let kind = match ty {
        T_IN => Kind::In,
        T_OUT => Kind::Out,
        T_FLUSH => Kind::Flush,
        T_GET_ID => Kind::GetId,
        T_DISCARD => Kind::Discard,
        T_WRITE_ZEROES => Kind::WriteZeroes,
        other => return Err(reject(Error::Unsupported(other))),
    };
    let data: Vec<Desc> = descs[1..descs.len() - 1]
        .iter()
        .copied()
        .filter(|d| d.len > 0)
        .collect();
    let want_write = matches!(kind, Kind::In | Kind::GetId);
    if kind != Kind::Flush && data.iter().any(|d| d.write != want_write) {
        return Err(reject(Error::WrongDirection));
    }
    if data.iter().any(|d| !in_memory(mem, d)) {
        return Err(reject(Error::BadAddress));
    }
    let data_len: u64 = data.iter().map(|d| u64::from(d.len)).sum();
    let mut segments = Vec::new();
    match kind {
        Kind::In | Kind::Out => {
            if !data_len.is_multiple_of(SECTOR_SIZE) {
                return Err(reject(Error::Unaligned));
            }
            let end = sector.checked_add(data_len / SECTOR_SIZE);
            if end.is_none_or(|e| e > capacity) {
                return Err(reject(Error::OutOfRange));
            }
        }
        Kind::GetId if data.is_empty() => return Err(reject(Error::WrongDirection)),
        Kind::Discard | Kind::WriteZeroes => {
            if data_len == 0
                || !data_len.is_multiple_of(SEGMENT_SIZE)
                || data_len / SEGMENT_SIZE > u64::from(MAX_SEGMENTS)
            {
                return Err(reject(Error::BadSegments));
            }
            let mut bytes = Vec::with_capacity(data_len as usize);
            for d in &data {
                let mut b = vec![0u8; d.len as usize];
                mem.read_slice(&mut b, GuestAddress(d.addr))
                    .map_err(|_| reject(Error::BadAddress))?;
                bytes.extend(b);
            }
            for c in bytes.chunks_exact(SEGMENT_SIZE as usize) {
                let mut s8 = [0u8; 8];
                s8.copy_from_slice(&c[..8]);
                let seg = Segment {
                    sector: u64::from_le_bytes(s8),
                    sectors: u32::from_le_bytes([c[8], c[9], c[10], c[11]]),
                    flags: u32::from_le_bytes([c[12], c[13], c[14], c[15]]),
                };
                let allowed = if kind == Kind::WriteZeroes {
                    WZ_UNMAP
                } else {
                    0
                };
                if seg.flags & !allowed != 0 {
                    return Err(reject(Error::Unsupported(ty)));
                }
                let end = seg.sector.checked_add(u64::from(seg.sectors));
                if end.is_none_or(|e| e > capacity) {
                    return Err(reject(Error::OutOfRange));
                }
                segments.push(seg);
            }
        }
        Kind::Flush | Kind::GetId => {}
    }
    Ok(Request {
        kind,
        sector,
        data,
        data_len,
        segments,
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Memory;

    const MEM: u64 = 0x10_0000;

    fn mem() -> Memory {
        Memory::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
    }

    fn header(m: &Memory, at: u64, ty: u32, sector: u64) -> Desc {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&ty.to_le_bytes());
        h[8..].copy_from_slice(&sector.to_le_bytes());
        m.write_slice(&h, GuestAddress(at)).unwrap();
        Desc {
            addr: at,
            len: 16,
            write: false,
        }
    }

    fn d(addr: u64, len: u32, write: bool) -> Desc {
        Desc { addr, len, write }
    }

    const STATUS: Desc = Desc {
        addr: 0x9000,
        len: 1,
        write: true,
    };

    #[test]
    fn read_request() {
        let m = mem();
        let h = header(&m, 0, T_IN, 8);
        let r = parse(&m, &[h, d(0x1000, 4096, true), STATUS], 16).unwrap();
        assert_eq!(r.kind, Kind::In);
        assert_eq!((r.sector, r.data_len, r.used_len()), (8, 4096, 4097));
        assert_eq!(r.status, GuestAddress(0x9000));
    }

    #[test]
    fn no_status_cannot_be_answered() {
        let m = mem();
        let h = header(&m, 0, T_IN, 0);
        for chain in [
            vec![],
            vec![h],
            vec![h, d(0x1000, 512, true), d(0x9000, 1, false)],
            vec![h, d(0x9000, 0, true)],
            vec![h, d(MEM, 1, true)],
            vec![h, d(u64::MAX, 2, true)],
        ] {
            assert_eq!(parse(&m, &chain, 16).unwrap_err().status, None, "{chain:?}");
        }
    }

    #[test]
    fn hostile_requests_get_an_error_status() {
        let m = mem();
        let rd = header(&m, 0, T_IN, 0);
        let wr = header(&m, 0x100, T_OUT, 0);
        let cases: Vec<(Vec<Desc>, Error)> = vec![
            // A lone status descriptor: no header.
            (vec![STATUS], Error::BadHeader),
            // Header too short or device-writable.
            (vec![d(0, 8, false), STATUS], Error::BadHeader),
            (vec![d(0, 16, true), STATUS], Error::BadHeader),
            // Header outside memory.
            (vec![d(MEM - 8, 16, false), STATUS], Error::BadHeader),
            // A read into a device-readable buffer, a write from a writable one.
            (
                vec![rd, d(0x1000, 512, false), STATUS],
                Error::WrongDirection,
            ),
            (
                vec![wr, d(0x1000, 512, true), STATUS],
                Error::WrongDirection,
            ),
            // Buffers outside memory, wrapping, or huge.
            (vec![rd, d(MEM - 256, 512, true), STATUS], Error::BadAddress),
            (
                vec![rd, d(u64::MAX - 100, 512, true), STATUS],
                Error::BadAddress,
            ),
            (vec![rd, d(0, u32::MAX, true), STATUS], Error::BadAddress),
            // Partial sectors, past the end, sector overflow.
            (vec![rd, d(0x1000, 100, true), STATUS], Error::Unaligned),
            (
                vec![rd, d(0x1000, 16 * 512 + 512, true), STATUS],
                Error::OutOfRange,
            ),
            (
                vec![
                    header(&m, 0x200, T_IN, u64::MAX),
                    d(0x1000, 512, true),
                    STATUS,
                ],
                Error::OutOfRange,
            ),
            (
                vec![header(&m, 0x300, 0x77, 0), STATUS],
                Error::Unsupported(0x77),
            ),
            (
                vec![header(&m, 0x400, T_GET_ID, 0), STATUS],
                Error::WrongDirection,
            ),
        ];
        for (chain, want) in cases {
            let e = parse(&m, &chain, 16).unwrap_err();
            assert_eq!(e.error, want, "{chain:?}");
            assert_eq!(e.status, Some(GuestAddress(0x9000)));
        }
    }

    #[test]
    fn discard_segments() {
        let m = mem();
        let h = header(&m, 0, T_DISCARD, 0);
        let mut seg = [0u8; 16];
        seg[..8].copy_from_slice(&4u64.to_le_bytes());
        seg[8..12].copy_from_slice(&8u32.to_le_bytes());
        m.write_slice(&seg, GuestAddress(0x2000)).unwrap();
        let r = parse(&m, &[h, d(0x2000, 16, false), STATUS], 16).unwrap();
        assert_eq!(
            r.segments,
            vec![Segment {
                sector: 4,
                sectors: 8,
                flags: 0
            }]
        );
        // Past the end, odd sizes, unknown flags, too many segments.
        seg[8..12].copy_from_slice(&13u32.to_le_bytes());
        m.write_slice(&seg, GuestAddress(0x2000)).unwrap();
        let e = parse(&m, &[h, d(0x2000, 16, false), STATUS], 16).unwrap_err();
        assert_eq!(e.error, Error::OutOfRange);
        let e = parse(&m, &[h, d(0x2000, 15, false), STATUS], 16).unwrap_err();
        assert_eq!(e.error, Error::BadSegments);
        let e = parse(&m, &[h, d(0x2000, 17 * 16, false), STATUS], 1 << 20).unwrap_err();
        assert_eq!(e.error, Error::BadSegments);
        seg[8..12].copy_from_slice(&1u32.to_le_bytes());
        seg[12..].copy_from_slice(&1u32.to_le_bytes());
        m.write_slice(&seg, GuestAddress(0x2000)).unwrap();
        let e = parse(&m, &[h, d(0x2000, 16, false), STATUS], 16).unwrap_err();
        assert_eq!(e.error, Error::Unsupported(T_DISCARD));
        let wz = header(&m, 0x40, T_WRITE_ZEROES, 0);
        let r = parse(&m, &[wz, d(0x2000, 16, false), STATUS], 16).unwrap();
        assert_eq!(r.segments[0].flags, WZ_UNMAP);
    }

    #[test]
    fn flush_and_get_id() {
        let m = mem();
        let f = header(&m, 0, T_FLUSH, 0);
        assert_eq!(parse(&m, &[f, STATUS], 16).unwrap().kind, Kind::Flush);
        let g = header(&m, 0x20, T_GET_ID, 0);
        let r = parse(&m, &[g, d(0x1000, 64, true), STATUS], 16).unwrap();
        assert_eq!(r.used_len(), 21);
    }
}
