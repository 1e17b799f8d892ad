//! `domus console DOM`: a domain's serial console through the daemon's API.
//! Its output is followed as `tail -F` follows a file (the console of a
//! daemon-managed domain goes to its log; after a restart, the new run's
//! log follows the old one's end); on a terminal, what you type goes to the
//! guest (its login prompt, a shell) until `Ctrl-]`, xl's escape key.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{failed, verb, StateArg};

#[derive(clap::Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Only follow the output, even on a terminal.
    #[arg(long)]
    pub read_only: bool,
    pub domain: String,
}

/// `Ctrl-]`: leaves the console (as xl's).
const ESCAPE: u8 = 0x1d;

/// The terminal on stdin in raw mode (keys as typed, no echo) until
/// dropped.
struct Raw(libc::termios);

impl Raw {
    fn enter() -> Option<Raw> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: tcgetattr fills a termios the stack owns.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on stdin.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        // SAFETY: cfmakeraw changes the termios it is given.
        unsafe { libc::cfmakeraw(&mut t) };
        // SAFETY: sets stdin's terminal from a termios that lives for the call.
        (unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) } == 0).then_some(Raw(saved))
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: restores the settings read from the same terminal.
        unsafe { libc::tcsetattr(std::io::stdin().as_raw_fd(), libc::TCSANOW, &self.0) };
    }
}

/// Sends what is typed on stdin to the domain until `Ctrl-]` (or the end of
/// stdin), then sets `quit`.
fn type_at(state: StateArg, id: String, quit: Arc<AtomicBool>) {
    let _ = std::thread::Builder::new()
        .name("console-in".into())
        .spawn(move || {
            let Ok(c) = state.client() else {
                return quit.store(true, Ordering::SeqCst);
            };
            let mut buf = [0u8; 1024];
            loop {
                let n = match std::io::stdin().read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let typed = &buf[..n];
                let (keys, done) = match typed.iter().position(|&b| b == ESCAPE) {
                    Some(i) => (&typed[..i], true),
                    None => (typed, false),
                };
                if !keys.is_empty() {
                    let text = String::from_utf8_lossy(keys);
                    if let Err(e) = c.console_input(&id, &text) {
                        eprint!("\r\ndomus console: {}\r\n", failed(e));
                        break;
                    }
                }
                if done {
                    break;
                }
            }
            quit.store(true, Ordering::SeqCst);
        });
}

/// Follows a domain's console until the domain has gone away and its log
/// has been read to the end, or until `Ctrl-]`.
pub fn console(a: ConsoleArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        // By id: a rename must not end the stream, and a domain that has
        // ended already (a brief `create -c`) still shows its last output.
        let id = match a.domain.parse::<i64>() {
            Ok(id) => id.to_string(),
            Err(_) => c.domain(&a.domain).map_err(failed)?.id.to_string(),
        };
        let quit = Arc::new(AtomicBool::new(false));
        // SAFETY: isatty has no preconditions.
        let tty = unsafe { libc::isatty(std::io::stdin().as_raw_fd()) } == 1;
        let raw = (tty && !a.read_only).then(Raw::enter).flatten();
        if raw.is_some() {
            eprint!(
                "domus console: connected to {} (Ctrl-] leaves)\r\n",
                a.domain
            );
            type_at(a.state.clone(), id.clone(), quit.clone());
        }
        let (mut file, mut from) = (None, 0);
        while !quit.load(Ordering::SeqCst) {
            let piece = match c.console(&id, file, from) {
                Ok(p) => p,
                Err(e) if e.status() == Some(404) => break,
                Err(e) => return Err(failed(e)),
            };
            let mut out = std::io::stdout();
            let _ = out.write_all(piece.data.as_bytes());
            let _ = out.flush();
            if piece.ended && piece.data.is_empty() {
                break;
            }
            let idle = piece.next == piece.from && Some(piece.file) == file;
            (file, from) = (Some(piece.file), piece.next);
            if idle {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        drop(raw);
        if tty && !a.read_only {
            eprintln!();
        }
        Ok(ExitCode::SUCCESS)
    })
}
