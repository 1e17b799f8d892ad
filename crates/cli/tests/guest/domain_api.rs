//! The domain's REST API: state, pause and resume, device counters, rate
//! limits changed at run time, and bad requests refused.

use crate::*;

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
    // Spin for 8 s of guest time, then write 4 MiB to the disk.
    let cmd = "echo phase=spin; end=$(( $(cut -d. -f1 /proc/uptime) + 8 )); while [ $(cut -d. -f1 /proc/uptime) -lt $end ]; do :; done; dd if=/dev/urandom of=/dev/vda bs=1M count=4 oflag=direct 2>/dev/null; echo phase=written; sleep 3";
    let vm = TestVm::new(cmd)
        .disk(format!("{},bw=64M", img.display()))
        .api_socket(&sock)
        .args(["--name", "api-test"]);
    let mut checked = Vec::new();
    let r = vm.run_watching(|line| match line {
        "phase=spin" => {
            let (s, info) = api(&sock, "GET", "/v1/domain", None);
            assert_eq!(s, 200, "{info}");
            assert_eq!(info["name"], "api-test");
            assert_eq!(info["state"], "running");
            assert_eq!(info["vcpus"], 1);
            assert_eq!(info["memory_mib"], 256);
            let pid = info["pid"].as_u64().unwrap();
            let tid = info["vcpu_tids"][0].as_u64().unwrap();
            let spent = |ms| {
                let a = thread_ticks(pid, tid);
                std::thread::sleep(Duration::from_millis(ms));
                thread_ticks(pid, tid) - a
            };
            assert!(spent(1000) >= 20, "the spinning vCPU used no CPU");
            let (s, v) = api(&sock, "PUT", "/v1/domain/pause", None);
            assert_eq!((s, v["state"].as_str()), (200, Some("paused")), "{v}");
            let paused = spent(1500);
            assert!(paused <= 2, "a paused vCPU used {paused} ticks");
            assert_eq!(api(&sock, "GET", "/v1/domain", None).1["state"], "paused");
            let (s, v) = api(&sock, "PUT", "/v1/domain/resume", None);
            assert_eq!((s, v["state"].as_str()), (200, Some("running")), "{v}");
            assert!(spent(1000) >= 20, "the resumed vCPU used no CPU");
            checked.push("pause");
        }
        "phase=written" => {
            let (s, d) = api(&sock, "GET", "/v1/devices/vda", None);
            assert_eq!(s, 200, "{d}");
            assert_eq!(d["type"], "block");
            assert!(
                d["counters"]["write_bytes"].as_u64().unwrap() >= 4 << 20,
                "{d}"
            );
            assert!(d["counters"]["write_ops"].as_u64().unwrap() >= 4, "{d}");
            assert_eq!(d["rate_limit"]["bandwidth"], 64 << 20);
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
                let (s, v) = api(&sock, m, p, (!b.is_empty()).then_some(b));
                assert_eq!(s, want, "{m} {p} {b}: {v}");
                assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
            }
            let (_, d) = api(&sock, "GET", "/v1/devices/vda", None);
            assert_eq!(
                d["rate_limit"]["bandwidth"],
                64 << 20,
                "changed by a bad request"
            );
            let (s, d) = api(
                &sock,
                "PUT",
                "/v1/devices/vda/rate-limit",
                Some("{\"bandwidth\": null, \"iops\": 500}"),
            );
            assert_eq!(s, 200, "{d}");
            assert_eq!(
                d["rate_limit"],
                serde_json::json!({"bandwidth": null, "iops": 500})
            );
            let (_, all) = api(&sock, "GET", "/v1/devices", None);
            let ids: Vec<&str> = all
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["id"].as_str().unwrap())
                .collect();
            assert_eq!(ids, ["vda", "rng0"]);
            // The server serves the committed OpenAPI document.
            let (s, doc) = api(&sock, "GET", "/openapi.json", None);
            assert_eq!(s, 200);
            let committed: serde_json::Value =
                serde_json::from_str(include_str!("../../../../api/domain.openapi.json")).unwrap();
            assert_eq!(doc, committed);
            checked.push("devices");
        }
        _ => {}
    });
    assert_clean_poweroff(&r);
    assert_eq!(checked, ["pause", "devices"], "{r}");
    assert!(!sock.exists(), "the API socket outlived the domain");
    let _ = std::fs::remove_dir_all(dir);
}
