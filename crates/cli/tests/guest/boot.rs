//! Booting: kernels in both formats, vCPUs and memory as asked, and how a
//! domain ends (power-off, reboot, panic, triple fault) in its exit status.

use crate::*;

#[test]
fn bzimage_guest_sees_1_2_and_4_vcpus() {
    for n in [1, 2, 4] {
        let mut vm = TestVm::agent().vcpus(n).start();
        assert_eq!(vm.sh("nproc"), n.to_string());
        assert_clean_poweroff(&vm.finish());
    }
}

/// The first "model name" of a /proc/cpuinfo.
fn model_name(cpuinfo: &str) -> Option<&str> {
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, name)| name.trim())
}

#[test]
fn elf_vmlinux_boots_with_smp() {
    let mut vm = TestVm::agent().kernel(kit().vmlinux).vcpus(2).start();
    assert_eq!(vm.sh("nproc"), "2");
    // The guest calls its CPU by the host's name (KVM leaves the brand
    // leaves blank, which Linux shows as the family and model, "06/06").
    let host = std::fs::read_to_string("/proc/cpuinfo").expect("the host's /proc/cpuinfo");
    let guest = vm.sh("cat /proc/cpuinfo");
    assert_eq!(model_name(&guest), model_name(&host), "guest:\n{guest}");
    assert_clean_poweroff(&vm.finish());
}

/// The flags of the first CPU in a /proc/cpuinfo.
fn cpu_flags(cpuinfo: &str) -> Vec<&str> {
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags")?.split_once(':'))
        .map(|(_, f)| f.split_whitespace().collect())
        .unwrap_or_default()
}

/// `--cpuid` (xl's `cpuid = [...]`) forces bits of what the guest's CPUs
/// report: with SSE3 (leaf 1, ECX bit 0) cleared the guest's flags lack
/// `pni`, which the host's have; a rule for a leaf KVM does not offer is
/// refused before the guest runs.
#[test]
fn cpuid_rules_reach_the_guest() {
    let host = std::fs::read_to_string("/proc/cpuinfo").expect("the host's /proc/cpuinfo");
    assert!(cpu_flags(&host).contains(&"pni"), "host flags: {host}");
    let mut vm = TestVm::agent()
        .args(["--cpuid", "1:ecx=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx0"])
        .start();
    let guest = vm.sh("cat /proc/cpuinfo");
    let flags = cpu_flags(&guest);
    assert!(
        flags.contains(&"sse2") && !flags.contains(&"pni"),
        "guest:\n{guest}"
    );
    assert_clean_poweroff(&vm.finish());

    let run = TestVm::new("true")
        .args(["--cpuid", "0x4ffffff0:eax=0xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"])
        .run();
    assert_eq!(run.code, 2, "{run}");
    assert!(
        run.stderr.contains("cpuid rule 0x4ffffff0:eax=0xxx")
            && run.stderr.contains("no such leaf"),
        "{run}"
    );
}

/// The number in `text` between `marker` and `before`.
fn number_after(text: &str, marker: &str, before: &str) -> u64 {
    text.lines()
        .find_map(|l| {
            let rest = &l[l.find(marker)? + marker.len()..];
            rest[..rest.find(before)?].trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no '{marker}' in:\n{text}"))
}

#[test]
fn guest_sees_the_memory_asked_for() {
    for (arg, bytes) in [
        ("256M", 256u64 << 20),
        ("1G", 1 << 30),
        ("3584", 3584 << 20),
    ] {
        let mut vm = TestVm::agent().memory(arg).start();
        // The RAM the guest kernel found (the total of "Memory:
        // availK/totalK available", which counts every page of the
        // firmware memory map) and MemTotal, what is left after the
        // kernel's own reservations.
        let ram = number_after(&vm.sh("dmesg | grep Memory:"), "K/", "K available") << 10;
        let total = number_after(&vm.sh("grep MemTotal /proc/meminfo"), "MemTotal:", "kB") << 10;
        assert_clean_poweroff(&vm.finish());
        let diff = (ram as f64 - bytes as f64).abs() / bytes as f64;
        assert!(
            diff < 0.05,
            "{arg}: guest sees {ram} bytes of RAM ({:.1}% off)",
            diff * 100.0
        );
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
    // Each answers for itself: a has 2 vCPUs, b 384 MiB.
    let a = std::thread::spawn(|| TestVm::agent().vcpus(2).start());
    let b = std::thread::spawn(|| TestVm::agent().memory("384M").start());
    let (mut a, mut b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((a.sh("nproc"), b.sh("nproc")), ("2".into(), "1".into()));
    let kib = |vm: &mut agent::Running| -> u64 {
        let t = vm.sh("grep MemTotal /proc/meminfo");
        number_after(&t, "MemTotal:", "kB")
    };
    let (ka, kb) = (kib(&mut a), kib(&mut b));
    assert!(
        ka < 256 << 10 && kb > 256 << 10 && kb < 384 << 10,
        "{ka} {kb}"
    );
    assert_clean_poweroff(&a.finish());
    assert_clean_poweroff(&b.finish());
}

#[test]
fn guest_exit_status_is_reported() {
    let r = TestVm::new("exit 7").run();
    assert_eq!(r.code, 0, "{r}");
    assert!(r.stdout.contains("domus-init: exit status 7"), "{r}");
}

#[test]
fn kvm_paravirtual_features_are_exposed() {
    let mut vm = TestVm::agent().vcpus(2).start();
    assert_eq!(
        vm.sh("cat /sys/devices/system/clocksource/clocksource0/current_clocksource"),
        "kvm-clock"
    );
    let pv = vm.run("dmesg | grep -e kvm-clock -e 'PV spinlocks'");
    assert!(pv.out().lines().count() >= 2, "{pv:?}");
    assert_clean_poweroff(&vm.finish());
}
