"""bench/paper's `pgcost` experiment (run.py; a diagnostic, run only when
--only names it): where Figure 3's PostgreSQL rows spend their time in
each environment, to say why Cloud Hypervisor's guest ran them faster
than Domus's in the record of 2026-11-28 (RUNS.md), in other nested hosts.

Each trial runs Figure 3's two pgbench commands (select-only, then
TPC-B-like; 2 clients per vCPU, as `pg`) and around each one reads:

- in the environment: its CPUs' time (/proc/stat: user, system, irq and
  softirq, idle, iowait, steal), context switches, the interprocessor
  interrupts it sent (rescheduling, function call and TLB shootdown, from
  /proc/interrupts) and its local timer interrupts, and its disks' writes
  and cache flushes with the time they took (/proc/diskstats);
- in the nested host: where its CPUs' time went (guest mode, host user,
  host kernel, idle: the VMM's own work shows as host user and kernel);
- KVM's counters for the guest's VM (kvmstat: exits, HLT exits,
  hypercalls, which carry paravirtual IPIs and yields, injections).

Once per environment it also logs (not in the record) what the guest's
kernel said about KVM's paravirtual features, its clock source, cpuidle
driver, CPU flags, which CPUs it thinks share a core and each cache, and
its scheduler domains, so that a difference in what the VMM offered the
guest shows beside one in what the workload cost.
"""
import os
import statistics
import time

import kvmstat
import workloads
from envs import say
from xzmem import host_cpu

# The environment's counters, one `name=value` per line (USER_HZ ticks for
# CPU times; sums over CPUs for interrupts; whole disks only).
SNAP = r"""#!/bin/bash
# bench/paper pgcost: this environment's CPU, interrupt and disk counters.
awk '/^cpu / {print "user=" $2 + $3; print "sys=" $4; print "irq=" $7 + $8;
              print "idle=" $5; print "iowait=" $6; print "steal=" $9}
     /^ctxt / {print "ctxt=" $2}' /proc/stat
awk 'function sum(  s, i) { s = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; return s }
     $1 == "RES:" {print "res=" sum()} $1 == "CAL:" {print "cal=" sum()}
     $1 == "TLB:" {print "tlb=" sum()} $1 == "LOC:" {print "loc=" sum()}' /proc/interrupts
awk '$3 ~ /^(vd[a-z]+|sd[a-z]+|nvme[0-9]+n[0-9]+)$/ {w += $8; wms += $11; f += $19; fms += $20}
     END {print "writes=" w + 0; print "write_ms=" wms + 0; print "flushes=" f + 0; print "flush_ms=" fms + 0}' /proc/diskstats
"""

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

USER_HZ = 100
# The snapshot's CPU times, in ticks.
TICKS = ("user", "sys", "irq", "idle", "iowait", "steal")

# results.md's columns: (key, label, per second of the row, format), where
# the key is the row's value name after `ROW.`.
GUEST_COLUMNS = [("tps", "tps", False, 1), ("busy", "busy (CPU s/s)", False, 2),
                 ("sys_share", "of it system+irq", False, 2), ("iowait", "iowait (CPU s/s)", False, 2),
                 ("ctxt", "switches/s", True, 0), ("res", "resched IPIs/s", True, 0),
                 ("cal", "call IPIs/s", True, 0), ("tlb", "TLB IPIs/s", True, 0),
                 ("loc", "timer IRQs/s", True, 0), ("flushes", "flushes/s", True, 1),
                 ("flush_ms_each", "ms per flush", False, 2)]
HOST_COLUMNS = [("host.guest", "guest mode (CPU s/s)", True, 2), ("host.user", "host user (CPU s/s)", True, 2),
                ("host.kernel", "host kernel (CPU s/s)", True, 2), ("host.idle", "idle (CPU s/s)", True, 2),
                ("kvm.exits", "exits/s", True, 0), ("kvm.halt_exits", "HLT exits/s", True, 0),
                ("kvm.hypercalls", "hypercalls/s", True, 0), ("kvm.irq_injections", "injections/s", True, 0),
                ("kvm.io_exits+kvm.mmio_exits", "I/O+MMIO exits/s", True, 0),
                ("kvm.halt_wakeup", "wakeups/s", True, 0)]


def parse_snap(out):
    vals = {}
    for line in out.splitlines():
        k, sep, v = line.strip().partition("=")
        if sep:
            try:
                vals[k] = float(v)
            except ValueError:
                pass
    return vals


def derive(before, after, secs):
    """The row's environment values from two snapshots: counter
    differences, CPU times in seconds, and what the table shows."""
    d = {k: after[k] - before[k] for k in after if k in before}
    for k in TICKS:
        if k in d:
            d[k] /= USER_HZ
    busy = sum(d.get(k, 0) for k in ("user", "sys", "irq"))
    d["busy"] = busy / secs
    d["sys_share"] = (d.get("sys", 0) + d.get("irq", 0)) / busy if busy else 0.0
    d["iowait"] = d.get("iowait", 0) / secs
    d["flush_ms_each"] = d["flush_ms"] / d["flushes"] if d.get("flushes") else 0.0
    return d


