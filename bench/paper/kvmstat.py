"""KVM's own counters in the nested host, read from debugfs
(/sys/kernel/debug/kvm/PID-FD, one directory per VM): what a guest's
workload cost in exits and in the nested host's page tables for it.

A Figure 3 trial runs one guest while the others are paused, so the VM
whose exit count moved during a row is the one measured. Its counters'
differences, and the gauges of how its memory is mapped (4 KiB, 2 MiB,
1 GiB pages in the two-dimensional page tables), go into the trial as
flat `kvm.ROW.NAME` values, which the report sets side by side per VMM:
this is how a row where one VMM is slower than another is explained
rather than guessed at.
"""
import os
import subprocess

ROOT = "/sys/kernel/debug/kvm"

# Counters (differences over a row) and gauges (values at its end).
COUNTERS = ("exits", "irq_exits", "halt_exits", "io_exits", "mmio_exits", "irq_window_exits",
            "request_irq_exits", "signal_exits", "irq_injections", "hypercalls",
            "insn_emulation", "pf_fixed", "pf_guest", "pf_taken", "tlb_flush",
            "remote_tlb_flush", "nx_lpage_splits", "halt_wakeup")
GAUGES = ("pages_4k", "pages_2m", "pages_1g")


def available():
    """Whether KVM's debugfs can be read, mounting debugfs when it is not
    (the nested host's init does not)."""
    if not os.path.isdir(ROOT):
        subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return os.path.isdir(ROOT)


def _read(path):
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def snapshot():
    """{vm directory: {name: value}} for every VM now in the nested host;
    {} where debugfs cannot be read."""
    try:
        names = os.listdir(ROOT)
    except OSError:
        return {}
    vms = {}
    for d in names:
        path = os.path.join(ROOT, d)
        if "-" not in d or not os.path.isdir(path):
            continue
        vals = {k: _read(os.path.join(path, k)) for k in COUNTERS + GAUGES}
        vms[d] = {k: v for k, v in vals.items() if v is not None}
    return vms


def moved(before, after):
    """The counters' differences and the gauges at the end for the VM that
    ran between two snapshots (the one whose exit count grew most); {}
    when none ran (native) or none can be read."""
    best, most = None, 0
    for vm, now in after.items():
        then = before.get(vm)
        if then is None:
            continue
        grew = now.get("exits", 0) - then.get("exits", 0)
        if grew > most:
            best, most = vm, grew
    if best is None:
        return {}
    now, then = after[best], before[best]
    out = {k: now[k] - then[k] for k in COUNTERS if k in now and k in then}
    out.update({k: now[k] for k in GAUGES if k in now})
    return out


PREFIX = "kvm."


def key(row, name):
    """The trial value's name for counter `name` during `row`."""
    return f"{PREFIX}{row}.{name}"


def flat(row, stats, secs):
    """`stats` (moved()) as trial values `kvm.ROW.NAME`, with the row's
    wall time `kvm.ROW.wall_s`."""
    vals = {key(row, k): float(v) for k, v in stats.items()}
    if stats:
        vals[key(row, "wall_s")] = round(secs, 3)
    return vals


def _test():
    before = {"1-10": {"exits": 5, "pf_fixed": 1, "pages_2m": 3},
              "2-11": {"exits": 7, "pf_fixed": 0, "pages_2m": 0}}
    after = {"1-10": {"exits": 5, "pf_fixed": 1, "pages_2m": 3},
             "2-11": {"exits": 107, "pf_fixed": 40, "pages_2m": 9},
             "3-12": {"exits": 10**6}}
    got = moved(before, after)
    assert got == {"exits": 100, "pf_fixed": 40, "pages_2m": 9}, got
    assert moved(before, before) == {}
    assert flat("xz", got, 1.5)["kvm.xz.wall_s"] == 1.5
    assert flat("xz", {}, 1.5) == {}


if __name__ == "__main__":
    _test()
    print("kvmstat: ok")
