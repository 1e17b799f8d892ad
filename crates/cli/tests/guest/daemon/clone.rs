//! `domus clone`: 16 domains from one snapshot, each with its own name,
//! MAC, vsock CID, VM generation ID, random stream and disk copy, on one
//! bridge at once, sharing the snapshot's memory; and clone requests
//! refused with nothing left behind. Exclusive: 16 guests load the nested
//! host, and the clones take the vsock CIDs just above the template's, which
//! other tests of this process may hold.

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
    let (ok, out, err) = domus_cli(state, &["clone", "--json", snap, count, "cl"]);
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
