"""What one of Figure 3's workloads costs in each environment: the
machinery of bench/paper's diagnostics `pgcost` (pgcost.py) and `webcost`
(webcost.py), which say why a row differs between the VMMs by counting
what the workload did rather than guessing.

Around each of the workload's commands (a row), a trial reads:

- in the environment (its /proc): its CPUs' time (user, system, irq and
  softirq, idle, iowait, steal), context switches, the interprocessor
  interrupts it sent (rescheduling, function call, TLB shootdown) and its
  local timer interrupts, its disks' writes and cache flushes with the
  time they took, its network interfaces' packets and bytes (loopback
  left out) and the interrupts of its virtio-net queues;
- in the nested host: where its CPUs' time went (guest mode, host user,
  host kernel, idle), the VMM process's own time (user and system, without
  its vCPUs' time in guest mode), by thread name, and the CPU time of the
  bench's own client processes (wrk for web; ssh for pg);
- KVM's counters for the guest's VM (kvmstat: exits, HLT exits,
  hypercalls, which carry paravirtual IPIs and yields, injections).

Once per environment it also logs (not in the record) what the guest's
kernel said about KVM's paravirtual features, its clock source, cpuidle
driver, CPU flags, topology, scheduler domains, and the virtio features
its drivers negotiated, so that a difference in what the VMM offered the
guest shows beside one in what the workload cost.
"""
import os
import re
import resource
import statistics
import time

import kvmstat
import workloads
from envs import say
from xzmem import host_cpu

# The environment's counters, one `name=value` per line, which
# workloads.parse reads (USER_HZ ticks for CPU times; sums over CPUs for
# interrupts, virtio-net's also by queue: input for receive, output for
# transmit; whole disks only; interfaces other than loopback).
AWK = [
    ("/proc/stat", r"""/^cpu / {print "user=" $2 + $3; print "sys=" $4; print "irq=" $7 + $8;
              print "idle=" $5; print "iowait=" $6; print "steal=" $9}
     /^ctxt / {print "ctxt=" $2}"""),
    ("/proc/interrupts", r"""function sum(  s, i) { s = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; return s }
     $1 == "RES:" {print "res=" sum()} $1 == "CAL:" {print "cal=" sum()}
     $1 == "TLB:" {print "tlb=" sum()} $1 == "LOC:" {print "loc=" sum()}
     $NF ~ /^virtio[0-9]+-input/ {rx += sum()} $NF ~ /^virtio[0-9]+-output/ {tx += sum()}
     END {print "netirq=" rx + tx; print "netirq_rx=" rx + 0; print "netirq_tx=" tx + 0}"""),
    ("/proc/diskstats", r"""$3 ~ /^(vd[a-z]+|sd[a-z]+|nvme[0-9]+n[0-9]+)$/ {w += $8; wms += $11; f += $19; fms += $20}
     END {print "writes=" w + 0; print "write_ms=" wms + 0; print "flushes=" f + 0; print "flush_ms=" fms + 0}"""),
    ("/proc/net/dev", r"""NR > 2 {sub(":", " "); if ($1 != "lo") {rb += $2; rp += $3; tb += $10; tp += $11}}
     END {print "rx_bytes=" rb + 0; print "rx_packets=" rp + 0; print "tx_bytes=" tb + 0; print "tx_packets=" tp + 0}"""),
]
SNAP = ("#!/bin/bash\n# bench/paper cost.py: this environment's CPU, interrupt, disk and network counters.\n"
        + "".join(f"awk '{prog}' {path}\n" for path, prog in AWK))

FACTS = ("s=; [ \"$(id -u)\" = 0 ] || s='sudo -n'; "
         "{ $s dmesg | grep -iE 'kvm-guest|kvm-clock|kvmclock|haltpoll|steal|pv_|paravirt|hypervisor|x2apic|tsc' "
         "| sed 's/^\\[[ 0-9.]*\\] //'; "
         "echo clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource); "
         "echo cpuidle: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null); "
         "grep -m4 -E '^(vendor_id|cpu family|model|model name)\\s' /proc/cpuinfo; "
         "grep -m1 '^flags' /proc/cpuinfo; "
         "grep -H . /sys/devices/system/cpu/cpu*/topology/core_cpus_list "
         "/sys/devices/system/cpu/cpu*/cache/index*/shared_cpu_list "
         "/sys/devices/system/cpu/cpu*/cache/index*/level; "
         "$s mount -t debugfs none /sys/kernel/debug 2>/dev/null; "
         "$s grep -H . /sys/kernel/debug/sched/domains/cpu*/domain*/name /sys/kernel/debug/sched/domains/cpu*/domain*/flags; "
         "} 2>&1 | head -n 100")

