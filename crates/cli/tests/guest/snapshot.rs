//! Save and restore: a domain saved through its API, killed, and started
//! again with `domus run --restore` goes on from where it stopped (its
//! processes, its memory, its disk, its clock, its devices); a domain
//! saved and resumed goes on running; a paused one restores paused; and
//! every damaged snapshot is refused with nothing started.

use crate::agent::{restore_command, Running};
use crate::*;
use domus_api::client::VmmClient;
use domus_api::vmm::DomainState;

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn save(sock: &std::path::Path, body: &str) -> serde_json::Value {
    let (status, v) = api(sock, "PUT", "/v1/domain/snapshot", Some(body));
    assert_eq!(status, 200, "{v}");
    v
}

/// A number the guest printed.
fn num(s: &str) -> f64 {
    s.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("not a number: {s:?}"))
}

#[test]
fn a_saved_domain_restores_and_goes_on_where_it_stopped() {
    let dir = scratch("snap");
    let img = image(&dir, "d.img", 16);
    let (sock, sock2) = (dir.join("api.sock"), dir.join("api2.sock"));
    let snap = dir.join("web.snap");
    let mut vm = TestVm::agent()
        .disk(img.display())
        .api_socket(&sock)
        .args(["--balloon"])
        .start();
    let cid = vm.cid();
    // A counter in the background, state in tmpfs (guest memory only),
    // and a pattern on the disk. Each value is renamed into place: a
    // reader between `>`'s truncation and the write read "" (CI of
    // 2026-11-26).
    vm.sh(
        "(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; \
         sleep 0.05; done) >/dev/null 2>&1 &",
    );
    vm.sh("echo saved-pattern | dd of=/dev/vda bs=512 seek=7 conv=fsync 2>/dev/null");
    std::thread::sleep(Duration::from_millis(500));
    let before = num(&vm.sh("cat /tmp/count"));
    let up_before = num(&vm.sh("cat /proc/uptime"));
    let skew_before = num(&vm.sh("date +%s")) - now_s();
    let body = format!("{{\"path\": \"{}\"}}", snap.display());
    let v = save(&sock, &body);
    assert_eq!(v["paused"], true, "{v}");
    assert!(
        v["pages_stored"].as_u64().unwrap() < (256 << 20) / 4096,
        "{v}"
    );
    assert!(snap.is_file() && dir.join("web.snap.mem").is_file());
    assert_eq!(
        std::fs::metadata(dir.join("web.snap.mem")).unwrap().len(),
        256 << 20
    );
    // The paused domain no longer counts.
    let vmm = VmmClient::new(&sock);
    assert_eq!(vmm.domain().unwrap().state, DomainState::Paused);
    let first = vm.kill();
    assert!(!first.stderr.contains("seccomp"), "the first VMM: {first}");

    let args = [
        "--api-socket",
        sock2.to_str().unwrap(),
        "--name",
        "restored",
    ];
    let mut back = Running::spawn(restore_command(&snap, &args), cid, false);
    back.wait_restored();
    // The background counter goes on from where it was.
    let after = num(&back.sh("cat /tmp/count"));
    assert!(
        after >= before,
        "count {after} after the restore, {before} before"
    );
    std::thread::sleep(Duration::from_millis(500));
    let later = num(&back.sh("cat /tmp/count"));
    assert!(later > after, "the counter stopped: {after} then {later}");
    // Uptime goes on; the wall clock is the host's.
    assert!(num(&back.sh("cat /proc/uptime")) >= up_before);
    let skew = num(&back.sh("date +%s")) - now_s();
    let source = back.sh("cat /sys/devices/system/clocksource/clocksource0/current_clocksource");
    assert!(
        (skew - skew_before).abs() < 3.0,
        "the guest's clock ({source}) is {skew:.1} s off after the restore, {skew_before:.1} s before"
    );
    // The disk: what was written before, and new writes.
    assert_eq!(
        back.sh("dd if=/dev/vda bs=512 skip=7 count=1 2>/dev/null | head -n1"),
        "saved-pattern"
    );
    back.sh("echo after | dd of=/dev/vda bs=512 seek=9 conv=fsync 2>/dev/null");
    assert_eq!(
        back.sh("dd if=/dev/vda bs=512 skip=9 count=1 2>/dev/null | head -n1"),
        "after"
    );
    // The entropy device and the balloon still answer.
    assert_eq!(back.sh("head -c 64 /dev/hwrng | wc -c"), "64");
    let vmm2 = VmmClient::new(&sock2);
    let info = vmm2.domain().unwrap();
    assert_eq!(
        (info.name.as_str(), info.state),
        ("restored", DomainState::Running)
    );
    let (status, b) = back.api(&sock2, "PUT", "/v1/balloon", Some("{\"target_mib\": 200}"));
    assert_eq!(status, 200, "{b}");
    let mut b = serde_json::Value::Null;
    let took = wait_balloon(|| {
        b = back.api(&sock2, "GET", "/v1/balloon", None).1;
        b["balloon_actual_mib"]
            .as_u64()
            .map_or(56, |m| m.abs_diff(56))
    });
    if let Err(e) = took {
        // (CI of 2026-11-28 once failed here with nothing more to go on.)
        // What the guest says of it, then the VMM captured as a stalled one
        // is, and its output.
        let guest = back.run(
            "grep -h . /sys/bus/virtio/drivers/virtio_balloon/*/features 2>&1; \
             grep -E 'MemFree|MemTotal' /proc/meminfo; dmesg | tail -n 15",
        );
        back.fail(&format!(
            "the balloon did not inflate after the restore: {e}: {b}\nthe guest: {guest:?}"
        ));
    }
    let run = back.finish();
    assert_clean_poweroff(&run);

    refusals(&dir, &snap);
}

