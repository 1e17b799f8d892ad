//! `domus clone`: 16 domains from one snapshot, each with its own name,
//! MAC, vsock CID, VM generation ID, random stream and disk copy, on one
//! bridge at once, sharing the snapshot's memory; and clone requests
//! refused with nothing left behind. Exclusive: 16 guests load the nested
//! host, and the clones take the vsock CIDs just above the template's, which
//! other tests of this process may hold.

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

const CLONES: usize = 16;

#[test]
fn exclusive_daemon_clones_a_snapshot_16_times_each_its_own() {
    let dir = scratch("dclone");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let br = format!("dcl{}", std::process::id() % 100_000);
    let _bridge = Bridge::new(&br, "10.83.0.1/24", &[]);
    let img = image(&dir, "d.img", 16);
    let settings = format!(
        "disk = ['{},raw,xvda,rw']\nvif = ['bridge={br}']",
        img.display()
    );
    let (cfg, guest) = agent_config(&dir, "tpl", 128, &settings);
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    agent_ready(&guest);
    let sh = |cmd: &str| guest_sh(&guest, cmd);
    let template_mac = sh("cat /sys/class/net/eth0/address");
    sh("echo template | dd of=/dev/vda bs=512 seek=5 conv=fsync 2>/dev/null");
    let template_gen = sh("devmem 0xef000 64");
    let template_rss = rss_mib(find(&state, "tpl").unwrap().pid.unwrap() as u64);
    let snap = dir.join("tpl.snap");
    let (ok, out, err) = domus_cli(&state, &["save", "tpl", snap.to_str().unwrap()]);
    assert!(ok, "{out}{err}");

    // Refused, with nothing left: no count, too many, and a disk copy
    // that would write over a file (the first clone's copy, made before
    // the second's was refused, goes again).
    let s = snap.to_str().unwrap();
    let (ok, _, err) = domus_cli(&state, &["clone", s, "0"]);
    assert!(!ok && err.contains("1 to 256"), "{err}");
    std::fs::write(dir.join("d-bad-2.img"), "mine").unwrap();
    let (ok, _, err) = domus_cli(&state, &["clone", s, "3", "bad"]);
    assert!(!ok && err.contains("d-bad-2.img exists"), "{err}");
    assert!(
        !dir.join("d-bad-1.img").exists(),
        "a refused clone's disk copy was left"
    );
    assert_eq!(std::fs::read(dir.join("d-bad-2.img")).unwrap(), b"mine");
    assert_eq!(list(&state).len(), 1, "only Domain-0: {:?}", list(&state));

    // 16 clones at once, each checked from inside. A clone whose guest
    // triple-faults (the nested host's bug, see tools/test; seen in clones
    // while they handle the interface hot-plug, issue 14's note) fails the
    // attempt; that alone is tried again from scratch, at most 3 times,
    // each retry said.
    let count = CLONES.to_string();
    let mut retries = 0;
    let (cloned, pss_kib) = loop {
        let faults = triple_faulted(&daemon.log).len();
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            clone_and_check(&state, s, &count, &template_mac, &template_gen)
        }));
        match attempt {
            Ok(done) => break done,
            Err(e) if retries < 3 && triple_faulted(&daemon.log).len() > faults => {
                retries += 1;
                eprintln!(
                    "domus-test: a clone's guest triple-faulted; cloning again (retry {retries} of 3)"
                );
                for d in list(&state).iter().filter(|d| d.name.starts_with("cl-")) {
                    assert!(domus_cli(&state, &["destroy", &d.name]).0);
                }
                for i in 1..=CLONES {
                    let _ = std::fs::remove_file(dir.join(format!("d-cl-{i}.img")));
                }
                drop(e);
            }
            Err(e) => {
                // The next tests need the nested host: no clone left running.
                for d in list(&state).iter().filter(|d| d.name.starts_with("cl-")) {
                    let _ = domus_cli(&state, &["destroy", &d.name]);
                }
                std::panic::resume_unwind(e);
            }
        }
    };
    // Each disk copy has its own clone's write; the template's disk has none.
    for (d, copy) in cloned.domains.iter().zip(&cloned.disks) {
        let bytes = std::fs::read(copy).unwrap();
        assert!(bytes[5 * 512..].starts_with(b"template\n"), "{copy}");
        assert!(
            bytes[6 * 512..].starts_with(format!("{}\n", d.name).as_bytes()),
            "{copy} lacks its clone's write"
        );
    }
    assert!(std::fs::read(&img).unwrap()[6 * 512..].starts_with(&[0; 8]));
    // Together they hold far less than 16 booted guests would.
    let pss_mib = pss_kib >> 10;
    eprintln!(
        "domus-test: {CLONES} clones hold {pss_mib} MiB (PSS) together; the template held {template_rss} MiB"
    );
    assert!(
        pss_mib < CLONES as u64 * template_rss / 4,
        "{CLONES} clones hold {pss_mib} MiB, the template alone {template_rss} MiB"
    );
    // A name taken: refused before anything is made.
    let (ok, _, err) = domus_cli(&state, &["clone", s, "2", "cl"]);
    assert!(!ok && err.contains("cl-1"), "{err}");

    for d in &cloned.domains {
        assert!(domus_cli(&state, &["destroy", &d.name]).0);
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    assert_no_cgroups_left(&state);
}

