//! The VFR's scripts, and its rules on real frames: a bridge with two
//! veth "domains" in a network namespace of the test's own, hostile frames
//! sent from one and sniffed at the other and at the bridge (needs root
//! and Debian's nftables, as the daemon does; tools/test runs as root).

use super::*;
use domus_guest::frames;

fn vif(spec: &str) -> Vif {
    let mut w = Vec::new();
    domus_xlcfg::parse_vif(spec, &mut w).unwrap()
}

#[test]
fn policies_follow_the_vif() {
    let p = Policy::of("dmab1n0", &vif("mac=52:54:00:AA:00:01"), true).unwrap();
    assert_eq!(p.mac, "52:54:00:aa:00:01");
    assert_eq!(p.v4, V4::Leased);
    assert!(p.v6.is_empty() && !p.isolated && p.tcp.is_none());
    let p = Policy::of("dmab1n0", &vif("mac=52:54:00:aa:00:01,bridge=br0"), false).unwrap();
    assert_eq!(p.v4, V4::Any, "a user's bridge, no ip=: any IPv4 source");
    let p = Policy::of(
        "dmab1n0",
        &vif("mac=52:54:00:aa:00:01,ip=10.0.0.2 fd00::2,tcp=22,isolated=1"),
        true,
    )
    .unwrap();
    assert_eq!(p.v4, V4::Only(vec![Ipv4Addr::new(10, 0, 0, 2)]));
    assert_eq!(p.v6, vec!["fd00::2".parse::<Ipv6Addr>().unwrap()]);
    assert!(p.isolated);
    // Nothing that would be read as nft syntax gets into a script.
    assert!(Policy::of("dm;x", &vif("mac=52:54:00:aa:00:01"), true).is_err());
    assert!(Policy::of("dmab1n0", &Vif::default(), true).is_err());
}

#[test]
fn scripts_hold_each_rule_once_and_remove_what_they_add() {
    let t = "domus_ab12";
    let p = Policy::of(
        "dmab1n0",
        &vif("mac=52:54:00:aa:00:01,ip=10.0.0.2,tcp=22 80-90,udp="),
        true,
    )
    .unwrap();
    let s = apply_script(t, &p);
    assert!(s.contains("ether saddr != 52:54:00:aa:00:01 counter name dmab1n0_mac drop"));
    assert!(s.contains("add element bridge domus_ab12 dmab1n0_v4 { 10.0.0.2 }"));
    assert!(s.contains("tcp dport { 22, 80-90 }"), "{s}");
    assert!(
        !s.contains("udp dport {"),
        "an empty udp= allows no port: {s}"
    );
    assert!(s.contains("ether type ip6 counter name dmab1n0_ip6 drop"));
    assert!(
        s.contains("udp dport 67 @th,288,48 != 0x525400aa0001 counter name dmab1n0_dhcp drop"),
        "{s}"
    );
    assert!(s.contains("delete element bridge domus_ab12 fwd_out { \"dmab1n0\" }"));
    let r = remove_script(t, "dmab1n0");
    for c in ["out", "in", "fwd_out", "fwd_in"] {
        assert!(r.contains(&format!("delete chain bridge {t} dmab1n0_{c}\n")));
    }
    for k in KINDS {
        assert!(r.contains(&format!("delete counter bridge {t} dmab1n0_{k}\n")));
    }
    let v: serde_json::Value = serde_json::from_str(
        r#"{"nftables": [{"metainfo": {}}, {"counter": {"name": "dmab1n0_mac", "packets": 3}},
            {"counter": {"name": "dmab1n0_passed", "packets": 9}}, {"counter": {"name": "junk", "packets": 1}}]}"#,
    )
    .unwrap();
    let c = parse_counters(&v);
    assert_eq!(c["dmab1n0"]["mac"], 3);
    assert_eq!(c["dmab1n0"]["passed"], 9);
    assert_eq!(passed_dropped(&c["dmab1n0"]), (9, 3));
    assert_eq!(c.len(), 1);
}

/// Runs `ip ARGS` (in the calling thread's network namespace).
fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const MAC_A: &str = "52:54:00:00:00:0a";
const MAC_B: &str = "52:54:00:00:00:0b";

/// Frames seen, by kind.
type Seen = Vec<(&'static str, usize)>;

/// Sends the test frames from domain A (veth end `ga`) while sniffing at
/// domain B (`gb`) and the bridge: what each saw, by kind.
fn exchange(ns: i32, victim: Ipv4Addr) -> (Seen, Seen) {
    let sniff = |iface: &'static str| {
        std::thread::spawn(move || {
            // SAFETY: moves this new thread into the test's namespace.
            assert_eq!(unsafe { libc::setns(ns, libc::CLONE_NEWNET) }, 0);
            frames::sniff(iface, 1.5).unwrap()
        })
    };
    let (b, host) = (sniff("gb"), sniff("vbr0"));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mac = frames::parse_mac(MAC_A).unwrap();
    let fs: Vec<Vec<u8>> = frames::test_frames(mac, Ipv4Addr::new(10, 9, 0, 2), victim)
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    frames::send("ga", &fs).unwrap();
    (b.join().unwrap(), host.join().unwrap())
}

