//! TCP and vsock streams with a checksum, for the network and vsock tests
//! and benchmarks.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use domus_guest::hash::Hash;
use domus_guest::vsock;

const CHUNK: usize = 64 << 10;
/// How long a vsock peer may take to accept (see `vsock::connect`).
const CONNECT_WITHIN: Duration = Duration::from_secs(30);

fn report(what: &str, bytes: u64, hash: u64, start: Instant) {
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    println!(
        "{what}bytes={bytes} {what}hash={hash:016x} {what}mbs={:.1}",
        bytes as f64 / secs / 1e6
    );
}

fn fail(msg: String) -> ! {
    eprintln!("domus-guest: {msg}");
    std::process::exit(1);
}

fn num<T: std::str::FromStr>(s: Option<&String>, what: &str) -> T {
    s.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| fail(format!("{what}: expected a number")))
}

/// Sends `mib` MiB of the pseudo-random stream on `w`.
pub fn send(mut w: impl Write, mib: u64) -> (u64, u64) {
    let mut seed = 0x5eed_u64;
    let mut h = Hash::default();
    let mut buf = vec![0u8; CHUNK];
    let total = mib << 20;
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(CHUNK as u64) as usize;
        for c in buf[..n].chunks_mut(8) {
            let v = crate::ioload::next(&mut seed).to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        w.write_all(&buf[..n])
            .unwrap_or_else(|e| fail(format!("send: {e}")));
        h.update(&buf[..n]);
        sent += n as u64;
    }
    (sent, h.finish())
}

/// Reads `r` to the end.
pub fn recv(mut r: impl Read) -> (u64, u64) {
    let mut h = Hash::default();
    let mut buf = vec![0u8; CHUNK];
    let mut got = 0;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                got += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => fail(format!("recv: {e}")),
        }
    }
    (got, h.finish())
}

pub fn main(cmd: &str, args: &[String]) {
    let kind = args.first().map(String::as_str);
    match (cmd, kind) {
        ("send", Some("tcp")) => {
            let host = args.get(1).unwrap_or_else(|| crate::usage());
            let port: u16 = num(args.get(2), "PORT");
            let mib: u64 = num(args.get(3), "MIB");
            let s = TcpStream::connect((host.as_str(), port))
                .unwrap_or_else(|e| fail(format!("connect {host}:{port}: {e}")));
            let start = Instant::now();
            let (n, h) = send(&s, mib);
            let _ = s.shutdown(Shutdown::Write);
            // Wait for the receiver to close: it has everything then.
            let _ = (&s).read(&mut [0u8; 1]);
            report("sent_", n, h, start);
        }
        ("recv", Some("tcp")) => {
            let port: u16 = num(args.get(1), "PORT");
            let l = TcpListener::bind(("0.0.0.0", port))
                .unwrap_or_else(|e| fail(format!("listen {port}: {e}")));
            println!("listening=tcp:{port}");
            let (s, _) = l.accept().unwrap_or_else(|e| fail(format!("accept: {e}")));
            let start = Instant::now();
            let (n, h) = recv(&s);
            report("recv_", n, h, start);
        }
        ("send", Some("vsock")) => {
            let cid: u32 = num(args.get(1), "CID");
            let port: u32 = num(args.get(2), "PORT");
            let mib: u64 = num(args.get(3), "MIB");
            let s = vsock::connect(cid, port, CONNECT_WITHIN)
                .unwrap_or_else(|e| fail(format!("connect vsock {cid}:{port}: {e}")));
            let start = Instant::now();
            let (n, h) = send(&s, mib);
            // SAFETY: shutdown on our socket.
            unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&s), libc::SHUT_WR) };
            let _ = (&s).read(&mut [0u8; 1]);
            report("sent_", n, h, start);
        }
        ("ping", Some("vsock")) => {
            let cid: u32 = num(args.get(1), "CID");
            let port: u32 = num(args.get(2), "PORT");
            let mib: u64 = num(args.get(3), "MIB");
            let s = vsock::connect(cid, port, CONNECT_WITHIN)
                .unwrap_or_else(|e| fail(format!("connect vsock {cid}:{port}: {e}")));
            let r = s.try_clone().unwrap_or_else(|e| fail(format!("dup: {e}")));
            let start = Instant::now();
            // Read the echo while sending, or both ends stall on full buffers.
            let reader = std::thread::spawn(move || recv(&r));
            let (n, h) = send(&s, mib);
            // SAFETY: shutdown on our socket.
            unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(&s), libc::SHUT_WR) };
            report("sent_", n, h, start);
            let (n, h) = reader.join().unwrap_or_else(|_| fail("reader died".into()));
            report("echoed_", n, h, start);
        }
        ("recv", Some("vsock")) | ("echo", Some("vsock")) => {
            let port: u32 = num(args.get(1), "PORT");
            let l = vsock::Listener::bind(port)
                .unwrap_or_else(|e| fail(format!("listen vsock {port}: {e}")));
            println!("listening=vsock:{port}");
            let s = l
                .accept()
                .unwrap_or_else(|e| fail(format!("accept vsock {port}: {e}")));
            let start = Instant::now();
            if cmd == "echo" {
                let mut buf = vec![0u8; CHUNK];
                let mut h = Hash::default();
                let mut n = 0u64;
                loop {
                    match (&s).read(&mut buf) {
                        Ok(0) => break,
                        Ok(k) => {
                            h.update(&buf[..k]);
                            n += k as u64;
                            (&s).write_all(&buf[..k])
                                .unwrap_or_else(|e| fail(format!("echo: {e}")));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => fail(format!("echo: {e}")),
                    }
                }
                report("echo_", n, h.finish(), start);
            } else {
                let (n, h) = recv(&s);
                report("recv_", n, h, start);
            }
        }
        _ => crate::usage(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_ignores_chunking_but_not_content() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        let mut a = Hash::default();
        a.update(&data);
        let mut b = Hash::default();
        for c in data.chunks(7) {
            b.update(c);
        }
        let ha = a.finish();
        assert_eq!(ha, b.finish());
        let mut c = Hash::default();
        let mut d2 = data.clone();
        d2[500] ^= 1;
        c.update(&d2);
        assert_ne!(ha, c.finish());
        let mut e = Hash::default();
        e.update(&data[..999]);
        assert_ne!(ha, e.finish());
    }

    #[test]
    fn send_and_recv_agree() {
        let mut buf = Vec::new();
        let (n, h) = send(&mut buf, 1);
        assert_eq!(n, 1 << 20);
        assert_eq!(recv(&buf[..]), (n, h));
    }
}