/// `domus clone FILE COUNT cl`, then each clone checked from inside: the
/// template's memory and disk, its own CID, MAC (pinging the host on the
/// bridge), generation ID and random stream, a write to its disk copy.
/// Returns the answer and the clones' PSS together, in KiB.
fn clone_and_check(
    state: &std::path::Path,
    snap: &str,
    count: &str,
    template_mac: &str,
    template_gen: &str,
) -> (domus_api::daemon::Cloned, u64) {
    let done = AtomicBool::new(false);
    let ((ok, out, err), captures) = std::thread::scope(|s| {
        let watch = s.spawn(|| watch_unplugs(state, &done));
        let r = domus_cli(state, &["clone", "--json", snap, count, "cl"]);
        done.store(true, Ordering::SeqCst);
        (r, watch.join().unwrap_or_default())
    });
    if !ok {
        // At the start of a line, where tools/test looks for the platform's.
        for c in &captures {
            eprintln!("\n{c}");
        }
    }
    assert!(ok, "{out}{err}");
    let cloned: domus_api::daemon::Cloned =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(cloned.domains.len(), CLONES);
    assert_eq!(cloned.disks.len(), CLONES);
    let mut macs = std::collections::HashSet::from([template_mac.to_string()]);
    let mut gens = std::collections::HashSet::from([template_gen.to_string()]);
    let mut randoms = std::collections::HashSet::new();
    let mut cids = std::collections::HashSet::new();
    let mut pss_kib = 0;
    for (i, d) in cloned.domains.iter().enumerate() {
        assert_eq!(d.name, format!("cl-{}", i + 1));
        assert_eq!(d.state, State::Running, "{d:?}");
        let cid = d.vsock_cid.expect("a clone has a vsock CID");
        assert!(cids.insert(cid), "CID {cid} given twice");
        let c = Client::new(cid as u32, agent::AGENT_PORT);
        restored_ready(&c);
        let sh = |cmd: &str| guest_sh(&c, cmd);
        // Its memory and its disk copy are the template's.
        assert_eq!(
            sh("dd if=/dev/vda bs=512 skip=5 count=1 2>/dev/null | head -n1"),
            "template"
        );
        sh(&format!(
            "echo {} | dd of=/dev/vda bs=512 seek=6 conv=fsync 2>/dev/null",
            d.name
        ));
        // Its interface was replaced: a new MAC, working on the bridge.
        let mac = sh(
            "for i in $(seq 300); do a=$(cat /sys/class/net/eth0/address 2>/dev/null) && \
             [ \"$a\" != \"$OLD\" ] && echo $a && exit 0; sleep 0.1; done; exit 1"
                .replace("$OLD", template_mac)
                .as_str(),
        );
        assert!(macs.insert(mac.clone()), "MAC {mac} given twice");
        sh(&format!(
            "ip addr add 10.83.0.{}/24 dev eth0 && ip link set eth0 up && \
             for i in $(seq 100); do ping -c1 -W1 10.83.0.1 >/dev/null && exit 0; done; exit 1",
            10 + i
        ));
        let g = sh("devmem 0xef000 64");
        assert!(gens.insert(g.clone()), "generation ID {g} seen twice");
        let r = sh("head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'");
        assert!(randoms.insert(r.clone()), "random stream {r} seen twice");
        pss_kib += pss_kib_of(d.pid.unwrap() as u64);
    }
    (cloned, pss_kib)
}

