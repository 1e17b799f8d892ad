"""bench/paper's `slice` experiment (run.py): why the scalability experiment's
aggregate falls once more domains than CPUs run, measured by changing
one thing, the nested host's scheduler slice.

`scal` found (cpuuse.py's samples) that with 8 clones on 2 CPUs the
vCPU threads had 1.92 of the 2 CPUs and the host outside them 0.03, yet
each vCPU second did about 35% less sysbench work than one clone alone,
with about 60 switches per second per vCPU. Each switch between vCPU
threads is a world switch, which the nested platform emulates in full
(and after which its emulated TLB starts empty). If that is the cost, a
longer slice, fewer switches, gives the work back. Linux's EEVDF slice
(/sys/kernel/debug/sched/base_slice_ns, 3 ms or less by default) is
compared with Xen's credit scheduler's default time slice, 30 ms (`xl
sched-credit -s -t`), with N clones running sysbench cpu at once; one
clone alone first, for the ideal (N=1's rate times the CPUs).

Since the daemon can set it (`domus sched-credit -s -t 30`, each vCPU
thread asking for a 30 ms slice of its own: `sched_setattr`'s
`sched_runtime` for SCHED_OTHER, Linux 6.12), the arms are the kernel's
default and the daemon's setting, at 1, 4 and 8 clones; the host's base
slice is left alone. Earlier runs also set the host-wide base slice to
30 ms, which did as much as the per-thread slice at 4 clones (RUNS.md,
2026-11-27, noon)."""
import ctypes
import json
import os
import struct

import benchlib
import envs
import multi
from envs import say

BASE_SLICE = "/sys/kernel/debug/sched/base_slice_ns"
XEN_TSLICE_NS = 30_000_000
# One domain alone, then as many as twice and four times the nested host's
# CPUs at once.
COUNTS = (1, 4, 8)
# The kernel's own slice, and the daemon's host-wide setting at Xen's
# default (each vCPU thread's own 30 ms).
ARMS = [("default", 0), ("sched-credit -t 30", XEN_TSLICE_NS)]


def base_slice():
    """The nested host's EEVDF base slice (ns), which the arms leave
    alone; debugfs is mounted if it is not."""
    if not os.path.exists(BASE_SLICE):
        os.system("mount -t debugfs none /sys/kernel/debug 2>/dev/null")
    if not os.path.exists(BASE_SLICE):
        raise RuntimeError(f"the nested host's kernel has no {BASE_SLICE} (EEVDF's, Linux 6.6 and later)")
    with open(BASE_SLICE) as f:
        return int(f.read().strip())


SYS_SCHED_GETATTR = 315  # x86_64
# struct sched_attr as of Linux 3.14 (SCHED_ATTR_SIZE_VER0): size, policy,
# flags, nice, priority, runtime, deadline, period.
ATTR = struct.Struct("=IIQiIQQQ")
_libc = ctypes.CDLL(None, use_errno=True)


def thread_slice(tid):
    """Thread `tid`'s EEVDF slice (sched_runtime, ns): its own, else the
    base slice (Linux 6.12 and later; 0 before)."""
    buf = ctypes.create_string_buffer(ATTR.size)
    if _libc.syscall(SYS_SCHED_GETATTR, tid, buf, ATTR.size, 0) != 0:
        raise OSError(ctypes.get_errno(), f"sched_getattr({tid})")
    return ATTR.unpack(buf.raw)[5]


def vcpu_slices(dom, clones, ns):
    """Has the daemon ask every domain's vCPU threads for slice `ns` (0:
    back to the base slice): `domus sched-credit -s -t MS`, the setting
    built for this (Xen's tslice). Each of `clones`' threads is read back:
    a slice the daemon did not give is an error, not a measurement."""
    dom.domus("sched-credit", "-s", "-t", str(ns // 1_000_000))
    want = ns or base_slice()
    names = {c.name for c in clones}
    for d in json.loads(dom.domus("list", "--json")):
        if d.get("name") in names:
            for tid in d.get("vcpu_tids") or []:
                got = thread_slice(tid)
                if got != want:
                    raise RuntimeError(f"{d['name']}'s vCPU thread {tid} has a slice of {got} ns "
                                       f"after sched-credit -s -t {ns // 1_000_000}, not {want}")


def slice_experiment(environments, run):
    dom = multi.domus_of(environments)
    default = base_slice()
    # Which nested host measured each trial: hosts differ by a quarter
    # (RUNS.md), so the report sets N clones against one clone of the
    # same host only.
    host = benchlib.boot_id()
    secs = 20 if run.quick else 30
    trials = max(run.count, 2)  # even --quick: a comparison, in turning order
    res = multi.resumed(run, "slice", {"template_mib": multi.TEMPLATE_MIB, "domains": list(COUNTS[1:]),
                                       "seconds": secs, "default_ns": default})
    steps = multi.Steps(dom, run, "sl")

    def measure(t, label, own, n):
        def one(clones):
            try:
                vcpu_slices(dom, clones, own)
                multi.resume_quiet(dom, clones)
                return multi.concurrent_rates(clones, multi.sysbench_script(secs + n), secs + n, "sysbench")
            finally:
                vcpu_slices(dom, clones, 0)

        each, window = steps.measure(n, one)
        say(f"slice: trial {t + 1}: {label} ({(own or default) / 1e6:.2f} ms), {n}: "
            f"{sum(each):.0f} events/s" + multi.cpu_note(window["cpu"]))
        res["runs"].setdefault(label, {}).setdefault(str(n), []).append(
            {"slice_ns": own or default, "base_slice_ns": default, "vcpu_slice_ns": own,
             "vcpu_slice_by": "domus sched-credit -s -t", "host": host,
             "total": sum(each), "each": each, "window": window})
        run.save()

    try:
        # A host that takes over from one that died measures one clone of
        # each arm it has counts left of again, for the same-host ratio.
        for label, own in ARMS:
            per_n = res["runs"].get(label, {})
            ones = per_n.get("1", [])
            left = any(len(per_n.get(str(n), [])) < trials for n in COUNTS[1:])
            if ones and left and not any(r.get("host") == host for r in ones):
                measure(len(ones), label, own, 1)
        # The arms turn at each count, so that both are measured at 4 in a
        # host before either tries 8, where hosts die more often.
        for t in range(trials):
            for n in COUNTS:
                for label, own in envs.rotate(ARMS, t):
                    if len(res["runs"].get(label, {}).get(str(n), [])) <= t:
                        measure(t, label, own, n)
        return res
    finally:
        try:
            dom.domus("sched-credit", "-s", "-t", "0")
        finally:
            steps.destroy()
