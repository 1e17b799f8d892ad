//! The virtual firewall-router with real domains on the daemon's default
//! network: a domain that sends frames with a spoofed MAC, a spoofed
//! source address, a forged ARP reply, a DHCP request for another MAC and
//! IPv6 reaches neither the other
//! domain nor the host with any of them (checked where they would arrive),
//! its drop counters rise, and its legitimate traffic flows; `isolated=1`
//! cuts domain-to-domain traffic, not domain-to-host; `tcp=` lets new
//! connections reach only its ports; after a destroy,
//! and after a daemon SIGKILL and restart (with a stale interface's rules
//! added and a running one's removed meanwhile), nftables holds exactly
//! the rules of the running domains.

use super::*;
use std::io::Write;

/// The taps whose rules the daemon's VFR table holds.
fn ruled_taps(state: &std::path::Path) -> Vec<String> {
    let table = domus_daemon::vfr::table_name(&domus_daemon::instance_tag(state));
    let out = Command::new("nft")
        .args(["-j", "list", "table", "bridge", &table])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut taps: Vec<String> = v["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["chain"]["name"].as_str())
        .filter_map(|n| n.strip_suffix("_out"))
        .filter(|n| !n.contains('_'))
        .map(str::to_string)
        .collect();
    taps.sort();
    taps
}

/// The taps of `doms` as their VMMs show them.
fn taps_of(state: &std::path::Path, doms: &[&str]) -> Vec<String> {
    let mut taps: Vec<String> = doms
        .iter()
        .flat_map(|d| interfaces(state, d))
        .map(|i| i.fact("tap").to_string())
        .collect();
    taps.sort();
    taps
}

fn interfaces(state: &std::path::Path, dom: &str) -> Vec<domus_api::vmm::DeviceInfo> {
    let (ok, out, err) = domus_cli(state, &["network-list", "--json", dom]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap()
}

/// `kind=N` of a sniff report.
fn seen(report: &str, kind: &str) -> u64 {
    report
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{kind}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {kind} in '{report}'"))
}

/// Sends the test frames from `from` (MAC `mac`, address `ip`, claiming
/// `victim`'s) while `to` and the host's bridge `bridge` sniff: their
/// reports.
fn exchange(
    from: &Client,
    to: &Client,
    bridge: &str,
    mac: &str,
    ip: &str,
    victim: &str,
) -> (String, String) {
    // Generous windows: the nested host runs other tests beside this one.
    // In the background, every output away from the agent's pipes (which
    // it reads to their end before it answers).
    guest_sh(
        to,
        "rm -f /tmp/sniff; (domus-guest sniff eth0 10 > /tmp/sniff.w 2>&1 && mv /tmp/sniff.w /tmp/sniff) > /dev/null 2>&1 < /dev/null &",
    );
    let host = Command::new(guest_helper())
        .args(["sniff", bridge, "10"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    guest_sh(from, &format!("domus-guest spoof eth0 {mac} {ip} {victim}"));
    let host = host.wait_with_output().unwrap();
    assert!(host.status.success());
    let at_guest = guest_sh(
        to,
        "for i in $(seq 100); do [ -f /tmp/sniff ] && break; sleep 0.2; done; cat /tmp/sniff",
    );
    (at_guest, String::from_utf8_lossy(&host.stdout).into_owned())
}

#[test]
fn the_vfr_stops_spoofed_frames_isolates_and_keeps_its_rules_in_line() {
    let dir = scratch("vfr");
    let state = dir.join("state");
    let args = ["--network-bridge", "dvfr0", "--network", "10.203.0.1/24"];
    let mut daemon = start_daemon_with(&state, &args);
    let mut guests = Vec::new();
    for (name, vif) in [
        ("a", "ip=10.203.0.10"),
        ("b", "ip=10.203.0.11"),
        ("c", "ip=10.203.0.12,isolated=1,tcp=5000"),
    ] {
        let (cfg, guest) = agent_config(&dir, name, 128, &format!("vif = ['{vif}']"));
        let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
        assert!(ok, "{out}{err}");
        guests.push(guest);
    }
    for (g, ip) in guests
        .iter()
        .zip(["10.203.0.10", "10.203.0.11", "10.203.0.12"])
    {
        agent_ready(g);
        guest_sh(
            g,
            &format!("ip link set eth0 up && ip addr add {ip}/24 dev eth0"),
        );
    }
    let (a, b, c) = (&guests[0], &guests[1], &guests[2]);
    let mac_a = guest_sh(a, "cat /sys/class/net/eth0/address");
    assert_eq!(interfaces(&state, "a")[0].fact("mac"), mac_a);
    // Legitimate traffic flows: domain to domain, domain to host.
    let ping = |g: &Client, to: &str| {
        g.run(&format!("ping -c 1 -W 3 {to} || ping -c 1 -W 3 {to}"))
            .unwrap()
            .status
            == 0
    };
    assert!(ping(a, "10.203.0.11"), "a cannot reach b");
    assert!(ping(a, "10.203.0.1"), "a cannot reach the host");

    let (at_b, at_host) = exchange(a, b, "dvfr0", &mac_a, "10.203.0.10", "10.203.0.11");
    for (who, report) in [("domain b", &at_b), ("the host", &at_host)] {
        assert!(
            seen(report, "legit") >= 1,
            "{who} missed a's legitimate frame: {report}"
        );
        for k in ["mac", "ip", "arp", "ip6", "dhcp"] {
            assert_eq!(
                seen(report, k),
                0,
                "{who} got a's {k}-spoofed frame: {report}"
            );
        }
    }
    let net = &interfaces(&state, "a")[0];
    for k in ["vfr_mac", "vfr_ip", "vfr_arp", "vfr_ip6", "vfr_dhcp"] {
        assert!(net.counter(k) >= 1, "{k} not counted: {:?}", net.counters);
    }
    assert!(net.counter("vfr_passed") >= 1 && net.counter("vfr_dropped") >= 5);
    let (status, metrics) =
        domus_http::request(&state.join("domusd.sock"), "GET", "/metrics", None).unwrap();
    let line = format!(
        "domus_vif_vfr_packets_total{{domain=\"a\",id=\"1\",tap=\"{}\",verdict=\"mac\"}}",
        net.fact("tap")
    );
    assert!(status == 200 && metrics.contains(&line), "{metrics}");
    // The forged ARP reply did not poison b: a's traffic still flows.
    assert!(ping(a, "10.203.0.11"), "a's legitimate traffic stopped");

    // Isolated c: the host, not the other domains, either way.
    assert!(ping(c, "10.203.0.1"), "isolated c cannot reach the host");
    assert!(!ping(c, "10.203.0.11"), "isolated c reached b");
    assert!(!ping(b, "10.203.0.12"), "b reached isolated c");
    assert!(interfaces(&state, "c")[0].counter("vfr_isolated") >= 1);
    // c's tcp=5000: a connection to port 5000 reaches it (and is refused:
    // nothing listens), one to 5001 is dropped on the way.
    let connect = |port: u16| {
        let to = std::net::SocketAddr::from(([10, 203, 0, 12], port));
        std::net::TcpStream::connect_timeout(&to, Duration::from_secs(3)).unwrap_err()
    };
    let e = connect(5000);
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "port 5000: {e}"
    );
    let e = connect(5001);
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "port 5001: {e}");
    assert!(interfaces(&state, "c")[0].counter("vfr_port") >= 1);
    let top = list(&state);
    let c_row = top.iter().find(|d| d.name == "c").unwrap();
    assert!(c_row.vfr_dropped >= 2 && c_row.vfr_passed >= 1, "{c_row:?}");

    // The rules follow the domains.
    assert_eq!(ruled_taps(&state), taps_of(&state, &["a", "b", "c"]));
    let (ok, out, err) = domus_cli(&state, &["destroy", "c"]);
    assert!(ok, "{out}{err}");
    assert_eq!(ruled_taps(&state), taps_of(&state, &["a", "b"]));

    // A daemon killed: meanwhile a stale interface's rules appear and b's
    // go; the next daemon puts back exactly a's and b's.
    let (taps_a, taps_b) = (taps_of(&state, &["a"]), taps_of(&state, &["b"]));
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let table = domus_daemon::vfr::table_name(&domus_daemon::instance_tag(&state));
    let script = format!(
        "add chain bridge {table} dmstale9n0_out\nadd counter bridge {table} dmstale9n0_mac\n\
         flush chain bridge {table} {b}_out\nadd element bridge {table} out_of {{ \"dmstale9n0\" : jump dmstale9n0_out }}\n",
        b = taps_b[0]
    );
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    nft.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(nft.wait().unwrap().success());
    let _daemon = start_daemon_with(&state, &args);
    let mut want = [taps_a, taps_b.clone()].concat();
    want.sort();
    assert_eq!(ruled_taps(&state), want);
    // b's rules are whole again: a spoofed frame from b stops.
    let mac_b = guest_sh(b, "cat /sys/class/net/eth0/address");
    let (at_a, _) = exchange(b, a, "dvfr0", &mac_b, "10.203.0.11", "10.203.0.10");
    assert_eq!(
        seen(&at_a, "mac") + seen(&at_a, "ip") + seen(&at_a, "arp"),
        0,
        "{at_a}"
    );
    assert!(seen(&at_a, "legit") >= 1, "{at_a}");
    for d in ["a", "b"] {
        let (ok, out, err) = domus_cli(&state, &["destroy", d]);
        assert!(ok, "{out}{err}");
    }
    assert!(ruled_taps(&state).is_empty());
    let _ = std::fs::remove_dir_all(dir);
}