# What the guest's virtio drivers negotiated (a bit string per device,
# bit 0 first), its interfaces' MTUs and queues, and its virtio interrupts.
NET_FACTS = ("{ for d in /sys/bus/virtio/devices/*; do "
             "echo \"$(basename $d) device=$(cat $d/device) features=$(cat $d/features)\"; done; "
             "for n in /sys/class/net/*; do echo \"$(basename $n) mtu=$(cat $n/mtu) "
             "queues=$(ls $n/queues 2>/dev/null | tr '\\n' ' ')\"; done; "
             "grep -E 'virtio|CPU' /proc/interrupts; } 2>&1 | head -n 60")

USER_HZ = 100
# The snapshot's CPU times, in ticks.
TICKS = ("user", "sys", "irq", "idle", "iowait", "steal")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def derive(before, after, secs):
    """The row's environment values from two snapshots: counter
    differences, CPU times in seconds, and what the tables show."""
    d = {k: after[k] - before[k] for k in after if k in before}
    for k in TICKS:
        if k in d:
            d[k] /= USER_HZ
    busy = sum(d.get(k, 0) for k in ("user", "sys", "irq"))
    d["busy"] = busy / secs
    d["sys_share"] = (d.get("sys", 0) + d.get("irq", 0)) / busy if busy else 0.0
    d["iowait"] = d.get("iowait", 0) / secs
    d["flush_ms_each"] = d["flush_ms"] / d["flushes"] if d.get("flushes") else 0.0
    for way in ("tx", "rx"):
        packets = d.get(f"{way}_packets")
        d[f"{way}_bytes_each"] = d[f"{way}_bytes"] / packets if packets else 0.0
    return d


def _task_times(stat):
    """(name, user without guest mode (approximate), system, guest mode) in seconds from
    a /proc/PID[/task/TID]/stat line; None when it does not parse."""
    head, sep, rest = stat.rpartition(")")
    f = rest.split()
    if not sep or "(" not in head or len(f) < 41:
        return None
    try:
        utime, stime, guest = (int(f[i]) / CLK_TCK for i in (11, 12, 40))
    except ValueError:
        return None
    # Not clamped at zero: user time (scaled by the kernel to the thread's
    # exact run time) less guest time (counted in ticks) can fall below
    # zero, and user + system + guest must still add up to the thread's.
    return head.partition("(")[2], utime - guest, stime, guest


def group(name):
    """A thread's name with its numbers folded (`vcpu1` -> `vcpuN`, QEMU's
    `CPU 1/KVM` -> `CPU N/KVM`), so that threads doing one job add up."""
    return re.sub(r"[0-9]+", "N", name).strip() or "?"


def vmm_cpu(pid):
    """A VMM process's CPU time so far: `vmm.own`, `vmm.sys`, `vmm.guest`
    for the whole process (exited threads included), and
    `thread.GROUP.own`/`.sys`/`.guest` for its live threads by group();
    {} when there is no process (native) or it is gone."""
    if not pid:
        return {}
    try:
        with open(f"/proc/{pid}/stat") as f:
            whole = _task_times(f.read())
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    if whole is None:
        return {}
    vals = {"vmm.own": whole[1], "vmm.sys": whole[2], "vmm.guest": whole[3]}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                t = _task_times(f.read())
        except OSError:
            continue  # the thread ended meanwhile: its time is in the whole's
        if t is not None:
            for k, v in zip(("own", "sys", "guest"), t[1:]):
                name = f"thread.{group(t[0])}.{k}"
                vals[name] = vals.get(name, 0.0) + v
    return vals


