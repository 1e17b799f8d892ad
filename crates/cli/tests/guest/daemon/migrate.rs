//! Live migration between two daemons on this host (two state
//! directories, the destination on TCP with TLS and its token): a guest
//! receiving a TCP stream from the host over its tap and writing a counter
//! to its disk goes on across the move without losing a byte; a guest that
//! dirties memory faster than it can be sent fails to converge and goes on
//! at the source; a cancelled migration leaves it there too; refusals
//! (wrong token, wrong certificate, a name the destination has) change
//! nothing.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use domus_guest::hash::Hash;

use super::*;

/// Sends a fixed pseudo-random stream to `addr` at 2 MiB/s at most until
/// `stop`, then closes; returns the bytes sent and their checksum.
///
/// The rate is a quarter of the slowest pre-copy seen in the nested host (the
/// CI of 2026-11-28 sent 4-8 MiB/s over TLS on its loopback): every byte
/// received dirties guest memory, so a stream as fast as the migration's
/// link could never converge, rightly. At 8 MiB/s it failed so there.
fn throttled_sender(addr: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let mut s = (0..100)
            .find_map(|_| {
                TcpStream::connect(&addr)
                    .map_err(|_| std::thread::sleep(Duration::from_millis(100)))
                    .ok()
            })
            .expect("the guest's receiver never listened");
        let (mut h, mut sent, mut x) = (Hash::default(), 0u64, 0x9e37_79b9_7f4a_7c15u64);
        const RATE: f64 = (2 << 20) as f64;
        let start = Instant::now();
        let mut buf = vec![0u8; 128 << 10];
        while !stop.load(Ordering::SeqCst) {
            for c in buf.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes());
            }
            s.write_all(&buf).expect("the stream into the guest broke");
            h.update(&buf);
            sent += buf.len() as u64;
            let due = Duration::from_secs_f64(sent as f64 / RATE);
            std::thread::sleep(due.saturating_sub(start.elapsed()));
        }
        s.shutdown(std::net::Shutdown::Write).unwrap();
        (sent, h.finish())
    })
}

/// `domus migrate` from the daemon on `state` to the one at `to`.
fn migrate(
    state: &std::path::Path,
    dom: &str,
    to: &str,
    dest: &Info,
    token: &std::path::Path,
    more: &[&str],
) -> (bool, String, String) {
    let fp = dest
        .tls_fingerprint
        .clone()
        .expect("the destination listens on TCP");
    let mut args = vec![
        "migrate",
        dom,
        to,
        "--fingerprint",
        &fp,
        "--token-file",
        token.to_str().unwrap(),
    ];
    args.extend_from_slice(more);
    domus_cli(state, &args)
}

