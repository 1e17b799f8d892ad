//! A writer for the "newc" cpio format the kernel unpacks as an initramfs.
//! Entries carry their own mode and owner, so no root privileges are needed to
//! make device nodes or root-owned files.

use std::io::{self, Write};

pub struct CpioWriter<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> CpioWriter<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            ino: 1,
            written: 0,
        }
    }

    fn pad(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..pad])
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let ino = self.ino;
        self.ino += 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            ino,
            mode,
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    pub fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040755, (0, 0), &[])
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100000 | perm, (0, 0), data)
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.entry(name, 0o120777, (0, 0), target.as_bytes())
    }

    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, 0o020000 | perm, (major, minor), &[])
    }

    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_terminated() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("bin").unwrap();
        w.file("bin/x", 0o755, b"hello").unwrap();
        w.symlink("sh", "bin/x").unwrap();
        w.char_dev("dev/console", 0o600, 5, 1).unwrap();
        let out = w.finish().unwrap();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let s = String::from_utf8_lossy(&out);
        assert!(s.contains("bin/x\0"));
        assert!(s.contains("hello"));
        assert!(s.contains("TRAILER!!!\0"));
        // The file entry: mode 100755, size 5.
        let at = s.find("bin/x\0").unwrap() - 110;
        assert_eq!(&s[at + 14..at + 22], "000081ed");
        assert_eq!(&s[at + 54..at + 62], "00000005");
    }

    #[test]
    fn cpio_tool_reads_it_back() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("d").unwrap();
        w.file("d/f", 0o644, b"abc").unwrap();
        let data = w.finish().unwrap();
        let mut child = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&data).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "d\nd/f\n");
    }
}