/// Damaged snapshots: each refused with exit status 2 and a message naming
/// what is wrong, and no VMM left running.
fn refusals(dir: &std::path::Path, snap: &std::path::Path) {
    let state = std::fs::read(snap).unwrap();
    let restore = |file: &std::path::Path| {
        let out = restore_command(file, &["--console", "none"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let text = String::from_utf8_lossy(&state).into_owned();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            state[..state.len() - 100].to_vec(),
            "truncated",
        ),
        (
            "corrupt",
            {
                let mut b = state.clone();
                let at = b.len() - 50;
                b[at] ^= 0x01;
                b
            },
            "corrupt",
        ),
        (
            "newer",
            text.replacen("\"version\":1", "\"version\":99", 1)
                .into_bytes(),
            "newer than this Domus reads",
        ),
        ("empty", Vec::new(), "not a Domus snapshot"),
    ];
    for (name, bytes, want) in cases {
        let (code, err) = restore(&write(name, &bytes));
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
    }
    // The memory file cut short.
    let short = write("short", &state);
    let mem = dir.join("web.snap.mem");
    std::fs::copy(&mem, dir.join("short.mem")).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("short.mem"))
        .unwrap();
    f.set_len(100 << 20).unwrap();
    // The state names web.snap.mem: point it at short.mem.
    let text2 = text.replacen("web.snap.mem", "short.mem", 1);
    let short_state = domus_reencode(&text2);
    std::fs::write(&short, short_state).unwrap();
    let (code, err) = restore(&short);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("memory file is truncated"), "{err}");
    // A disk that is gone.
    std::fs::rename(dir.join("d.img"), dir.join("gone.img")).unwrap();
    let (code, err) = restore(snap);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("d.img"), "{err}");
}

/// The state file `text` (header line and body) with its header written
/// again for its (edited) body.
fn domus_reencode(text: &str) -> Vec<u8> {
    let body = text.split_once('\n').unwrap().1;
    let v: domus_api::snapshot::SnapshotBody<serde_json::Value> =
        serde_json::from_str(body).unwrap();
    domus_api::snapshot::encode(&v).unwrap()
}

