//! Guest memory: prefaulted at start, and given back through the balloon.

use crate::*;
use domus_api::client::VmmClient;

/// The VMM's resident memory in KiB; the VMM must still be running.
fn vm_rss_kib(pid: u64) -> u64 {
    domus_daemon::rss_bytes(pid as i64).expect("the VMM's VmRSS") >> 10
}

/// `--prefault` commits all guest memory before the guest runs (a 256 MiB
/// guest that touches little holds 256 MiB), and says so when the kernel
/// cannot build KVM's page tables ahead (KVM_PRE_FAULT_MEMORY, Linux 6.10).
#[test]
fn prefault_commits_guest_memory_at_start() {
    let dir = scratch("prefault");
    let sock = dir.join("api.sock");
    let vm = TestVm::new("echo phase=up; sleep 5")
        .args(["--prefault"])
        .api_socket(&sock);
    let mut rss_mib = 0;
    let r = vm.run_watching(|line| {
        if line == "phase=up" {
            let pid = VmmClient::new(&sock).domain().unwrap().pid;
            rss_mib = vm_rss_kib(pid.into()) >> 10;
        }
    });
    assert_clean_poweroff(&r);
    assert!(rss_mib >= 256, "{rss_mib} MiB resident after --prefault");
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let tables = (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 10);
    assert_eq!(
        !r.stderr.contains("cannot prefault its page tables"),
        tables,
        "kernel {release}: {}",
        r.stderr
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn balloon_returns_freed_memory_and_inflates_to_a_target() {
    let dir = scratch("balloon");
    let sock = dir.join("api.sock");
    // Fill 200 MiB of tmpfs, free it, then wait while the host checks.
    let cmd = "mount -t tmpfs -o size=300m none /mnt; dd if=/dev/zero of=/mnt/f bs=1M count=200 2>/dev/null; echo phase=filled; sleep 2; rm /mnt/f; echo phase=freed; sleep 40; echo memtotal=$(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2)";
    let vm = TestVm::new(cmd)
        .memory("512M")
        .args(["--balloon"])
        .api_socket(&sock);
    let (mut filled_rss, mut lowest_rss, mut pid) = (0, u64::MAX, 0);
    let mut inflated = None;
    let vmm = VmmClient::new(&sock);
    let r = vm.run_watching(|line| match line {
        "phase=filled" => {
            pid = vmm.domain().unwrap().pid.into();
            filled_rss = vm_rss_kib(pid);
        }
        "phase=freed" => {
            // Free page reporting runs about 2 s after pages are freed.
            let end = Instant::now() + Duration::from_secs(12);
            while Instant::now() < end && filled_rss.saturating_sub(lowest_rss) < 150 << 10 {
                std::thread::sleep(Duration::from_millis(250));
                lowest_rss = lowest_rss.min(vm_rss_kib(pid));
            }
            let b = vmm.balloon().unwrap();
            assert!(b.reported_bytes >= 150 << 20, "{b:?}");
            let total = b.statistics.get("total_memory").copied().unwrap_or(0);
            assert!(total > 256 << 20, "{b:?}");
            // Inflate: the guest keeps 384 MiB of its 512.
            assert_eq!(vmm.set_balloon(384).unwrap().target_mib, 384);
            let e = vmm.set_balloon(4096).unwrap_err();
            assert_eq!(e.status(), Some(400), "{e}");
            // The guest gives up 128 MiB a page-frame batch at a time; in
            // the nested test host that has taken over 10 s.
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                let b = vmm.balloon().unwrap();
                if b.balloon_actual_mib == 128 {
                    inflated = Some(b);
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        _ => {}
    });
    assert_clean_poweroff(&r);
    assert!(filled_rss > 0, "{r}");
    let dropped = filled_rss.saturating_sub(lowest_rss) >> 10;
    assert!(
        dropped >= 150,
        "RSS went from {} MiB to {} MiB: only {dropped} MiB back",
        filled_rss >> 10,
        lowest_rss >> 10
    );
    let b = inflated.expect("the balloon did not reach 128 MiB in 20 s");
    assert_eq!(b.actual_mib, 384, "{b:?}");
    // The guest's memory shrank by the balloon (no deflate-on-OOM).
    assert!(value(&r, "memtotal") < 400 << 10, "{r}");
    let _ = std::fs::remove_dir_all(dir);
}