def client_cpu():
    """CPU time so far of the bench's reaped child processes (user and
    system): a row's difference is its client's (wrk) or ssh's."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def moved(before, after):
    """Differences of two vmm_cpu() readings; threads that appeared during
    the row count from zero."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def experiment(name, environments, run, running, rows, prepare, command, cleanup=None, also=None):
    """Trials of `name` in each environment, as run.trials runs them (the
    order turning each trial, the others paused). `prepare(e)` readies an
    environment once; each trial runs `command(e, row)` (the row's score)
    for every row in `rows` with the counters read around it, then
    `also(e)` (more values for the trial, uncounted); `cleanup(e)` ends
    what prepare started."""
    snap = os.path.join(run.work, "costsnap.sh")
    with open(snap, "w") as f:
        f.write(SNAP)
    for e in environments:
        with running(e):
            e.put(snap, "costsnap.sh")
            prepare(e)
            say(f"{name}: {e.name}: what its kernel says:\n" + e.sh(FACTS, 120))
            say(f"{name}: {e.name}: its virtio devices and interfaces:\n" + e.sh(NET_FACTS, 120))
    watch = kvmstat.available()

    def one(e):
        vals = {}
        pid = e.vmm_pid()
        for key in rows:
            before, h0 = workloads.parse(e.sh("bash costsnap.sh", 60)), host_cpu()
            k0 = kvmstat.snapshot() if watch else {}
            v0, c0 = vmm_cpu(pid), client_cpu()
            t0 = time.monotonic()
            score = command(e, key)
            secs = time.monotonic() - t0
            c1, v1 = client_cpu(), vmm_cpu(pid)
            k1, h1 = (kvmstat.snapshot() if watch else {}), host_cpu()
            after = workloads.parse(e.sh("bash costsnap.sh", 60))
            row = derive(before, after, secs)
            row["tps"] = score
            row.update({f"host.{k}": h1[k] - h0[k] for k in h0})
            row.update(moved(v0, v1))
            row["client"] = c1 - c0
            row["wall_s"] = round(secs, 3)
            vals.update({f"{key}.{k}": v for k, v in row.items()})
            if watch:
                vals.update(kvmstat.flat(key, kvmstat.moved(k0, k1), secs))
        if also is not None:
            vals.update(also(e))
        return vals

    try:
        return run.trials(name, environments, one)
    finally:
        if cleanup is not None:
            for e in environments:
                with running(e):
                    cleanup(e)


def value(trial, row, key):
    """A column's value in one trial (`a+b` sums two; `kvm.NAME` is KVM's
    counter); None where the trial lacks one."""
    total = 0.0
    for part in key.split("+"):
        name = (kvmstat.key(row, part[len(kvmstat.PREFIX):]) if part.startswith(kvmstat.PREFIX)
                else f"{row}.{part}")
        if name not in trial:
            return None
        total += trial[name]
    return total


# How a column's value is scaled: as it is, per second of the row, or per
# unit of the row's score times its seconds (per request, per transaction),
# times a factor (1000 for milliseconds).
AS_IS, PER_S, PER_OP = "as is", "per s", "per op"


def scaled(trial, row, key, per, factor=1.0):
    v = value(trial, row, key)
    wall = trial.get(f"{row}.wall_s")
    if v is None or (per != AS_IS and not wall):
        return None
    if per == PER_S:
        return v / wall * factor
    if per == PER_OP:
        ops = (trial.get(f"{row}.tps") or 0) * wall
        return v / ops * factor if ops else None
    return v * factor


def tables(exp, rows, groups, envs_order, short):
    """For each (title, columns) in `groups`, a table with one line per
    row of `rows` ({key: (label, ...)}) and environment, medians of the
    trials; columns are (key, label, per, decimals[, factor]). Returns
    ({row: {env: {key: median}}}, lines)."""
    runs = exp["runs"]
    names = [e for e in envs_order if runs.get(e)]
    out, lines = {}, []
    for title, cols in groups:
        lines += [f"In {title}:", "",
                  "| row | environment | " + " | ".join(c[1] for c in cols) + " |",
                  "| --- | --- | " + " | ".join("---:" for _ in cols) + " |"]
        for row, (label, *_) in rows.items():
            for e in names:
                cells = []
                for key, _, per, p, *factor in cols:
                    xs = [x for x in (scaled(t, row, key, per, *factor) for t in runs[e]) if x is not None]
                    med = statistics.median(xs) if xs else None
                    out.setdefault(row, {}).setdefault(e, {})[key] = med
                    cells.append("n/a" if med is None else f"{med:.{p}f}")
                lines.append(f"| {label} | {short[e]} | " + " | ".join(cells) + " |")
        lines.append("")
    return out, lines


def guest_and_host_tables(exp, rows, guest_columns, host_columns, envs_order, short):
    """A diagnostic's two tables (see tables): the environment's own
    counters, then the nested host's and KVM's."""
    return tables(exp, rows, (("the environment", guest_columns), ("the nested host and KVM", host_columns)),
                  envs_order, short)