#[test]
fn a_domain_saved_running_goes_on_and_a_paused_one_restores_paused() {
    let dir = scratch("snap2");
    let img = image(&dir, "d.img", 16);
    let (sock, sock2) = (dir.join("api.sock"), dir.join("api2.sock"));
    let (live, held) = (dir.join("live.snap"), dir.join("held.snap"));
    let mut vm = TestVm::agent()
        .vcpus(2)
        .disk(img.display())
        .api_socket(&sock)
        .args(["--name", "orig"])
        .start();
    let cid = vm.cid();
    assert_eq!(vm.sh("nproc"), "2");
    // Saved and resumed: the domain goes on, its disk works.
    let v = save(
        &sock,
        &format!("{{\"path\": \"{}\", \"resume\": true}}", live.display()),
    );
    assert_eq!(v["paused"], false, "{v}");
    vm.sh("echo on | dd of=/dev/vda bs=512 seek=3 conv=fsync 2>/dev/null");
    assert_eq!(
        vm.sh("dd if=/dev/vda bs=512 skip=3 count=1 2>/dev/null | head -n1"),
        "on"
    );
    // Paused by the user, then saved: it restores paused.
    let vmm = VmmClient::new(&sock);
    vmm.pause().unwrap();
    save(&sock, &format!("{{\"path\": \"{}\"}}", held.display()));
    vm.kill();
    let args = ["--api-socket", sock2.to_str().unwrap()];
    let mut back = Running::spawn(restore_command(&held, &args), cid, false);
    let vmm2 = VmmClient::new(&sock2);
    let deadline = Instant::now() + Duration::from_secs(60);
    while vmm2.domain().is_err() {
        assert!(
            Instant::now() < deadline,
            "the restored VMM never served its API"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = vmm2.domain().unwrap();
    assert_eq!(info.state, DomainState::Paused);
    assert_eq!(info.name, "orig", "a restore keeps the saved name");
    vmm2.resume().unwrap();
    back.wait_restored();
    assert_eq!(back.sh("nproc"), "2");
    assert_eq!(
        back.sh("dd if=/dev/vda bs=512 skip=3 count=1 2>/dev/null | head -n1"),
        "on"
    );
    assert_clean_poweroff(&back.finish());
}

#[test]
fn two_copies_of_one_snapshot_run_at_once_each_its_own() {
    let dir = scratch("snap3");
    let sock = dir.join("api.sock");
    let snap = dir.join("base.snap");
    let mut vm = TestVm::agent().api_socket(&sock).start();
    // The VM generation ID device is in the guest's ACPI namespace.
    assert_eq!(vm.sh("ls -d /sys/bus/acpi/devices/VMGENCTR:* | wc -l"), "1");
    save(&sock, &format!("{{\"path\": \"{}\"}}", snap.display()));
    vm.kill();
    // Two copies side by side, each with a vsock CID of its own, which
    // its guest learns from the transport reset (it drops packets for
    // another CID, so its agent answering there proves it).
    let copies: Vec<(u32, Running)> = (0..2)
        .map(|i| {
            let cid = crate::agent::next_cid();
            let api = dir.join(format!("copy{i}.sock"));
            let args = [
                "--api-socket",
                api.to_str().unwrap(),
                "--vsock",
                &format!("cid={cid}"),
            ];
            let mut c = Running::spawn(restore_command(&snap, &args), cid, false);
            c.wait_restored();
            (cid, c)
        })
        .collect();
    let mut streams = Vec::new();
    for (cid, mut c) in copies {
        assert_eq!(c.cid(), cid);
        streams.push(c.sh("head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'"));
        assert_clean_poweroff(&c.finish());
    }
    assert_eq!(streams[0].len(), 64, "{streams:?}");
    assert_ne!(
        streams[0], streams[1],
        "two copies gave the same random bytes"
    );
}
