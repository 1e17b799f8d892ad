//! Running domains under the daemon's control: pause and unpause, and the
//! memory and CPU settings (mem-set, sched-credit, vcpu-pin) as they reach
//! the guest's balloon, the cgroup, vcpu-list, top and the metrics; rename.

use super::*;

#[test]
fn daemon_pause_stops_a_domains_cpu_time_and_unpause_resumes_it() {
    let dir = scratch("pause");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    let cfg = spin_config(&dir, "spin", "", "while :; do :; done");
    let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let cpu = || find(&state, "spin").unwrap().vcpu_time_s;
    assert!(domus_cli(&state, &["pause", "spin"]).0);
    assert_eq!(find(&state, "spin").unwrap().state, State::Paused);
    let a = cpu();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(cpu() - a < 0.05, "a paused domain ran");
    assert!(domus_cli(&state, &["unpause", "spin"]).0);
    assert_eq!(find(&state, "spin").unwrap().state, State::Running);
    let a = cpu();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(cpu() - a > 0.2, "an unpaused domain did not run");
    assert!(domus_cli(&state, &["destroy", "spin"]).0);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn daemon_memory_and_cpu_settings_reach_cgroup_vcpu_list_top_and_metrics() {
    let dir = scratch("settings");
    let state = dir.join("state");
    let mut daemon = start_daemon(&state);
    // One domain spins (for top), one idles (for the settings).
    for (n, cmd) in [
        ("busy", "while :; do :; done"),
        ("calm", "while :; do sleep 1; done"),
    ] {
        let cfg = domain_config(&dir, n, 192, &format!("-- {cmd}"), "maxmem = 256");
        let (ok, out, err) = domus_cli(&state, &["create", cfg.to_str().unwrap()]);
        assert!(ok, "create {n}: {out}{err}");
    }

    // mem-set moves the balloon, within maxmem.
    let (ok, _, err) = domus_cli(&state, &["mem-set", "calm", "160M"]);
    assert!(ok, "{err}");
    let (ok, _, err) = domus_cli(&state, &["mem-set", "calm", "4G"]);
    assert!(!ok && err.contains("maxmem"), "{err}");
    assert_eq!(
        info(&state).domain_memory_mib,
        2 * (256 + 64),
        "each domain holds its maxmem and its VMM's allowance, whatever mem-set says"
    );
    assert_eq!(find(&state, "calm").unwrap().memory_mib, 160);

    // Weight and cap land in the domain's cgroup, and are refused out of
    // range.
    let (ok, _, err) = domus_cli(
        &state,
        &["sched-credit", "-d", "calm", "-w", "512", "-c", "25"],
    );
    assert!(ok, "{err}");
    let calm = find(&state, "calm").unwrap();
    assert_eq!((calm.cpu_weight, calm.cap), (Some(512), Some(25)));
    let cg = std::path::Path::new("/sys/fs/cgroup/domus").join(format!(
        "{}-d{}",
        domus_daemon::instance_tag(&state),
        calm.id
    ));
    if cg.exists() {
        let read = |f: &str| std::fs::read_to_string(cg.join(f)).unwrap();
        assert_eq!(read("cpu.weight").trim(), "512");
        assert_eq!(read("cpu.max").trim(), "25000 100000");
    }
    let (ok, _, err) = domus_cli(&state, &["sched-credit", "-d", "calm", "-w", "70000"]);
    assert!(!ok && err.contains("weight"), "{err}");

    // Pinning shows in vcpu-list; a CPU the host lacks is refused.
    assert!(domus_cli(&state, &["vcpu-pin", "calm", "0", "0"]).0);
    let (ok, out, err) = domus_cli(&state, &["vcpu-list", "calm", "--json"]);
    assert!(ok, "{err}");
    let v: Vec<domus_api::daemon::Vcpu> = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0].affinity.as_deref(), Some("0"), "{v:?}");
    let (ok, _, err) = domus_cli(&state, &["vcpu-pin", "calm", "0", "99"]);
    assert!(!ok && err.contains("does not exist"), "{err}");

    // top and /metrics account the vCPU threads.
    let (ok, out, err) = domus_cli(&state, &["top", "--once", "--json"]);
    assert!(ok, "{err}");
    // top's own JSON (not an API type): name and vcpu_pct of each domain.
    #[derive(serde::Deserialize)]
    struct Top {
        name: String,
        vcpu_pct: f64,
    }
    let top: Vec<Top> = serde_json::from_str(&out).unwrap();
    let busy = top.iter().find(|d| d.name == "busy").unwrap();
    assert!(busy.vcpu_pct > 5.0, "a spinning domain: {out}");
    let (s, m) = domus_http::request(&state.join("domusd.sock"), "GET", "/metrics", None).unwrap();
    assert_eq!(s, 200);
    for n in ["busy", "calm"] {
        assert!(
            m.contains(&format!("domus_domain_vcpu_seconds_total{{domain=\"{n}\"")),
            "{m}"
        );
    }

    // rename: not onto a name in use; the settings go with the domain.
    let (ok, _, err) = domus_cli(&state, &["rename", "calm", "busy"]);
    assert!(!ok && err.contains("exists"), "{err}");
    assert!(domus_cli(&state, &["rename", "calm", "still"]).0);
    let still = find(&state, "still").unwrap();
    assert_eq!((still.id, still.cpu_weight), (calm.id, Some(512)));
    assert!(find(&state, "calm").is_none());
    for n in ["busy", "still"] {
        assert!(domus_cli(&state, &["destroy", n]).0);
    }
    assert_no_cgroups_left(&state);
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
