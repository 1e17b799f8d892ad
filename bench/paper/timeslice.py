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
alternated with Xen's credit scheduler's default time slice, 30 ms
(`xl sched-credit -s -t`), with 4 clones running sysbench cpu at once; one
clone alone first, for the ideal (N=1's rate times the CPUs)."""
import os

import envs
import multi
from envs import say

BASE_SLICE = "/sys/kernel/debug/sched/base_slice_ns"
XEN_TSLICE_NS = 30_000_000
DOMAINS = 4


def base_slice(ns=None):
    """The nested host's EEVDF base slice (ns), set to `ns` first if
    given; debugfs is mounted if it is not."""
    if not os.path.exists(BASE_SLICE):
        os.system("mount -t debugfs none /sys/kernel/debug 2>/dev/null")
    if not os.path.exists(BASE_SLICE):
        raise RuntimeError(f"the nested host's kernel has no {BASE_SLICE} (EEVDF's, Linux 6.6 and later)")
    if ns is not None:
        with open(BASE_SLICE, "w") as f:
            f.write(str(ns))
    with open(BASE_SLICE) as f:
        return int(f.read().strip())


def slice_experiment(environments, run):
    dom = multi.domus_of(environments)
    default = base_slice()
    secs = 20 if run.quick else 30
    res = multi.resumed(run, "slice", {"template_mib": multi.TEMPLATE_MIB, "domains": DOMAINS,
                                       "seconds": secs, "default_ns": default})
    steps = multi.Steps(dom, run, "sl")
    try:
        # Two trials at least, even --quick: a comparison, in turning order.
        for t in range(max(run.count, 2)):
            for label, ns in envs.rotate([("default", default), ("xen-credit", XEN_TSLICE_NS)], t):
                for n in (1, DOMAINS):
                    got = res["runs"].setdefault(label, {}).setdefault(str(n), [])
                    if len(got) > t:
                        continue
                    clones = steps.first(n)
                    base_slice(ns)
                    for c in clones:
                        c.resume()
                    try:
                        each, window = multi.concurrent_rates(clones, multi.sysbench_script(secs + n),
                                                              secs + n, "sysbench")
                    finally:
                        for c in clones:
                            c.pause()
                        base_slice(default)
                    say(f"slice: trial {t + 1}: {label} ({ns / 1e6:.2f} ms), {n}: {sum(each):.0f} events/s"
                        + multi.cpu_note(window["cpu"]))
                    got.append({"slice_ns": ns, "total": sum(each), "each": each, "window": window})
                    run.save()
        return res
    finally:
        base_slice(default)
        steps.destroy()
