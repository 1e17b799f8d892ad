"""bench/paper's `xzmem` experiment (run.py; a diagnostic, run only when
--only names it): what could make Figure 3's xz row slower under Domus
than under QEMU and Cloud Hypervisor, as its record has it.

Each of QEMU's five xz trials beat each of Domus's (RUNS.md), while KVM
in the nested host counted the same exits per second for both, Domus's
guest memory all at 2 MiB there, and a kit guest chose the same CPU
flags, mitigations, clock and THP mode under both. What that leaves is
inside the guest at run time and in the nested host around it. xz -9 is
the one Figure 3 row that allocates and walks hundreds of MiB (its match
finder), so each trial here runs Figure 3's xz command while it reads:

- in the environment: xz's own peak RSS and transparent huge pages
  (/proc/PID/smaps_rollup, sampled every 0.25 s), its minor faults
  (/proc/PID/stat), and the kernel's thp_fault_alloc and
  thp_fault_fallback during the run (/proc/vmstat);
- in the nested host: where its CPUs' time went meanwhile (/proc/stat:
  time in guest mode, host user and kernel time, idle), so that work the
  VMM or its host does beside the guest shows;
- KVM's counters for the guest's VM (kvmstat), as Figure 3 keeps them.

Once per environment it also logs (not in the record) what the guest's
kernel said about KVM's paravirtual features, its cpuidle driver, its THP
settings and its free memory by order (/proc/buddyinfo).
"""
import os
import time

import cpuuse
import kvmstat
import workloads
from envs import say

# Figure 3's xz, timed the same way, with xz's memory watched beside it.
PROBE = r"""#!/bin/bash
# bench/paper xzmem: Figure 3's xz -9, with its memory watched.
vm() { awk '/^thp_fault_alloc /{a=$2} /^thp_fault_fallback /{f=$2} END{print a+0, f+0}' /proc/vmstat; }
read -r a0 f0 < <(vm)
t0=$(date +%s%N)
xz -9 -T1 -c xz.in > /dev/null &
p=$!
rss=0 ahp=0 flt=0
# xz's state in /proc/PID/stat (its name has no spaces): gone or a zombie, done.
alive() { local s; s=$(awk '{print $3}' /proc/$p/stat 2>/dev/null); [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]; }
while alive; do
    read -r r h < <(awk '/^Rss:/{r=$2} /^AnonHugePages:/{h=$2} END{print r+0, h+0}' /proc/$p/smaps_rollup 2>/dev/null)
    f=$(awk '{print $10}' /proc/$p/stat 2>/dev/null)
    [ "${r:-0}" -gt "$rss" ] && rss=$r
    [ "${h:-0}" -gt "$ahp" ] && ahp=$h
    [ "${f:-0}" -gt "$flt" ] && flt=$f
    sleep 0.25
done
wait $p
t1=$(date +%s%N)
read -r a1 f1 < <(vm)
echo "value=$(( (t1 - t0) / 1000000 ))e-3 rss_mib=$(( rss / 1024 )) thp_mib=$(( ahp / 1024 ))" \
     "minflt=$flt thp_alloc=$(( a1 - a0 )) thp_fallback=$(( f1 - f0 ))"
"""

FACTS = ("s=; [ \"$(id -u)\" = 0 ] || s='sudo -n'; "
         "{ $s dmesg | grep -iE 'kvm-guest|kvm-clock|haltpoll|steal|pv_|paravirt|hypervisor' | sed 's/^\\[[ 0-9.]*\\] //'; "
         "echo cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null); "
         "echo thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled) "
         "defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag); "
         "grep -E 'MemFree|AnonHugePages' /proc/meminfo; cat /proc/buddyinfo; } 2>&1 | head -n 40")

# The record's keys, their labels in results.md, and the format of each.
COLUMNS = [("xz", "xz -9 (s)", 2), ("rss_mib", "xz's peak RSS (MiB)", 0),
           ("thp_mib", "of it in THPs (MiB)", 0), ("minflt", "xz's minor faults", 0),
           ("thp_alloc", "THPs allocated", 0), ("thp_fallback", "THP fallbacks", 0),
           ("host.guest", "nested host: guest mode (CPU s)", 1),
           ("host.user", "host user (CPU s)", 1), ("host.kernel", "host kernel (CPU s)", 1),
           ("kvm.xz.exits", "KVM exits", 0)]


def host_cpu():
    """The nested host's CPU times so far (cpuuse.host_times: guest, user
    without guest, kernel, idle), as the record keeps them."""
    with open("/proc/stat") as f:
        t = cpuuse.host_times(f.readline())
    return {k: t[k] for k in ("guest", "user", "kernel", "idle")}


def experiment(environments, run, running):
    """Trials of the probe in each environment, as run.trials runs them
    (the order turning each trial, the others paused)."""
    prep, _ = workloads.fig3_commands(2, run.quick)["xz"]
    probe = os.path.join(run.work, "xzprobe.sh")
    with open(probe, "w") as f:
        f.write(PROBE)
    for e in environments:
        with running(e):
            e.put(probe, "xzprobe.sh")
            e.sh(prep, 600)
            say(f"xzmem: {e.name}: what its kernel says:\n" + e.sh(FACTS, 120))
    watch = kvmstat.available()

    def one(e):
        before, h0 = (kvmstat.snapshot() if watch else {}), host_cpu()
        t0 = time.monotonic()
        out = e.sh("bash xzprobe.sh", 1800)
        secs, h1 = time.monotonic() - t0, host_cpu()
        vals = workloads.parse(out)
        vals["xz"] = workloads.value(out, f"{e.name}: the xz probe")
        vals.pop("value")
        vals.update({f"host.{k}": h1[k] - h0[k] for k in h0})
        if watch:
            vals.update(kvmstat.flat("xz", kvmstat.moved(before, kvmstat.snapshot()), secs))
        return vals

    return run.trials("xzmem", environments, one)


def table(exp, envs_order, short, median):
    """results.md's lines for an xzmem record: one row per environment,
    the medians of its trials."""
    runs = exp["runs"]
    names = [e for e in envs_order if runs.get(e)]
    n = min(len(runs[e]) for e in names) if names else 0
    lines = ["## Diagnostic: xz -9's memory (`xzmem`)", "",
             f"What could make Figure 3's xz row slower under Domus than under QEMU and CH ({n} trial(s) "
             "each; medians). Figure 3's xz command, with xz's own memory read every 0.25 s in "
             "the environment (so its times include the sampling, the same in each), the "
             "kernel's THP counters around it, and the nested host's CPU time meanwhile "
             "(bench/paper/xzmem.py; RUNS.md reads it).", "",
             "| environment | " + " | ".join(label for _, label, _ in COLUMNS) + " |",
             "| --- | " + " | ".join("---:" for _ in COLUMNS) + " |"]
    rows = {}
    for e in names:
        med = {k: median(runs[e], k) for k, _, _ in COLUMNS}
        rows[e] = med
        lines.append(f"| {short[e]} | " + " | ".join(
            "n/a" if med[k] is None else f"{med[k]:.{p}f}" for k, _, p in COLUMNS) + " |")
    return rows, lines + [""]
