//! The host side of the serial console: where guest output goes, and host
//! input (stdin) fed to the guest, with the terminal in raw mode while the
//! domain runs. `Ctrl-A x` ends the domain from the console.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};

use domus_devices::bus::lock;
use domus_devices::serial::SerialDevice;

use crate::config::Console;
use crate::{Error, Result};

/// Unbuffered writes to a file descriptor: the guest sees its bytes on the
/// host as soon as it writes them to the UART.
struct FdOut(File);

impl Write for FdOut {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How large a console file grows before it is rotated: at most this much
/// of the newest output and this much before it (`PATH.1`) are kept, so a
/// guest that prints forever cannot fill the host's disk.
pub const CONSOLE_FILE_LIMIT: u64 = 16 << 20;

/// A console file that is rotated at a size: when the next write would take
/// it past `limit`, what `PATH` holds is copied over `PATH.1` (the older
/// `PATH.1` is dropped, offsets are kept) and `PATH` starts again empty.
/// Both are opened at the start and rotated through their descriptors, so
/// a jailed VMM, which can no longer reach them by name, rotates too.
struct RotatingFile {
    file: File,
    older: File,
    written: u64,
    limit: u64,
}

impl RotatingFile {
    fn create(path: &std::path::Path, limit: u64) -> std::io::Result<Self> {
        let mut older = path.to_path_buf().into_os_string();
        older.push(".1");
        let mut open = std::fs::OpenOptions::new();
        open.read(true).create(true);
        Ok(Self {
            // Appending: after a rotation empties it, writes start at 0.
            file: open.clone().append(true).open(path).and_then(|f| {
                f.set_len(0)?;
                Ok(f)
            })?,
            // Kept until the first rotation: a restarted domain's
            // supervisor keeps the last run's log there.
            older: open.write(true).truncate(false).open(older)?,
            written: 0,
            limit,
        })
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.older.set_len(0)?;
        let mut buf = vec![0u8; 64 << 10];
        let mut at = 0;
        while at < self.written {
            let n = self.file.read_at(&mut buf, at)?;
            if n == 0 {
                break;
            }
            self.older.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        self.file.set_len(0)?;
        self.written = 0;
        Ok(())
    }
}

impl Write for RotatingFile {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.written > 0 && self.written + b.len() as u64 > self.limit {
            self.rotate()?;
        }
        let n = self.file.write(b)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn output(console: &Console) -> Result<Box<dyn Write + Send>> {
    Ok(match console {
        Console::Stdout => {
            let fd = std::io::stdout()
                .as_fd_dup()
                .map_err(|e| Error::Io("stdout", e))?;
            Box::new(FdOut(fd))
        }
        Console::File(p) => Box::new(RotatingFile::create(p, CONSOLE_FILE_LIMIT).map_err(
            |source| Error::ConsoleFile {
                path: p.display().to_string(),
                source,
            },
        )?),
        Console::None => Box::new(std::io::sink()),
    })
}

trait DupFd {
    fn as_fd_dup(&self) -> std::io::Result<File>;
}

impl DupFd for std::io::Stdout {
    fn as_fd_dup(&self) -> std::io::Result<File> {
        Ok(File::from(self.as_fd().try_clone_to_owned()?))
    }
}

use std::os::fd::AsFd;

/// Restores the terminal's settings when dropped.
pub struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    /// Puts stdin in raw mode if it is a terminal.
    pub fn enter() -> Option<RawTerminal> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } != 1 {
            return None;
        }
        // SAFETY: termios is plain data; tcgetattr fills it and we check the result.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is a terminal and t is a valid termios to write.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        // SAFETY: cfmakeraw edits the struct in place.
        unsafe { libc::cfmakeraw(&mut t) };
        // Keep output post-processing so the host's own messages stay readable.
        t.c_oflag |= libc::OPOST;
        // SAFETY: fd is a terminal; t is a valid termios.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) };
        Some(RawTerminal { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores settings read from the same terminal.
        unsafe { libc::tcsetattr(std::io::stdin().as_raw_fd(), libc::TCSANOW, &self.saved) };
    }
}

/// Ctrl-A, the escape key of the console.
const ESCAPE: u8 = 0x01;

/// Feeds stdin to the serial device until EOF. Calls `quit` on `Ctrl-A x`.
pub fn spawn_input(
    serial: Arc<Mutex<SerialDevice>>,
    quit: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("console-in".into())
        .stack_size(128 << 10)
        .spawn(move || {
            if let Err(e) = crate::seccomp::enter(crate::seccomp::Kind::Console) {
                return eprintln!("domus: the console reader did not start: {e}");
            }
            let mut stdin = std::io::stdin();
            let mut buf = [0u8; 256];
            let mut escaped = false;
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let mut data = Vec::with_capacity(n);
                for &b in &buf[..n] {
                    if escaped {
                        escaped = false;
                        match b {
                            b'x' | b'X' => return quit(),
                            ESCAPE => data.push(ESCAPE),
                            _ => data.extend_from_slice(&[ESCAPE, b]),
                        }
                    } else if b == ESCAPE {
                        escaped = true;
                    } else {
                        data.push(b);
                    }
                }
                let mut rest = &data[..];
                while !rest.is_empty() {
                    let k = lock(&serial).enqueue_input(rest);
                    rest = &rest[k..];
                    if k == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_console_file_is_rotated_at_its_limit() {
        let dir = std::env::temp_dir().join(format!("domus-console-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("console.log");
        let mut f = RotatingFile::create(&path, 10).unwrap();
        for chunk in [&b"aaaa"[..], b"bbbb", b"cccc", b"dddd", b"eeeeeeeeeeee"] {
            f.write_all(chunk).unwrap();
        }
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        // The newest output whole (a write larger than the limit too), and
        // the file before it; older output is gone.
        assert_eq!(read(&path), "eeeeeeeeeeee");
        assert_eq!(read(&dir.join("console.log.1")), "ccccdddd");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        let _ = std::fs::remove_dir_all(dir);
    }
}
