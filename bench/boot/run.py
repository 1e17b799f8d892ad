#!/usr/bin/env python3
"""bench/boot: time to the guest's init and VMM memory overhead, Domus vs QEMU.

Boots the kit's kernel and initramfs with the same memory and vCPUs under
`domus run --seccomp` (as the daemon runs VMMs with --no-jail), `domus run
--seccomp --jail` (as the daemon runs them by default), QEMU `-M microvm` and
QEMU `-M pc` (all `-accel kvm`), N runs each, interleaved, in one session on
one host. For each run:

  * boot_ms: from process start to the guest init's first line on the serial
    console ("domus-init: start");
  * overhead_kib: the VMM's RSS minus the RSS of the guest RAM mapping (the
    anonymous mapping the size of guest memory), from /proc/PID/smaps, read
    right after that line. Jailed, the VMM is the child `domus run --jail`
    starts in new namespaces (the daemon starts it directly); that one is
    measured.

Run it with tools/bench-boot (which builds, makes the kit and goes through
tools/kvm-host). Writes results.json and results.md next to this file.
"""
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MARKER = b"domus-init: start"
RUNS = int(os.environ.get("RUNS", "5"))
MEMORY_MIB = int(os.environ.get("MEMORY_MIB", "256"))
VCPUS = int(os.environ.get("VCPUS", "1"))
CMDLINE = "console=ttyS0 quiet panic=-1 -- true"


def kit():
    out = subprocess.run([os.path.join(REPO, "target/release/domus"), "kit", "--print"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def commands(k):
    qemu = [os.environ.get("KVM_HOST_QEMU", "qemu-system-x86_64"), "-accel", "kvm", "-cpu", "host", "-m", str(MEMORY_MIB),
            "-smp", str(VCPUS), "-nodefaults", "-no-user-config", "-display", "none",
            "-serial", "stdio", "-no-reboot", "-kernel", k["kernel"], "-initrd", k["initrd"],
            "-append", CMDLINE]
    domus = [os.path.join(REPO, "target/release/domus"), "run", "--seccomp", "--kernel", k["kernel"],
             "--initrd", k["initrd"], "--memory", f"{MEMORY_MIB}M", "--vcpus", str(VCPUS),
             "--cmdline", CMDLINE]
    return {
        "domus": domus,
        "domus-jail": domus[:2] + ["--jail", "4000100"] + domus[2:],
        "qemu-microvm": qemu[:1] + ["-M", "microvm"] + qemu[1:],
        "qemu-pc": qemu[:1] + ["-M", "pc"] + qemu[1:],
    }


def smaps_overhead_kib(pid, guest_bytes):
    """VMM RSS minus the RSS of the guest RAM mapping(s)."""
    total = guest = 0
    size = rss = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                if size and size * 1024 >= guest_bytes * 0.9 and size * 1024 <= guest_bytes:
                    guest += rss
                size = rss = 0
            elif line.startswith("Size:"):
                size = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
                total += rss
    if size and size * 1024 >= guest_bytes * 0.9 and size * 1024 <= guest_bytes:
        guest += rss
    return total - guest, guest


def vmm_pid(pid, jailed):
    """The VMM's pid: `domus run --jail`'s child, else the process itself."""
    if not jailed:
        return pid
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return int(f.read().split()[0])


def one_run(cmd):
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    buf = b""
    boot_ms = overhead = guest_rss = None
    while True:
        chunk = p.stdout.read1(4096)
        if not chunk:
            break
        buf += chunk
        if boot_ms is None and MARKER in buf:
            boot_ms = (time.monotonic() - start) * 1000
            overhead, guest_rss = smaps_overhead_kib(vmm_pid(p.pid, "--jail" in cmd), MEMORY_MIB << 20)
    code = p.wait()
    if boot_ms is None or code != 0:
        raise SystemExit(f"bench: {cmd[0]} failed (exit {code}); output:\n{buf.decode(errors='replace')[-2000:]}")
    return {"boot_ms": round(boot_ms, 1), "overhead_kib": overhead, "guest_rss_kib": guest_rss}


def main():
    k = kit()
    cmds = commands(k)
    if not shutil.which("qemu-system-x86_64"):
        raise SystemExit("bench: qemu-system-x86_64 not found (tools/setup installs it)")
    results = {name: [] for name in cmds}
    for i in range(RUNS):
        for name, cmd in cmds.items():
            r = one_run(cmd)
            results[name].append(r)
            print(f"run {i + 1}/{RUNS} {name:13} boot {r['boot_ms']:8.1f} ms  overhead {r['overhead_kib'] / 1024:6.1f} MiB",
                  file=sys.stderr)
    med = {n: {"boot_ms": statistics.median(x["boot_ms"] for x in rs),
               "overhead_mib": round(statistics.median(x["overhead_kib"] for x in rs) / 1024, 2)}
           for n, rs in results.items()}
    d = med["domus"]["boot_ms"]
    ratios = {f"domus/{n}": round(d / m["boot_ms"], 3) for n, m in med.items() if n != "domus"}
    with open("/proc/cpuinfo") as f:
        cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "unknown")
    nested = os.path.exists("/sys/module/kvm_amd") and not os.path.exists("/dev/kvm.host-real")
    doc = {
        "benchmark": "bench/boot",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": os.environ.get("BENCH_COMMAND", "tools/bench-boot"),
        "machine": {
            "cpu": cpu,
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "where": os.environ.get("KVM_HOST_WHERE", "unknown"),
        },
        "guest": {"kernel": k["kernel"], "initrd": k["initrd"], "memory_mib": MEMORY_MIB,
                  "vcpus": VCPUS, "cmdline": CMDLINE},
        "runs": RUNS,
        "medians": med,
        "ratios_boot_time": ratios,
        "raw": results,
    }
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    lines = [
        "# bench/boot results",
        "",
        f"- date: {doc['date']}",
        f"- command: `{doc['command']}`",
        f"- machine: {cpu}, {os.cpu_count()} CPUs, kernel {platform.release()} ({doc['machine']['where']})",
        f"- guest: kit kernel (bzImage) + initramfs, {MEMORY_MIB} MiB, {VCPUS} vCPU, `{CMDLINE}`",
        f"- {RUNS} runs each, interleaved; medians",
        "",
        "| VMM | time to init's first line (ms) | Domus / this | VMM overhead (MiB) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for n, m in med.items():
        ratio = "1.000" if n == "domus" else f"{ratios[f'domus/{n}']:.3f}"
        lines.append(f"| {n} | {m['boot_ms']:.1f} | {ratio} | {m['overhead_mib']:.2f} |")
    j = med.get("domus-jail")
    if j:
        lines += ["", f"The jail's cost: domus-jail / domus boot time {j['boot_ms'] / d:.3f}, "
                  f"overhead {j['overhead_mib']:.2f} vs {med['domus']['overhead_mib']:.2f} MiB "
                  "(both with the seccomp filter; the jailed VMM measured, not the `domus run --jail` "
                  "process that waits for it)."]
    lines += ["", "Overhead: VMM RSS minus the RSS of the guest RAM mapping, from /proc/PID/smaps,",
              "read when the guest's init prints its first line. Absolute times on a nested host",
              "are noise; compare the ratios.", ""]
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
