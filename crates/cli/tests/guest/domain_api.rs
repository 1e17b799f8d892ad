//! The domain's REST API: state, pause and resume, device counters, rate
//! limits changed at run time, and bad requests refused.

use crate::*;
use domus_api::client::VmmClient;
use domus_api::vmm::{DomainState, RateLimit, RateLimitUpdate};

/// CPU time (user + system, clock ticks) of thread `tid` of process `pid`.
fn thread_ticks(pid: u64, tid: u64) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn api_pauses_resumes_counts_and_changes_limits() {
    let dir = scratch("api");
    let img = image(&dir, "d.img", 32);
    let sock = dir.join("api.sock");
    let mut vm = TestVm::agent()
        .disk(format!("{},bw=64M", img.display()))
        .api_socket(&sock)
        .args(["--name", "api-test"])
        .start();
    let vmm = VmmClient::new(&sock);
    let info = vmm.domain().unwrap();
    assert_eq!(info.name, "api-test");
    assert_eq!(info.state, DomainState::Running);
    assert_eq!((info.vcpus, info.memory_mib), (1, 256));

    // Pause stops a spinning vCPU; resume lets it run again.
    let spinner = vm.sh("sh -c 'while :; do :; done' > /dev/null 2>&1 & echo $!");
    let (pid, tid) = (u64::from(info.pid), info.vcpu_tids[0] as u64);
    let spent = |ms| {
        let a = thread_ticks(pid, tid);
        std::thread::sleep(Duration::from_millis(ms));
        thread_ticks(pid, tid) - a
    };
    assert!(spent(1000) >= 20, "the spinning vCPU used no CPU");
    assert_eq!(vmm.pause().unwrap().state, DomainState::Paused);
    let paused = spent(1500);
    assert!(paused <= 2, "a paused vCPU used {paused} ticks");
    assert_eq!(vmm.domain().unwrap().state, DomainState::Paused);
    assert_eq!(vmm.resume().unwrap().state, DomainState::Running);
    assert!(spent(1000) >= 20, "the resumed vCPU used no CPU");
    vm.sh(&format!("kill {spinner}"));

    // The disk's counters, and its limits read and changed.
    vm.sh("dd if=/dev/urandom of=/dev/vda bs=1M count=4 oflag=direct");
    let d = vmm.device("vda").unwrap();
    assert_eq!(d.kind, "block");
    assert!(d.counter("write_bytes") >= 4 << 20, "{d:?}");
    assert!(d.counter("write_ops") >= 4, "{d:?}");
    // The rings of a guest at rest: the disk's queue moved, its device
    // interrupted the guest on a routed, unmasked vector, and no queue is
    // owed an interrupt or has one left unhandled.
    let rings = vmm.rings().unwrap();
    let disk: Vec<_> = rings.iter().filter(|r| r.device == "vda").collect();
    assert!(!disk.is_empty(), "{rings:?}");
    for q in &disk {
        assert!(q.event_idx && q.signalled_at.is_some(), "{q:?}");
        let v = q.vector.as_ref().expect("a vector");
        assert!(v.enabled && v.routed && !v.masked && v.fired > 0, "{q:?}");
    }
    let moved: u32 = disk.iter().map(|q| u32::from(q.used_idx)).sum();
    assert!(moved >= 4, "{disk:?}");
    let again = vmm.rings().unwrap();
    let findings = domus_api::rings::stable_findings(&rings, &again);
    assert!(findings.is_empty(), "{findings:?}\n{again:?}");
    let limit = |d: &domus_api::vmm::DeviceInfo| d.rate_limit.unwrap_or_default();
    assert_eq!(limit(&d).bandwidth, Some(64 << 20));
    // Bad requests: a 4xx with a message, and nothing changes.
    for (m, p, b, want) in [
        (
            "PUT",
            "/v1/devices/vda/rate-limit",
            "{\"bandwidth\": \"fast\"}",
            400,
        ),
        ("PUT", "/v1/devices/vda/rate-limit", "{\"bw\": 1}", 400),
        ("PUT", "/v1/devices/vda/rate-limit", "not json", 400),
        ("PUT", "/v1/devices/vdq/rate-limit", "{\"iops\": 1}", 404),
        ("PUT", "/v1/devices/rng0/rate-limit", "{\"iops\": 1}", 409),
        ("DELETE", "/v1/domain", "", 405),
        ("GET", "/v1/balloon", "", 404),
        ("GET", "/nope", "", 404),
    ] {
        // Sent as written: these bodies are what the types refuse.
        let (status, text) =
            domus_http::request(&sock, m, p, (!b.is_empty()).then_some(b)).unwrap();
        assert_eq!(status, want, "{m} {p} {b}: {text}");
        let e: domus_api::ErrorBody = serde_json::from_str(&text).unwrap();
        assert!(!e.error.is_empty(), "{text}");
    }
    let d = vmm.device("vda").unwrap();
    assert_eq!(
        limit(&d).bandwidth,
        Some(64 << 20),
        "changed by a bad request"
    );
    let update = RateLimitUpdate {
        bandwidth: Some(None),
        iops: Some(Some(500)),
    };
    let d = vmm.set_rate_limit("vda", &update).unwrap();
    let want = RateLimit {
        bandwidth: None,
        iops: Some(500),
    };
    assert_eq!(limit(&d), want);
    let ids: Vec<String> = vmm.devices().unwrap().into_iter().map(|d| d.id).collect();
    assert_eq!(ids, ["vda", "vsock0", "rng0"]);
    // The server serves the committed OpenAPI document.
    let (s, doc) = api(&sock, "GET", "/openapi.json", None);
    assert_eq!(s, 200);
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../../../api/domain.openapi.json")).unwrap();
    assert_eq!(doc, committed);
    assert_clean_poweroff(&vm.finish());
    assert!(!sock.exists(), "the API socket outlived the domain");
    let _ = std::fs::remove_dir_all(dir);
}
