//! `domus-guest`: what the tests and benchmarks run inside guests (and on
//! the host, for native numbers). Built as a static binary
//! (`-C target-feature=+crt-static`) so it runs in the kit's busybox
//! initramfs, which has no C library.
//!
//! * `ioload PATH SECONDS [first-write]`: block I/O throughput and IOPS (bench/io);
//! * `osbench [SECONDS]`: lmbench-style operating-system microbenchmarks
//!   (bench/paper's Tables 3-5; src/osbench.rs says what each measures);
//! * `send tcp HOST PORT MIB` / `send vsock CID PORT MIB`: connects and
//!   sends MIB MiB of a fixed pseudo-random stream;
//! * `recv tcp PORT` / `recv vsock PORT`: accepts one connection and reads
//!   it to the end;
//! * `echo vsock PORT`: accepts one connection and sends back what it reads;
//! * `ping vsock CID PORT MIB`: sends MIB MiB to an echo server and reads
//!   the echo back at the same time;
//! * `agent PORT`: the guest agent, serving commands over vsock
//!   (`domus_guest::agent`) until asked to exit;
//! * `exec CID PORT CMD`: runs CMD through the agent of guest CID, prints
//!   its output and exits with its status;
//! * `gaps MS`: wakes every millisecond and prints `gap_ms=X` for each
//!   wake-up more than MS late on the guest's monotonic clock, for ever:
//!   the guest's own view of how long it was stopped (bench/migration);
//! * `dirty MIB`: writes every page of MIB MiB of memory, over and over,
//!   for ever: a guest that dirties memory faster than a live migration
//!   can send it;
//! * `spoof IFACE MAC IP VICTIM`: sends on IFACE (its MAC and IPv4 address
//!   given) one legitimate broadcast frame and the frames a hostile domain
//!   would: from another MAC, from VICTIM's address, an ARP reply claiming
//!   VICTIM's address, and IPv6 (`domus_guest::frames`);
//! * `sniff IFACE SECONDS`: counts the frames of each of those kinds seen
//!   on IFACE for SECONDS, and prints `legit=N mac=N ip=N arp=N ip6=N`.
//!
//! Streams print `bytes=N hash=H mbs=X`: a checksum of what went over the
//! wire, so two ends can be compared.

mod ioload;
mod osbench;
mod stream;
mod webdyn;

use domus_guest::agent;

fn usage() -> ! {
    eprintln!(
        "usage: domus-guest ioload PATH SECONDS [first-write] | osbench [SECONDS]\n       domus-guest send tcp HOST PORT MIB | send vsock CID PORT MIB\n       domus-guest recv tcp PORT | recv vsock PORT\n       domus-guest echo vsock PORT | ping vsock CID PORT MIB\n       domus-guest agent PORT | exec CID PORT CMD\n       domus-guest gaps MS | dirty MIB | webdyn PORT DIR\n       domus-guest spoof IFACE MAC IP VICTIM | sniff IFACE SECONDS"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else { usage() };
    match cmd.as_str() {
        "ioload" => ioload::main(&args[1..]),
        "osbench" => osbench::main(&args[1..]),
        "webdyn" => webdyn::main(&args[1..]),
        // What osbench's fork_exec runs.
        "nop" => {}
        "send" | "recv" | "echo" | "ping" => stream::main(cmd, &args[1..]),
        "agent" => {
            let Some(port) = args.get(1).and_then(|p| p.parse().ok()) else {
                usage()
            };
            if let Err(e) = agent::serve(port) {
                eprintln!("domus-guest agent: {e}");
                std::process::exit(1);
            }
        }
        "exec" => {
            let num = |i: usize| args.get(i).and_then(|p| p.parse().ok());
            let (Some(cid), Some(port), Some(cmd)) = (num(1), num(2), args.get(3)) else {
                usage()
            };
            match agent::Client::new(cid, port).run(cmd) {
                Ok(r) => {
                    print!("{}", r.stdout);
                    eprint!("{}", r.stderr);
                    std::process::exit(r.status);
                }
                Err(e) => {
                    eprintln!("domus-guest exec: {e}");
                    std::process::exit(1);
                }
            }
        }
        "dirty" => {
            let Some(mib) = args.get(1).and_then(|p| p.parse::<usize>().ok()) else {
                usage()
            };
            dirty(mib)
        }
        "gaps" => {
            let Some(ms) = args.get(1).and_then(|p| p.parse::<f64>().ok()) else {
                usage()
            };
            gaps(ms)
        }
        "spoof" => {
            use domus_guest::frames;
            let (Some(iface), Some(mac), Some(ip), Some(victim)) = (
                args.get(1),
                args.get(2).and_then(|m| frames::parse_mac(m)),
                args.get(3).and_then(|a| a.parse().ok()),
                args.get(4).and_then(|a| a.parse().ok()),
            ) else {
                usage()
            };
            let fs: Vec<Vec<u8>> = frames::test_frames(mac, ip, victim)
                .into_iter()
                .map(|(_, f)| f)
                .collect();
            if let Err(e) = frames::send(iface, &fs) {
                eprintln!("domus-guest spoof: {e}");
                std::process::exit(1);
            }
        }
        "sniff" => {
            use domus_guest::frames;
            let (Some(iface), Some(secs)) = (args.get(1), args.get(2).and_then(|s| s.parse().ok()))
            else {
                usage()
            };
            match frames::sniff(iface, secs) {
                Ok(c) => println!("{}", frames::report(&c)),
                Err(e) => {
                    eprintln!("domus-guest sniff: {e}");
                    std::process::exit(1);
                }
            }
        }
        _ => usage(),
    }
}

/// See `dirty MIB` above.
fn dirty(mib: usize) -> ! {
    let mut mem = vec![0u8; mib << 20];
    let mut n = 0u8;
    loop {
        n = n.wrapping_add(1);
        for page in mem.chunks_mut(4096) {
            // Volatile: the writes must happen, not be folded away.
            // SAFETY: a write to a byte of a live, owned buffer.
            unsafe { std::ptr::write_volatile(&mut page[0], n) };
        }
    }
}

/// See `gaps MS` above.
fn gaps(ms: f64) -> ! {
    use std::io::Write;
    let mut last = std::time::Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(1));
        let now = std::time::Instant::now();
        let gap = (now - last).as_secs_f64() * 1000.0;
        if gap > ms {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "gap_ms={gap:.1}");
            let _ = out.flush();
        }
        last = now;
    }
}