def trial_count(exp, envs_order):
    runs = exp["runs"]
    names = [e for e in envs_order if runs.get(e)]
    return min(len(runs[e]) for e in names) if names else 0


def _test():
    before = workloads.parse("user=100\nsys=50\nirq=10\nidle=0\niowait=20\nsteal=0\nctxt=5\n"
                             "flushes=2\nflush_ms=4\nnot a line\nbad=x")
    after = workloads.parse("user=300\nsys=110\nirq=20\nidle=100\niowait=40\nsteal=0\nctxt=105\n"
                            "flushes=6\nflush_ms=12")
    d = derive(before, after, 2.0)
    assert d["busy"] == 1.35 and abs(d["sys_share"] - 70 / 270) < 1e-9, d
    assert d["iowait"] == 0.1 and d["flush_ms_each"] == 2.0 and d["ctxt"] == 100, d
    assert d["tx_bytes_each"] == 0.0, d
    d = derive({"tx_bytes": 0, "tx_packets": 0}, {"tx_bytes": 3000, "tx_packets": 2}, 1.0)
    assert d["tx_bytes_each"] == 1500.0 and d["rx_bytes_each"] == 0.0, d
    trial = {"pg_ro.ctxt": 100.0, "pg_ro.wall_s": 2.0, "pg_ro.tps": 50.0, "kvm.pg_ro.io_exits": 3.0,
             "kvm.pg_ro.mmio_exits": 4.0}
    assert value(trial, "pg_ro", "ctxt") == 100.0
    assert value(trial, "pg_ro", "kvm.io_exits+kvm.mmio_exits") == 7.0
    assert value(trial, "pg_ro", "kvm.exits") is None
    assert scaled(trial, "pg_ro", "ctxt", PER_S) == 50.0
    assert scaled(trial, "pg_ro", "ctxt", PER_OP) == 1.0
    assert scaled(trial, "pg_ro", "ctxt", PER_OP, 1000) == 1000.0
    assert scaled(trial, "pg_ro", "kvm.exits", PER_S) is None
    # A thread name with spaces and parentheses (QEMU's vCPU threads).
    stat = "42 (CPU 1/KVM) S " + " ".join(["0"] * 10) + f" {5 * CLK_TCK} {2 * CLK_TCK} " \
        + " ".join(["0"] * 27) + f" {3 * CLK_TCK} 0"
    assert _task_times(stat) == ("CPU 1/KVM", 2.0, 2.0, 3.0), _task_times(stat)
    assert _task_times("garbage") is None and _task_times("1 (x) S 1 2") is None
    assert group("CPU 1/KVM") == "CPU N/KVM" and group("vcpu12") == "vcpuN" and group("") == "?"
    assert vmm_cpu(None) == {} and vmm_cpu(2 ** 22 + 7) == {}
    me = vmm_cpu(os.getpid())
    assert {"vmm.own", "vmm.sys", "vmm.guest"} <= me.keys() and any(k.startswith("thread.") for k in me)
    assert moved({"a": 1.0}, {"a": 3.0, "b": 2.0}) == {"a": 2.0, "b": 2.0}
    # The snapshot script's awk parses a /proc/net/dev and /proc/interrupts.
    import subprocess
    dev = ("Inter-|   Receive\n face |bytes packets\n    lo: 9 9 0 0 0 0 0 0 9 9 0 0 0 0 0 0\n"
           "  eth0:100 2 0 0 0 0 0 0 300 4 0 0 0 0 0 0\n")
    irq = ("           CPU0       CPU1\n 25:  3  4  PCI-MSIX-0000:00:03.0  0-edge  virtio1-input.0\n"
           " 26:  1  1  PCI-MSIX-0000:00:03.0  1-edge  virtio1-output.0\n"
           " 27:  9  9  PCI-MSIX-0000:00:04.0  1-edge  virtio2-req.0\nRES: 5 6 Rescheduling interrupts\n")
    progs = dict(AWK)
    got = {}
    for path, text in (("/proc/net/dev", dev), ("/proc/interrupts", irq)):
        r = subprocess.run(["awk", progs[path]], input=text, capture_output=True, text=True)
        got.update(workloads.parse(r.stdout))
    assert got["rx_bytes"] == 100 and got["rx_packets"] == 2 and got["tx_bytes"] == 300, got
    assert got["tx_packets"] == 4 and got["netirq"] == 9 and got["res"] == 11, got
    assert got["netirq_rx"] == 7 and got["netirq_tx"] == 2, got


if __name__ == "__main__":
    _test()
    print("cost: ok")