#[test]
fn exclusive_daemons_migrate_a_running_domain_live() {
    let dir = scratch("dmig");
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    let _a = start_daemon(&src);
    let port = 17_000 + (std::process::id() % 1000) as u16;
    let to = format!("127.0.0.1:{port}");
    // Its own jail ids: its domains' ids start at 1 too.
    let _b = start_daemon_with(&dst, &["--listen-tcp", &to, "--jail-ids", "1600000000"]);
    let dest = info(&dst);
    let token = dst.join("token");
    let br = format!("dmg{}", std::process::id() % 100_000);
    let _bridge = Bridge::new(&br, "10.84.0.1/24", &[]);
    let img = image(&dir, "d.img", 16);
    let settings = format!(
        "disk = ['{},raw,xvda,rw']\nvif = ['bridge={br}']",
        img.display()
    );
    let (cfg, guest) = agent_config(&dir, "mv", 128, &settings);
    let (ok, out, err) = domus_cli(&src, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    agent_ready(&guest);
    let sh = |cmd: &str| guest_sh(&guest, cmd);
    sh("ip addr add 10.84.0.2/24 dev eth0 && ip link set eth0 up");
    sh("for i in $(seq 300); do ping -c1 -W1 10.84.0.1 >/dev/null && exit 0; sleep 0.1; done; exit 1");
    let mac = sh("cat /sys/class/net/eth0/address");
    let generation = sh("devmem 0xef000 64");

    // Refused, with the domain still here and nothing there: a wrong
    // token, a wrong certificate, a name the destination has.
    let bad = dir.join("bad-token");
    std::fs::write(&bad, "nope").unwrap();
    let (ok, _, err) = migrate(&src, "mv", &to, &dest, &bad, &[]);
    assert!(!ok && err.contains("401"), "{err}");
    let (ok, _, err) = domus_cli(
        &src,
        &[
            "migrate",
            "mv",
            &to,
            "--fingerprint",
            "SHA256:00",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    assert!(!ok && err.contains("certificate"), "{err}");
    let (clash, _) = agent_config(&dir, "mv", 128, "");
    let (ok, out, err) = domus_cli(&dst, &["create", clash.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = migrate(&src, "mv", &to, &dest, &token, &[]);
    assert!(!ok && err.contains("exists"), "{err}");
    assert!(domus_cli(&dst, &["destroy", "mv"]).0);
    assert_eq!(find(&src, "mv").expect("still here").state, State::Running);

    // Load across the move: a TCP stream from the host into the guest, and
    // a counter written to the disk, each value synced before the next.
    sh("domus-guest recv tcp 5003 > /tmp/recv.out 2>&1 < /dev/null &");
    let stop = Arc::new(AtomicBool::new(false));
    let sender = throttled_sender("10.84.0.2:5003".into(), stop.clone());
    sh("sh -c 'i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); echo $i | dd of=/dev/vda bs=512 seek=$i conv=fsync 2>/dev/null; echo $i > /tmp/last.new; mv /tmp/last.new /tmp/last; sleep 0.02; done' > /dev/null 2>&1 < /dev/null &");
    std::thread::sleep(Duration::from_secs(2));
    let up_before: f64 = sh("cut -d' ' -f1 /proc/uptime").parse().unwrap();

    let (ok, out, err) = migrate(&src, "mv", &to, &dest, &token, &[]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("migrated domain mv"), "{out}");
    eprintln!("{err}{out}");
    // Gone here (the monitor removes it once its VMM ended), running there.
    let end = Instant::now() + Duration::from_secs(20);
    while find(&src, "mv").is_some() {
        assert!(
            Instant::now() < end,
            "the source still lists it: {:?}",
            list(&src)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(find(&dst, "mv").expect("migrated").state, State::Running);
    restored_ready(&guest);
    // The same machine: its memory, uptime and MAC carried over.
    let up_after: f64 = sh("cut -d' ' -f1 /proc/uptime").parse().unwrap();
    assert!(up_after > up_before, "uptime {up_before} then {up_after}");
    assert_eq!(sh("cat /sys/class/net/eth0/address"), mac);
    assert_eq!(
        sh("devmem 0xef000 64"),
        generation,
        "the same machine: its VM generation ID is kept"
    );
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    let (sent, hash) = sender.join().unwrap();
    sh("for i in $(seq 100); do grep -q recv_bytes /tmp/recv.out && exit 0; sleep 0.1; done; cat /tmp/recv.out; exit 1");
    let got = sh("cat /tmp/recv.out");
    assert!(
        got.contains(&format!("recv_bytes={sent}"))
            && got.contains(&format!("recv_hash={hash:016x}")),
        "the stream into the guest: sent {sent} bytes, hash {hash:016x}; the guest got {got}"
    );
    sh("touch /tmp/stop; sleep 0.5");
    let last: u64 = sh("cat /tmp/last").parse().unwrap();
    assert!(last > 50, "the disk counter reached only {last}");
    assert!(domus_cli(&dst, &["destroy", "mv"]).0);
    let disk = std::fs::read(&img).unwrap();
    for i in 1..=last {
        let at = (i * 512) as usize;
        let text = String::from_utf8_lossy(&disk[at..at + 24]);
        let v = text.split('\n').next().unwrap_or_default();
        assert_eq!(v, i.to_string(), "sector {i} of the disk");
    }

    // A guest that dirties memory faster than it can be sent: no round
    // converges, and it goes on here, with nothing left there (the CI of
    // 2026-11-26 saw the nested host reset it in the cancel's pre-copy:
    // TestDaemon's drop tells tools/test).
    let (cfg, guest) = agent_config(&dir, "busy", 128, "");
    let (ok, out, err) = domus_cli(&src, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    agent_ready(&guest);
    let sh = |cmd: &str| guest_sh(&guest, cmd);
    sh("domus-guest dirty 32 > /dev/null 2>&1 < /dev/null &");
    let (ok, out, err) = migrate(
        &src,
        "busy",
        &to,
        &dest,
        &token,
        &["--downtime-ms", "1", "--max-rounds", "3"],
    );
    assert!(
        !ok && err.contains("does not converge") && err.contains("goes on here"),
        "{out}{err}"
    );
    assert_eq!(
        find(&src, "busy").expect("still here").state,
        State::Running
    );
    sh("true");
    let end = Instant::now() + Duration::from_secs(20);
    while find(&dst, "busy").is_some() {
        assert!(
            Instant::now() < end,
            "the destination kept it: {:?}",
            list(&dst)
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Cancelled while it copies: the same.
    let cli = src.clone();
    let (to2, dest2, token2) = (to.clone(), dest.clone(), token.clone());
    let going = std::thread::spawn(move || {
        migrate(
            &cli,
            "busy",
            &to2,
            &dest2,
            &token2,
            &["--downtime-ms", "1", "--max-rounds", "1000"],
        )
    });
    std::thread::sleep(Duration::from_secs(3));
    let (ok, out, err) = domus_cli(&src, &["migrate", "--cancel", "busy"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = going.join().unwrap();
    assert!(!ok && err.contains("cancelled"), "{out}{err}");
    assert_eq!(
        find(&src, "busy").expect("still here").state,
        State::Running
    );
    sh("true");
    assert!(domus_cli(&src, &["destroy", "busy"]).0);
}
