//! Booting: kernels in both formats, vCPUs and memory as asked, and how a
//! domain ends (power-off, reboot, panic, triple fault) in its exit status.

use crate::*;

#[test]
fn bzimage_guest_sees_1_2_and_4_vcpus() {
    for n in [1, 2, 4] {
        let r = TestVm::new("echo cpus=$(nproc)").vcpus(n).run();
        assert_clean_poweroff(&r);
        assert_eq!(value(&r, "cpus"), u64::from(n));
    }
}

#[test]
fn elf_vmlinux_boots_with_smp() {
    let k = kit();
    let r = TestVm::new("echo cpus=$(nproc)")
        .kernel(k.vmlinux)
        .vcpus(2)
        .run();
    assert_clean_poweroff(&r);
    assert_eq!(value(&r, "cpus"), 2);
}

/// The RAM the guest kernel found (the total of "Memory: availK/totalK
/// available", which counts every page of the firmware memory map) and MemTotal.
const MEM_CMD: &str = "dmesg | grep Memory: ; grep MemTotal /proc/meminfo";

fn kib_after(run: &Run, marker: &str, before: &str) -> u64 {
    run.stdout
        .lines()
        .find_map(|l| {
            let rest = &l[l.find(marker)? + marker.len()..];
            rest[..rest.find(before)?].trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no '{marker}' in guest output:\n{}", run.stdout))
}

#[test]
fn guest_sees_the_memory_asked_for() {
    for (arg, bytes) in [
        ("256M", 256u64 << 20),
        ("1G", 1 << 30),
        ("3584", 3584 << 20),
    ] {
        let r = TestVm::new(MEM_CMD).memory(arg).run();
        assert_clean_poweroff(&r);
        let ram = kib_after(&r, "K/", "K available") << 10;
        let diff = (ram as f64 - bytes as f64).abs() / bytes as f64;
        assert!(
            diff < 0.05,
            "{arg}: guest sees {ram} bytes of RAM ({:.1}% off)",
            diff * 100.0
        );
        // MemTotal is what is left after the kernel's own reservations.
        let total = kib_after(&r, "MemTotal:", "kB") << 10;
        assert!(
            total < bytes && total > bytes / 2,
            "{arg}: MemTotal {total}"
        );
    }
}

#[test]
fn poweroff_exits_0_within_a_second() {
    let r = TestVm::new("true").run();
    assert_clean_poweroff(&r);
    assert!(
        r.tail < Duration::from_secs(1),
        "took {:?} after the guest's last line",
        r.tail
    );
}

#[test]
fn reboot_exits_3() {
    let r = TestVm::new("echo rebooting; reboot -f").run();
    assert!(r.stdout.contains("rebooting"), "{r}");
    assert_eq!(r.code, 3, "{r}");
}

#[test]
fn panic_exits_4() {
    let r = TestVm::new("echo c > /proc/sysrq-trigger").run();
    assert_eq!(r.code, 4, "{r}");
    assert!(r.stdout.contains("Kernel panic"), "{r}");
    assert!(r.stderr.contains("guest crashed"), "{}", r.stderr);
}

#[test]
fn two_domains_side_by_side() {
    let a = std::thread::spawn(|| TestVm::new("sleep 1; echo who=1").vcpus(2).run());
    let b = std::thread::spawn(|| TestVm::new("sleep 1; echo who=2").memory("384M").run());
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_clean_poweroff(&a);
    assert_clean_poweroff(&b);
    assert_eq!(value(&a, "who"), 1);
    assert_eq!(value(&b, "who"), 2);
    assert!(!a.stdout.contains("who=2") && !b.stdout.contains("who=1"));
}

#[test]
fn guest_exit_status_is_reported() {
    let r = TestVm::new("exit 7").run();
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("domus-init: exit status 7"), "{r}");
}

#[test]
fn kvm_paravirtual_features_are_exposed() {
    let r = TestVm::new("dmesg | grep -c -e kvm-clock -e 'PV spinlocks' | sed s/^/pvlines=/; echo clocksource=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)").vcpus(2).run();
    assert_clean_poweroff(&r);
    assert!(r.stdout.contains("clocksource=kvm-clock"), "{r}");
    assert!(value(&r, "pvlines") >= 2, "{r}");
}
