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
    let vm = TestVm::agent()
        .args(["--prefault"])
        .api_socket(&sock)
        .start();
    let pid = VmmClient::new(&sock).domain().unwrap().pid;
    let rss_mib = vm_rss_kib(pid.into()) >> 10;
    let r = vm.finish();
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
    let mut vm = TestVm::agent()
        .memory("512M")
        .args(["--balloon", "--balloon-target", "480M"])
        .api_socket(&sock)
        .start();
    let vmm = VmmClient::new(&sock);
    let pid = u64::from(vmm.domain().unwrap().pid);
    // It started ballooned down to 480 MiB: the balloon held 32 MiB
    // before the guest's driver first looked.
    let b = vmm.balloon().unwrap();
    assert_eq!((b.target_mib, b.balloon_target_mib), (480, 32), "{b:?}");

    // 200 MiB of tmpfs filled and freed: free page reporting (about 2 s
    // after the pages are freed) gives it back to the host.
    vm.sh("mount -t tmpfs -o size=300m none /mnt; dd if=/dev/zero of=/mnt/f bs=1M count=200");
    let filled_rss = vm_rss_kib(pid);
    vm.sh("rm /mnt/f");
    let mut lowest_rss = u64::MAX;
    let took = wait_balloon(|| {
        lowest_rss = lowest_rss.min(vm_rss_kib(pid));
        150_u64.saturating_sub(filled_rss.saturating_sub(lowest_rss) >> 10)
    });
    let dropped = filled_rss.saturating_sub(lowest_rss) >> 10;
    assert!(
        dropped >= 150,
        "RSS went from {} MiB to {} MiB: only {dropped} MiB back ({took:?})",
        filled_rss >> 10,
        lowest_rss >> 10
    );
    let b = vmm.balloon().unwrap();
    assert!(b.reported_bytes >= 150 << 20, "{b:?}");
    let total = b.statistics.get("total_memory").copied().unwrap_or(0);
    assert!(total > 256 << 20, "{b:?}");

    // Inflate: the guest keeps 384 MiB of its 512; more than it has is
    // refused.
    assert_eq!(vmm.set_balloon(384).unwrap().target_mib, 384);
    let e = vmm.set_balloon(4096).unwrap_err();
    assert_eq!(e.status(), Some(400), "{e}");
    // The guest gives up 128 MiB a page-frame batch at a time.
    let took = wait_balloon(|| vmm.balloon().unwrap().balloon_actual_mib.abs_diff(128));
    let b = vmm.balloon().unwrap();
    assert!(took.is_ok(), "{took:?}: {b:?}");
    assert_eq!((b.balloon_actual_mib, b.actual_mib), (128, 384), "{b:?}");
    // The guest's memory shrank by the balloon (no deflate-on-OOM).
    let memtotal_kib: u64 = vm
        .sh("grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2")
        .parse()
        .unwrap();
    assert!(memtotal_kib < 400 << 10, "MemTotal {memtotal_kib} KiB");
    assert_clean_poweroff(&vm.finish());
    let _ = std::fs::remove_dir_all(dir);
}