/// The proportional set size of process `pid`, in KiB: its private pages
/// and its share of the pages it shares.
fn pss_kib_of(pid: u64) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no Pss in {text}"))
}

/// While `domus clone` runs: a clone whose guest has not let go of its
/// restored interface [`UNPLUG_CAPTURE`] after the daemon asked it to (the
/// daemon's log: "detaching net0 (MAC) from domain NAME") has its VMM
/// captured (stall_capture) while it is still there: the daemon gives up
/// at 60 s and takes every clone down with it. Returns the captures, for a
/// failed clone to print (CI of 2026-11-29: a clone's guest kept its
/// interface past 60 s, in a nested host that triple-faulted the next
/// test's guest, and nothing said whether that guest was running).
fn watch_unplugs(state: &std::path::Path, done: &AtomicBool) -> Vec<String> {
    let log = state.with_file_name("daemon.log");
    // Only what this clone run logs: the test clones more than once.
    let start = std::fs::read_to_string(&log).map_or(0, |t| t.len());
    // Each clone asked: its name, MAC, and when it was asked (None once
    // it has been looked at).
    let mut asked: Vec<(String, String, Option<Instant>)> = Vec::new();
    let mut captures = Vec::new();
    while !done.load(Ordering::SeqCst) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        for (mac, name) in text
            .get(start..)
            .unwrap_or_default()
            .lines()
            .filter_map(detach_asked)
        {
            if !asked.iter().any(|(n, ..)| *n == name) {
                asked.push((name, mac, Some(Instant::now())));
            }
        }
        for (name, mac, since) in asked.iter_mut() {
            if !since.is_some_and(|t| t.elapsed() >= UNPLUG_CAPTURE) {
                continue;
            }
            *since = None;
            if let Some(d) = still_holds(state, name, mac) {
                let console =
                    std::fs::read_to_string(console_path(state, d.id)).unwrap_or_default();
                captures.push(format!(
                    "domus-test: clone {name} had not let go of {mac} {} s after it was asked\n{}",
                    UNPLUG_CAPTURE.as_secs(),
                    stall_capture(state, name, &console)
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    captures
}

/// How long after the daemon asked a clone's guest to let go of its
/// interface [`watch_unplugs`] looks at it: most let go within seconds,
/// and the capture (about 5 s) must end before the daemon's 60 s wait.
const UNPLUG_CAPTURE: Duration = Duration::from_secs(40);

/// The MAC and domain of a daemon log line "detaching net0 (MAC) from
/// domain NAME".
fn detach_asked(line: &str) -> Option<(String, String)> {
    let (_, rest) = line.split_once("detaching net")?;
    let (_, rest) = rest.split_once(" (")?;
    let (mac, rest) = rest.split_once(") from domain ")?;
    let name = rest.split_whitespace().next()?;
    Some((mac.to_string(), name.to_string()))
}

/// Domain `name` as `list` shows it, if its VMM still has an interface
/// with `mac`. Never panics: it runs beside the clone.
fn still_holds(state: &std::path::Path, name: &str, mac: &str) -> Option<Domain> {
    let (ok, out, _) = domus_cli(state, &["list", "--json"]);
    let d = serde_json::from_str::<Vec<Domain>>(&out)
        .ok()
        .filter(|_| ok)?
        .into_iter()
        .find(|d| d.name == name)?;
    let api = domus_api::client::VmmClient::new(state.join(format!("domains/{}/api.sock", d.id)))
        .with_timeout(Duration::from_secs(5));
    let devices = api.devices().ok()?;
    devices.iter().any(|v| v.fact("mac") == mac).then_some(d)
}

#[test]
fn a_detach_line_names_its_mac_and_domain() {
    let line = "2026-11-29T19:54:18.213727Z  INFO detaching net0 (52:54:00:26:d9:d4) from domain cl-2 domain=\"cl-2\"";
    assert_eq!(
        detach_asked(line),
        Some(("52:54:00:26:d9:d4".into(), "cl-2".into()))
    );
    assert_eq!(detach_asked("detaching vdb (/x.img) from domain d"), None);
}
