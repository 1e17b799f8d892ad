//! Partition tables of the disk images users bring (`domus image import`):
//! GPT, or an MBR's four primary entries. Every field is hostile input:
//! counts, sizes and offsets are checked against the disk before anything
//! is read or allocated, and a table that does not hold together is an
//! error rather than a guess. Sectors are 512 bytes, as in every cloud
//! image.

use std::io;

/// The sector size the tables are read in.
pub const SECTOR: u64 = 512;
/// The most GPT entries read (the specification's minimum array is 128;
/// real tables never have more).
const MAX_GPT_ENTRIES: u32 = 256;

/// One partition, in bytes from the start of the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// 1-based, as Linux numbers them (`/dev/vda1`).
    pub number: u32,
    pub start: u64,
    pub size: u64,
    pub kind: Kind,
}

/// What the table says a partition holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A GPT partition type GUID, in its on-disk byte order.
    Gpt([u8; 16]),
    /// An MBR partition type byte.
    Mbr(u8),
}

impl Kind {
    /// GPT's "Linux root (x86-64)" type (4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709).
    pub const LINUX_ROOT_X86_64: [u8; 16] = [
        0xe3, 0xbc, 0x68, 0x4f, 0xcd, 0xe8, 0xb1, 0x4d, 0x96, 0xe7, 0xfb, 0xca, 0xf9, 0x84, 0xb7,
        0x09,
    ];
}

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("reading the partition table: {0}")]
    Io(#[from] io::Error),
    #[error("broken partition table: {0}")]
    Broken(String),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// The partitions of a disk of `disk_size` bytes that `read_at` reads
/// (fills the buffer from a byte offset); empty when the disk has no
/// partition table (a file system on the whole disk).
pub fn partitions(
    read_at: &mut dyn FnMut(&mut [u8], u64) -> io::Result<()>,
    disk_size: u64,
) -> Result<Vec<Partition>, PartitionError> {
    if disk_size < 2 * SECTOR {
        return Ok(Vec::new());
    }
    let mut mbr = [0u8; SECTOR as usize];
    read_at(&mut mbr, 0)?;
    if mbr[510..512] != [0x55, 0xaa] {
        return Ok(Vec::new());
    }
    let entries: Vec<(u8, u64, u64)> = (0..4)
        .map(|i| {
            let e = &mbr[446 + 16 * i..446 + 16 * (i + 1)];
            (e[4], u64::from(u32_at(e, 8)), u64::from(u32_at(e, 12)))
        })
        .collect();
    if entries.iter().any(|(kind, _, _)| *kind == 0xee) {
        return gpt(read_at, disk_size);
    }
    let mut out = Vec::new();
    for (i, &(kind, lba, count)) in entries.iter().enumerate() {
        // Empty entries, and extended partitions (their logical ones are
        // not looked into).
        if kind == 0 || count == 0 || [0x05, 0x0f, 0x85].contains(&kind) {
            continue;
        }
        out.push(checked(
            i as u32 + 1,
            lba,
            lba + count - 1,
            disk_size,
            Kind::Mbr(kind),
        )?);
    }
    Ok(out)
}

/// A partition of sectors `first..=last`, refused if it is not on the disk.
fn checked(
    number: u32,
    first: u64,
    last: u64,
    disk_size: u64,
    kind: Kind,
) -> Result<Partition, PartitionError> {
    let end = last
        .checked_add(1)
        .and_then(|s| s.checked_mul(SECTOR))
        .filter(|&e| first >= 1 && first <= last && e <= disk_size);
    match end {
        Some(end) => Ok(Partition {
            number,
            start: first * SECTOR,
            size: end - first * SECTOR,
            kind,
        }),
        None => Err(PartitionError::Broken(format!(
            "partition {number} (sectors {first} to {last}) is not on the disk of {disk_size} bytes"
        ))),
    }
}

fn gpt(
    read_at: &mut dyn FnMut(&mut [u8], u64) -> io::Result<()>,
    disk_size: u64,
) -> Result<Vec<Partition>, PartitionError> {
    let broken = |m: String| PartitionError::Broken(format!("GPT: {m}"));
    let mut h = [0u8; SECTOR as usize];
    read_at(&mut h, SECTOR)?;
    if &h[0..8] != b"EFI PART" {
        return Err(broken(
            "the MBR says GPT, and sector 1 has no GPT header".into(),
        ));
    }
    let entries_lba = u64_at(&h, 72);
    let count = u32_at(&h, 80);
    let entry_size = u32_at(&h, 84);
    if !(128..=4096).contains(&entry_size) || !entry_size.is_multiple_of(8) {
        return Err(broken(format!("entries of {entry_size} bytes")));
    }
    if count > MAX_GPT_ENTRIES {
        return Err(broken(format!(
            "{count} entries (at most {MAX_GPT_ENTRIES} are read)"
        )));
    }
    let len = u64::from(count) * u64::from(entry_size);
    let fits = entries_lba
        .checked_mul(SECTOR)
        .and_then(|at| at.checked_add(len))
        .is_some_and(|end| entries_lba >= 2 && end <= disk_size);
    if !fits {
        return Err(broken(format!(
            "an entry array at sector {entries_lba} of {len} bytes is not on the disk"
        )));
    }
    let mut table = vec![0u8; len as usize];
    read_at(&mut table, entries_lba * SECTOR)?;
    let mut out = Vec::new();
    for (i, e) in table.chunks_exact(entry_size as usize).enumerate() {
        let mut kind = [0u8; 16];
        kind.copy_from_slice(&e[0..16]);
        if kind == [0u8; 16] {
            continue;
        }
        out.push(checked(
            i as u32 + 1,
            u64_at(e, 32),
            u64_at(e, 40),
            disk_size,
            Kind::Gpt(kind),
        )?);
    }
    Ok(out)
}

/// Writes a GPT of `parts` (first and last sector, type GUID) on `disk`,
/// for tests and the fuzzer's seed: a protective MBR, the header and its
/// entries with their CRCs (no backup copy). `disk` must hold 34 sectors.
pub fn write_gpt(disk: &mut [u8], parts: &[(u64, u64, [u8; 16])]) {
    fn crc32(data: &[u8]) -> u32 {
        let mut c = !0u32;
        for b in data {
            c ^= u32::from(*b);
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0xedb8_8320
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    let sectors = disk.len() as u64 / SECTOR;
    disk[446 + 4] = 0xee;
    disk[446 + 8..446 + 12].copy_from_slice(&1u32.to_le_bytes());
    disk[446 + 12..446 + 16].copy_from_slice(&((sectors - 1) as u32).to_le_bytes());
    disk[510] = 0x55;
    disk[511] = 0xaa;
    let mut entries = vec![0u8; 128 * 128];
    for (i, (first, last, kind)) in parts.iter().enumerate() {
        let e = &mut entries[i * 128..(i + 1) * 128];
        e[0..16].copy_from_slice(kind);
        e[16] = i as u8 + 1;
        e[32..40].copy_from_slice(&first.to_le_bytes());
        e[40..48].copy_from_slice(&last.to_le_bytes());
    }
    disk[1024..1024 + entries.len()].copy_from_slice(&entries);
    let h = &mut disk[512..1024];
    h[0..8].copy_from_slice(b"EFI PART");
    h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
    h[12..16].copy_from_slice(&92u32.to_le_bytes());
    h[24..32].copy_from_slice(&1u64.to_le_bytes());
    h[40..48].copy_from_slice(&34u64.to_le_bytes());
    h[48..56].copy_from_slice(&(sectors - 34).to_le_bytes());
    h[72..80].copy_from_slice(&2u64.to_le_bytes());
    h[80..84].copy_from_slice(&128u32.to_le_bytes());
    h[84..88].copy_from_slice(&128u32.to_le_bytes());
    h[88..92].copy_from_slice(&crc32(&entries).to_le_bytes());
    let c = crc32(&h[0..92]);
    h[16..20].copy_from_slice(&c.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(disk: &[u8]) -> impl FnMut(&mut [u8], u64) -> io::Result<()> + '_ {
        move |buf, at| {
            let at = at as usize;
            buf.copy_from_slice(&disk[at..at + buf.len()]);
            Ok(())
        }
    }

    #[test]
    fn a_gpt_disk_s_partitions_are_found_in_bytes() {
        let mut disk = vec![0u8; 4 << 20];
        let boot = [7u8; 16];
        write_gpt(
            &mut disk,
            &[(2048, 4095, Kind::LINUX_ROOT_X86_64), (4096, 8000, boot)],
        );
        let p = partitions(&mut reader(&disk), disk.len() as u64).unwrap();
        assert_eq!(
            p,
            vec![
                Partition {
                    number: 1,
                    start: 1 << 20,
                    size: 1 << 20,
                    kind: Kind::Gpt(Kind::LINUX_ROOT_X86_64)
                },
                Partition {
                    number: 2,
                    start: 2 << 20,
                    size: (8001 - 4096) * 512,
                    kind: Kind::Gpt(boot)
                },
            ]
        );
    }

    #[test]
    fn an_mbr_s_primary_partitions_and_no_table_at_all() {
        let mut disk = vec![0u8; 1 << 20];
        assert!(partitions(&mut reader(&disk), disk.len() as u64)
            .unwrap()
            .is_empty());
        disk[510] = 0x55;
        disk[511] = 0xaa;
        let e = &mut disk[446 + 16..446 + 32]; // entry 2
        e[4] = 0x83;
        e[8..12].copy_from_slice(&64u32.to_le_bytes());
        e[12..16].copy_from_slice(&100u32.to_le_bytes());
        let p = partitions(&mut reader(&disk), disk.len() as u64).unwrap();
        assert_eq!(
            p,
            vec![Partition {
                number: 2,
                start: 64 * 512,
                size: 100 * 512,
                kind: Kind::Mbr(0x83)
            }]
        );
    }

    #[test]
    fn tables_that_do_not_hold_together_are_refused() {
        let base = {
            let mut d = vec![0u8; 4 << 20];
            write_gpt(&mut d, &[(2048, 4095, Kind::LINUX_ROOT_X86_64)]);
            d
        };
        let refused = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut d = base.clone();
            f(&mut d);
            let e = partitions(&mut reader(&d), d.len() as u64).unwrap_err();
            e.to_string()
        };
        // A partition past the end, or ending before it starts.
        let e = refused(&|d| d[1024 + 40..1024 + 48].copy_from_slice(&u64::MAX.to_le_bytes()));
        assert!(e.contains("not on the disk"), "{e}");
        let e = refused(&|d| d[1024 + 40..1024 + 48].copy_from_slice(&10u64.to_le_bytes()));
        assert!(e.contains("not on the disk"), "{e}");
        // Huge counts and odd entry sizes: refused before any allocation.
        let e = refused(&|d| d[512 + 80..512 + 84].copy_from_slice(&u32::MAX.to_le_bytes()));
        assert!(e.contains("entries"), "{e}");
        let e = refused(&|d| d[512 + 84..512 + 88].copy_from_slice(&100u32.to_le_bytes()));
        assert!(e.contains("entries of 100 bytes"), "{e}");
        let e = refused(&|d| d[512 + 72..512 + 80].copy_from_slice(&u64::MAX.to_le_bytes()));
        assert!(e.contains("not on the disk"), "{e}");
        let e = refused(&|d| d[512..520].copy_from_slice(b"NOT PART"));
        assert!(e.contains("no GPT header"), "{e}");
    }
}
