"""The machine outside the nested host, seen from inside it.

The nested host's CPUs are threads of the outer QEMU on this machine's
CPUs (2 here). Anything else this machine runs meanwhile (a build, a test
run, another nested host) takes CPU time from the nested host's vCPUs,
which no measurement inside it can see: its clock runs on, and its
guests simply do less work per second. Two runs of the `slice`
experiment a session apart gave 4 domains 546 and 835 events/s at the
same slice and switch rate (RUNS.md); the outer machine's load is one
explanation the results could not rule out.

`tools/bench-paper` runs `sample FILE` on this machine beside the nested
host: once a second it writes FILE (on the repository's share, which the
nested host reads uncached over 9p) with this machine's CPU times and the
outer QEMU processes' CPU time. cpuuse.py reads it with each of its
samples, and `between` gives the outer machine's CPUs busy outside the
nested host over a measurement: near 0 when nothing else ran."""
import json
import os
import sys
import time

# cpuuse imports this module too; only its functions are used here, at
# call time, so the cycle is harmless.
import cpuuse

HZ = os.sysconf("SC_CLK_TCK")
# Where tools/bench-paper's sampler writes, relative to the repository.
FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "bench-paper",
                    "outer.json")


def qemu_ticks():
    """User and system ticks of every qemu-system process here."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        if comm.startswith("qemu-system"):
            fields = stat[stat.rfind(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total


def snapshot():
    with open("/proc/stat") as f:
        t = cpuuse.host_times(f.readline())
    return {"wall": time.time(), "busy_s": t["guest"] + t["user"] + t["kernel"] + t["steal"],
            "qemu_s": qemu_ticks() / HZ, "cpus": os.cpu_count()}


def sample(path):
    """Writes `path` once a second until killed, or until the process
    that started it (tools/bench-paper) is gone."""
    tmp = path + ".tmp"
    parent = os.getppid()
    while os.getppid() == parent:
        with open(tmp, "w") as f:
            json.dump(snapshot(), f)
        os.replace(tmp, path)
        time.sleep(1)


def read():
    """The sampler's latest record, or None (no sampler: a run on a
    machine with real KVM, or an older tools/bench-paper). The nested
    host's clock is not this machine's, so the record's own `wall` is the
    only time used; tools/bench-paper removes the file when its sampler
    stops, so no earlier run's record is read."""
    try:
        with open(FILE) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def between(a, b):
    """The outer machine's CPUs busy in all, and outside the nested host's
    QEMU, between records `a` and `b` (CPUs: seconds per second); None
    where either is missing."""
    if not a or not b or b["wall"] - a["wall"] < 1:
        return None
    dt = b["wall"] - a["wall"]
    busy = (b["busy_s"] - a["busy_s"]) / dt
    qemu = (b["qemu_s"] - a["qemu_s"]) / dt
    return {"busy": round(busy, 3), "nested_host": round(qemu, 3),
            "outside": round(max(0.0, busy - qemu), 3), "cpus": b.get("cpus")}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "sample":
        sys.exit("usage: outer.py sample FILE")
    sample(sys.argv[2])
