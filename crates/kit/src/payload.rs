//! The ELF vmlinux inside a bzImage: the payload at `payload_offset` of the
//! protected-mode part, compressed with gzip, xz, lz4 or zstd (decompressed by
//! the host's tools).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::{Error, Result};

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// The compressed payload and the tool that decompresses it.
pub fn payload(bz: &[u8]) -> Result<(&[u8], &'static str)> {
    let bad = |m: &str| Error::Invalid(format!("bzImage: {m}"));
    if bz.get(0x202..0x206) != Some(b"HdrS") {
        return Err(bad("no HdrS header"));
    }
    let setup_sects = match bz.get(0x1f1) {
        Some(0) => 4,
        Some(n) => usize::from(*n),
        None => return Err(bad("truncated")),
    };
    let pm_start = (setup_sects + 1) * 512;
    let off = u32_at(bz, 0x248).ok_or_else(|| bad("truncated"))? as usize;
    let len = u32_at(bz, 0x24c).ok_or_else(|| bad("truncated"))? as usize;
    let start = pm_start
        .checked_add(off)
        .ok_or_else(|| bad("bad payload offset"))?;
    let data = start
        .checked_add(len)
        .and_then(|end| bz.get(start..end))
        .ok_or_else(|| bad("payload outside the file"))?;
    // Kbuild appends the uncompressed size (4 bytes) to xz, lz4 and zstd payloads.
    let (tool, trailer) = match data {
        [0x1f, 0x8b, ..] => ("gzip", 0),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => ("xz", 4),
        [0x02, 0x21, 0x4c, 0x18, ..] => ("lz4", 4),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => ("zstd", 4),
        _ => return Err(bad("unknown payload compression")),
    };
    Ok((&data[..data.len().saturating_sub(trailer)], tool))
}

/// Decompresses the payload to the ELF vmlinux.
pub fn decompress_payload(bz: &[u8]) -> Result<Vec<u8>> {
    let (data, tool) = payload(bz)?;
    let mut child = Command::new(tool)
        .args(["-d", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Error::Command {
            cmd: format!("{tool} -d -c"),
            detail: format!("{e} (install {tool})"),
        })?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| Error::Invalid("no stdin".into()))?;
    let owned = data.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&owned));
    let out = child.wait_with_output().map_err(|e| Error::Command {
        cmd: format!("{tool} -d -c"),
        detail: e.to_string(),
    })?;
    let _ = feeder.join();
    // gzip warns about trailing bytes with status 2; the ELF check below is what matters.
    if !out.stdout.starts_with(b"\x7fELF") {
        return Err(Error::Command {
            cmd: format!("{tool} -d -c"),
            detail: "the bzImage payload did not decompress to an ELF vmlinux".into(),
        });
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_bz(payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 0x400 + 0x100];
        b[0x1f1] = 1; // setup_sects: protected mode starts at 0x400
        b[0x202..0x206].copy_from_slice(b"HdrS");
        b[0x248..0x24c].copy_from_slice(&0x80u32.to_le_bytes());
        b[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        b.resize(0x480, 0);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn finds_payload_and_compression() {
        let b = fake_bz(&[0xfd, b'7', b'z', b'X', b'Z', 0, 9, 9, 1, 2, 3, 4]);
        let (d, tool) = payload(&b).unwrap();
        assert_eq!(tool, "xz");
        assert_eq!(d, &[0xfd, b'7', b'z', b'X', b'Z', 0, 9, 9]);
    }

    #[test]
    fn rejects_bad_images() {
        assert!(payload(b"short").is_err());
        let mut b = fake_bz(&[1, 2, 3]);
        assert!(payload(&b)
            .unwrap_err()
            .to_string()
            .contains("unknown payload"));
        b[0x24c..0x250].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        assert!(payload(&b).unwrap_err().to_string().contains("outside"));
    }

    #[test]
    fn round_trips_through_gzip() {
        let elf = b"\x7fELF-pretend-vmlinux".repeat(10);
        let mut gz = Command::new("gzip")
            .arg("-c")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        gz.stdin.take().unwrap().write_all(&elf).unwrap();
        let compressed = gz.wait_with_output().unwrap().stdout;
        assert_eq!(decompress_payload(&fake_bz(&compressed)).unwrap(), elf);
    }
}