def experiment(environments, run, running, vcpus):
    """Trials in each environment, as run.trials runs them (the order
    turning each trial, the others paused); each trial both pgbench rows."""
    snap = os.path.join(run.work, "pgsnap.sh")
    with open(snap, "w") as f:
        f.write(SNAP)
    for e in environments:
        with running(e):
            e.put(snap, "pgsnap.sh")
            e.sh(workloads.pg_prepare(e.name == "native", run.quick), 1800)
            say(f"pgcost: {e.name}: what its kernel says:\n" + e.sh(FACTS, 120))
    watch = kvmstat.available()

    def one(e):
        vals = {}
        for key in workloads.PG_ROWS:
            before, h0 = parse_snap(e.sh("bash pgsnap.sh", 60)), host_cpu()
            k0 = kvmstat.snapshot() if watch else {}
            t0 = time.monotonic()
            out = e.sh(workloads.pg_command(key, vcpus, run.quick), 900)
            secs = time.monotonic() - t0
            k1, h1 = (kvmstat.snapshot() if watch else {}), host_cpu()
            after = parse_snap(e.sh("bash pgsnap.sh", 60))
            tps = workloads.parse(out).get("value")
            if tps is None:
                raise RuntimeError(f"{e.name}: pgbench ({key}) printed no tps")
            row = derive(before, after, secs)
            row["tps"] = tps
            row.update({f"host.{k}": h1[k] - h0[k] for k in h0})
            row["wall_s"] = round(secs, 3)
            vals.update({f"{key}.{k}": v for k, v in row.items()})
            if watch:
                vals.update(kvmstat.flat(key, kvmstat.moved(k0, k1), secs))
        return vals

    return run.trials("pgcost", environments, one)


def _value(trial, row, key):
    """A column's value in one trial, per second of the row where asked
    (`a+b` sums two)."""
    total = 0.0
    for part in key.split("+"):
        name = (kvmstat.key(row, part[len(kvmstat.PREFIX):]) if part.startswith(kvmstat.PREFIX)
                else f"{row}.{part}")
        if name not in trial:
            return None
        total += trial[name]
    return total


def table(exp, envs_order, short):
    """results.md's lines for a pgcost record: for each pgbench row, one
    line per environment in each of two tables (the environment's own
    counters, the nested host's and KVM's), medians of the trials."""
    runs = exp["runs"]
    names = [e for e in envs_order if runs.get(e)]
    n = min(len(runs[e]) for e in names) if names else 0
    lines = ["## Diagnostic: where pgbench's time goes (`pgcost`)", "",
             f"Why Figure 3's PostgreSQL rows differ between the VMMs ({n} trial(s) each, taken "
             "in turn in each nested host; medians). Figure 3's pgbench commands, with the environment's "
             "CPU time, context switches, interprocessor interrupts and disk flushes counted "
             "around each (its /proc), and the nested host's CPU time and KVM's counters for "
             "the guest's VM (bench/paper/pgcost.py; RUNS.md reads it). Rates are per second "
             "of the row.", ""]
    rows = {}
    for title, cols in (("the environment", GUEST_COLUMNS), ("the nested host and KVM", HOST_COLUMNS)):
        lines += [f"In {title}:", "",
                  "| row | environment | " + " | ".join(label for _, label, _, _ in cols) + " |",
                  "| --- | --- | " + " | ".join("---:" for _ in cols) + " |"]
        for row, (label, *_) in workloads.PG_ROWS.items():
            for e in names:
                cells = []
                for key, _, per_s, p in cols:
                    xs = []
                    for t in runs[e]:
                        v = _value(t, row, key)
                        wall = t.get(f"{row}.wall_s")
                        if v is not None and (not per_s or wall):
                            xs.append(v / wall if per_s else v)
                    med = statistics.median(xs) if xs else None
                    rows.setdefault(row, {}).setdefault(e, {})[key] = med
                    cells.append("n/a" if med is None else f"{med:.{p}f}")
                lines.append(f"| {label} | {short[e]} | " + " | ".join(cells) + " |")
        lines.append("")
    return rows, lines


def _test():
    before = parse_snap("user=100\nsys=50\nirq=10\nidle=0\niowait=20\nsteal=0\nctxt=5\n"
                        "flushes=2\nflush_ms=4\nnot a line\nbad=x")
    after = parse_snap("user=300\nsys=110\nirq=20\nidle=100\niowait=40\nsteal=0\nctxt=105\n"
                       "flushes=6\nflush_ms=12")
    d = derive(before, after, 2.0)
    assert d["busy"] == 1.35 and abs(d["sys_share"] - 70 / 270) < 1e-9, d
    assert d["iowait"] == 0.1 and d["flush_ms_each"] == 2.0 and d["ctxt"] == 100, d
    trial = {"pg_ro.ctxt": 100.0, "pg_ro.wall_s": 2.0, "kvm.pg_ro.io_exits": 3.0,
             "kvm.pg_ro.mmio_exits": 4.0}
    assert _value(trial, "pg_ro", "ctxt") == 100.0
    assert _value(trial, "pg_ro", "kvm.io_exits+kvm.mmio_exits") == 7.0
    assert _value(trial, "pg_ro", "kvm.exits") is None


if __name__ == "__main__":
    _test()
    print("pgcost: ok")