fn seen(counts: &[(&str, usize)], kind: &str) -> usize {
    counts
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}

#[test]
fn hostile_frames_stop_at_the_bridge_and_legitimate_ones_pass() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "the VFR's test makes a network namespace, a bridge and nftables rules: run it as root"
    );
    // A namespace of this thread's own (and of what it starts).
    std::thread::spawn(|| {
        // SAFETY: unshare(2) of this thread's network namespace only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
        // SAFETY: a NUL-terminated path.
        let ns = unsafe { libc::open(c"/proc/thread-self/ns/net".as_ptr(), libc::O_RDONLY) };
        assert!(ns >= 0);
        ip("link set lo up");
        ip("link add vbr0 type bridge");
        ip("link set vbr0 up");
        for (d, mac) in [("a", MAC_A), ("b", MAC_B)] {
            ip(&format!("link add dmt1n{d} address 02:00:00:00:01:0{d} type veth peer name g{d} address {mac}"));
            ip(&format!("link set dmt1n{d} master vbr0 up"));
            ip(&format!("link set g{d} up"));
        }
        // Its taps' names begin with `dm` and the tag, as the daemon's.
        let vfr = Nft::new("t1");
        let a = vif(&format!("mac={MAC_A},ip=10.9.0.2"));
        let b = vif(&format!("mac={MAC_B},ip=10.9.0.3"));
        vfr.apply(&Policy::of("dmt1na", &a, true).unwrap()).unwrap();
        vfr.apply(&Policy::of("dmt1nb", &b, true).unwrap()).unwrap();
        let victim = Ipv4Addr::new(10, 9, 0, 3);
        let (at_b, at_host) = exchange(ns, victim);
        for (name, c) in [("domain B", &at_b), ("the host", &at_host)] {
            assert_eq!(seen(c, "legit"), 1, "{name} saw {c:?}");
            for k in ["mac", "ip", "arp", "ip6", "dhcp"] {
                assert_eq!(seen(c, k), 0, "{name} got a {k}-spoofed frame: {c:?}");
            }
        }
        let counts = vfr.counters();
        let ca = &counts["dmt1na"];
        for k in ["mac", "ip", "arp", "ip6", "dhcp"] {
            assert!(ca[k] >= 1, "{k} drops not counted: {ca:?}");
        }
        assert!(ca["passed"] >= 1);
        // A tap of the daemon's with no rules (being made, or removed):
        // nothing it sends passes.
        vfr.remove("dmt1na").unwrap();
        let (at_b, at_host) = exchange(ns, victim);
        assert!(
            frames::KINDS
                .iter()
                .all(|k| seen(&at_b, k) + seen(&at_host, k) == 0),
            "an unruled tap's frames passed: {at_b:?} {at_host:?}"
        );
        // Without the VFR's table, all of them reach B.
        nft(&format!("delete table bridge {}", table_name("t1"))).unwrap();
        let (at_b, _) = exchange(ns, victim);
        assert!(frames::KINDS.iter().all(|k| seen(&at_b, k) == 1), "{at_b:?}");
        vfr.apply(&Policy::of("dmt1nb", &b, true).unwrap()).unwrap();
        // Isolated: the host still hears A, B does not.
        let iso = vif(&format!("mac={MAC_A},ip=10.9.0.2,isolated=1"));
        vfr.apply(&Policy::of("dmt1na", &iso, true).unwrap()).unwrap();
        let (at_b, at_host) = exchange(ns, victim);
        assert_eq!((seen(&at_b, "legit"), seen(&at_host, "legit")), (0, 1));
        assert!(vfr.counters()["dmt1na"]["isolated"] >= 1);
        // A leased interface sends IPv4 only from its lease, once learnt.
        let leased = Policy::of("dmt1na", &vif(&format!("mac={MAC_A}")), true).unwrap();
        vfr.apply(&leased).unwrap();
        assert_eq!(seen(&exchange(ns, victim).0, "legit"), 0, "before a lease");
        vfr.learn("dmt1na", &[Ipv4Addr::new(10, 9, 0, 2)]).unwrap();
        assert_eq!(seen(&exchange(ns, victim).0, "legit"), 1, "after its lease");
        // Reconciled: exactly the interfaces asked for, whatever was there.
        assert_eq!(vfr.present().unwrap().len(), 2);
        vfr.reconcile(&[Policy::of("dmt1nb", &b, true).unwrap()]).unwrap();
        assert_eq!(vfr.present().unwrap(), vec!["dmt1nb".to_string()]);
        assert!(!vfr.counters().contains_key("dmt1na"), "its counters went with it");
        vfr.reconcile(&[]).unwrap();
        assert!(vfr.present().unwrap().is_empty());
        assert!(vfr.counters().is_empty());
        // SAFETY: closes the descriptor opened above.
        unsafe { libc::close(ns) };
    })
    .join()
    .unwrap();
}
