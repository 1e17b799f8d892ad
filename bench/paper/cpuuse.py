"""Where the nested host's CPU time goes while a many-domain experiment
measures: the host's own split (/proc/stat: guest mode, kernel, user,
idle) and each domain's vCPU and I/O time as the daemon accounts them.

The many-domain experiments lose throughput once more vCPUs than CPUs
run, or beside an antisocial domain; these samples say whether the CPU
went to the domains, to the host's kernel on their behalf, or to the
bench's own clients in the nested host (wrk, iperf3's server), and how
much work each domain did per second of vCPU time, and how often its
vCPU threads were switched out and moved between CPUs (each switch is a
world switch, which the nested platform emulates in full)."""

import json
import os
import time

import kvmstat
import outer

HZ = os.sysconf("SC_CLK_TCK")
KVM_DEBUGFS = kvmstat.ROOT


def host_times(line):
    """/proc/stat's `cpu` line as seconds: guest (time in guest mode, which
    `user` also counts), user (without it), kernel (system, irq, softirq),
    idle (with iowait) and steal."""
    f = [int(x) for x in line.split()[1:]] + [0] * 10
    guest = f[8] + f[9]
    return {"guest": guest / HZ, "user": max(0, f[0] + f[1] - guest) / HZ,
            "kernel": (f[2] + f[5] + f[6]) / HZ, "idle": (f[3] + f[4]) / HZ, "steal": f[7] / HZ}


def thread_switches(tid):
    """A thread's context switches and migrations between CPUs so far
    (/proc/TID/sched; without the scheduler's debug file, the switches
    from /proc/TID/status and no migrations)."""
    switches = migrations = 0
    try:
        with open(f"/proc/{tid}/sched") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "nr_switches":
                    switches = int(float(val))
                elif key == "se.nr_migrations":
                    migrations = int(float(val))
        return switches, migrations
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    switches += int(line.split()[1])
    except (OSError, ValueError):
        pass
    return switches, migrations


def thread_wait_s(tid):
    """Seconds thread `tid` has so far spent runnable but waiting for a
    CPU (/proc/TID/schedstat's second field; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{tid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def halt_poll_s(pid, vms):
    """Seconds the vCPUs of the VM that VMM process `pid` made have so far
    spent polling in KVM before halting (halt_poll_success_ns and
    halt_poll_fail_ns in KVM's debugfs: CPU time that counts as the
    domain's vCPU time though the guest asked to idle); None where
    debugfs has no such VM. `vms`: KVM's debugfs directory listing."""
    total = None
    for d in (d for d in vms if d.startswith(f"{pid}-")):
        for name in ("halt_poll_success_ns", "halt_poll_fail_ns"):
            try:
                with open(os.path.join(KVM_DEBUGFS, d, name)) as f:
                    total = (total or 0) + int(f.read().split()[0]) / 1e9
            except (OSError, ValueError, IndexError):
                pass
    return total


def sample(dom):
    """The nested host's CPU times and each domain's (by name, Domain-0
    left out) now. A daemon that does not answer leaves the domains out:
    the sample is for the results' notes, never a reason to fail a trial."""
    with open("/proc/stat") as f:
        host = host_times(f.readline())
    doms = {}
    if not os.path.isdir(KVM_DEBUGFS):
        kvmstat.available()  # mounts debugfs, where KVM's counters are
    try:
        vms = os.listdir(KVM_DEBUGFS)
    except OSError:
        vms = []
    try:
        for d in json.loads(dom.domus("list", "--json", check=False) or "[]"):
            if d.get("id") != 0:
                tids = d.get("vcpu_tids") or []
                counts = [thread_switches(t) for t in tids]
                doms[d["name"]] = {"vcpu": d["vcpu_time_s"], "io": d["io_time_s"],
                                   "switches": sum(c[0] for c in counts),
                                   "migrations": sum(c[1] for c in counts),
                                   # Runnable, not running: what the
                                   # scheduler kept it waiting.
                                   "wait": sum(thread_wait_s(t) for t in tids)}
                poll = halt_poll_s(d["pid"], vms) if d.get("pid") else None
                if poll is not None:
                    doms[d["name"]]["poll"] = poll
    except (ValueError, KeyError, TypeError, OSError, RuntimeError):
        doms = {}
    return {"t": time.monotonic(), "host": host, "domains": doms, "outer": outer.read()}


def between(a, b):
    """CPU use between two samples, in CPUs (seconds per second of wall
    time): the host's split, each domain's vCPU and I/O time (and its vCPU
    threads' switches and migrations per second), what the
    host was busy with outside every domain's accounted time (`outside`:
    its kernel's work not charged to a VMM, the daemon, the bench's
    clients), and the outer machine's CPUs busy outside the nested host
    (`outer`, outer.py; None without its sampler). None for samples less
    than a second apart."""
    wall = b["t"] - a["t"]
    if wall < 1:
        return None
    host = {k: round((b["host"][k] - a["host"][k]) / wall, 3) for k in b["host"]}
    doms = {name: {k: round((v[k] - a["domains"][name][k]) / wall, 3) for k in v if k in a["domains"][name]}
            for name, v in b["domains"].items() if name in a["domains"]}
    busy = host["guest"] + host["user"] + host["kernel"]
    used = sum(d["vcpu"] + d["io"] for d in doms.values())
    return {"wall_s": round(wall, 2), "host": host, "domains": doms,
            "outside": round(busy - used, 3) if doms else None,
            "outer": outer.between(a.get("outer"), b.get("outer"))}


def during(dom, fn):
    """`fn()`'s result and the CPU use (`between`) while it ran."""
    before = sample(dom)
    out = fn()
    return out, between(before, sample(dom))


def domains_total(use, key):
    """The sum of `key` (vcpu, io, switches, migrations) over the domains
    of a `between`; None where it has no domains."""
    return sum(d[key] for d in use["domains"].values()) if use["domains"] else None


def per_vcpu_second(rates, use, names):
    """Each domain's rate divided by its vCPU time per second: the work it
    did per second it actually ran. None where it did not run."""
    if not use:
        return None
    out = []
    for rate, name in zip(rates, names):
        v = use["domains"].get(name, {}).get("vcpu")
        out.append(round(rate / v, 1) if v else None)
    return out
