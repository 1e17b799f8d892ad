#!/usr/bin/env python3
"""bench/io/g2h_probe.py: where the time goes in a TCP guest -> host transfer,
Domus and QEMU in turn, for the bench/io row that trails QEMU. Run inside the
nested host:

    tools/kvm-host python3 bench/io/g2h_probe.py

Environment: REPS (default 3) rounds of one transfer per VMM, the order of
the VMMs reversed every other round; MIB (default 128) per transfer; PIN=1
pins the vCPU thread to CPU 0 and the VMM's other threads to CPU 1; VMMS
(default `domus,qemu`) the VMMs, where `NAME=PATH` is a Domus binary under a
name of its own, to compare two builds of Domus:

    VMMS=old=target/exp/domus-old,new=target/release/domus,qemu

IOLOAD=1 runs run.py's block tests on the data disk first (as guest A does
in the full bench run, where this row trails) and leaves them out of the
window.

Guest A is run.py's (kit rootfs with the helper, a data disk, the tap on the
bridge, vsock). Between the guest's `start` and `done` console lines (the
transfer alone) it prints, per transfer:

  * the throughput the host received (a few console lines after the
    transfer fall inside the window too);
  * KVM's exit counters over that window (debugfs, all VMs summed: only one
    runs), among them halt_exits (the guest went idle waiting) and
    irq_window_exits, and the guest's MMIO writes to its local APIC and to
    everything else (virtio doorbells, mostly), from KVM's kvm_mmio
    tracepoint;
  * the busiest threads on the host: CPU seconds, seconds spent runnable but
    waiting for a CPU, and times scheduled in (/proc/*/task/*/schedstat);
  * the guest's frames sent and received, and its interrupts per queue;
  * for Domus, the interface's counters (doorbells, interrupts, packets).

It writes nothing; read its output.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from domus_api import request  # noqa: E402

REPS = int(os.environ.get("REPS", "3"))
MIB = int(os.environ.get("MIB", "128"))
PIN = os.environ.get("PIN") == "1"
IOLOAD = os.environ.get("IOLOAD") == "1"
# A guest that has not powered off by then is killed and the transfer left
# out (the nested host's guests hang now and then: README, "Known issues").
GUEST_TIMEOUT_S = 300
HZ = os.sysconf("SC_CLK_TCK")
API = "/tmp/g2h-probe-api.sock"
STATS = "/sys/class/net/eth0/statistics"


def tasks():
    """(comm, tid) -> (CPU s, runqueue wait s, times scheduled) for every thread."""
    r = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                stat = open(f"/proc/{p}/task/{t}/stat").read()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                f = stat.rsplit(")", 1)[1].split()
                ss = open(f"/proc/{p}/task/{t}/schedstat").read().split()
                r[(name, t)] = ((int(f[11]) + int(f[12])) / HZ, int(ss[1]) / 1e9, int(ss[2]))
        except OSError:
            pass
    return r


MMIO_HIST = "/sys/kernel/tracing/events/kvm/kvm_mmio/hist"


def mmio_writes():
    """Guest MMIO writes so far, as {"lapic": n, "other": n} (the other being
    mostly virtio doorbells), from a hist trigger on KVM's kvm_mmio
    tracepoint; {} where tracefs or hist triggers are missing."""
    try:
        text = open(MMIO_HIST).read()
    except OSError:
        return {}
    r = {"lapic": 0, "other": 0}
    for line in text.splitlines():
        # { type: 2, gpa: 4276092928 } hitcount: 12
        if not line.startswith("{") or "hitcount:" not in line:
            continue
        keys = dict(re.findall(r"(\w+):\s*(\d+)", line[1:line.index("}")]))
        if keys.get("type") != "2" or "gpa" not in keys:
            continue
        n = int(line.split("hitcount:")[1].split()[0])
        r["lapic" if int(keys["gpa"]) >> 12 == 0xfee00 else "other"] += n
    return r


def kvm_stats():
    """KVM's counters from debugfs, summed over the VMs there."""
    r = {}
    base = "/sys/kernel/debug/kvm"
    for d in os.listdir(base):
        vm = os.path.join(base, d)
        if not os.path.isdir(vm):
            continue
        for f in os.listdir(vm):
            try:
                r[f] = r.get(f, 0) + int(open(os.path.join(vm, f)).read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return r


def domus_counters():
    status, text = request(API, "GET", "/v1/devices/net0")
    if status != 200:
        raise RuntimeError(f"GET /v1/devices/net0: {status} {text}")
    return json.loads(text)["counters"]


def diff(a, b):
    return {k: v - a.get(k, 0) for k, v in b.items() if v != a.get(k, 0)}


def pin(pid):
    """The busiest thread (the vCPU, after boot) on CPU 0, the rest on CPU 1."""
    mine = set(os.listdir(f"/proc/{pid}/task"))
    cpu = {t: v[0] for (_, t), v in tasks().items() if t in mine}
    vcpu = max(cpu, key=cpu.get)
    for t in cpu:
        os.sched_setaffinity(int(t), {0 if t == vcpu else 1})


def vmms():
    """[(label, Domus binary or None for QEMU)] from VMMS."""
    r = []
    for v in os.environ.get("VMMS", "domus,qemu").split(","):
        name, _, path = v.partition("=")
        if path:
            r.append((name, os.path.abspath(path)))
        elif name in ("domus", "qemu"):
            r.append((name, R.DOMUS if name == "domus" else None))
        else:
            sys.exit(f"g2h_probe: VMMS: {v!r} is not domus, qemu or NAME=PATH")
    return r


def one(label, binary, k, root, data):
    vmm = "qemu" if binary is None else "domus"
    irqs = "grep virtio /proc/interrupts | tr -s ' ' | sed 's/^/{} /'; "
    cmd = (R.net_up(R.A_IP)
           + (f"/h ioload /dev/vdb {R.SECONDS} >/dev/null; " if IOLOAD else "")
           + f"echo pk0 $(cat {STATS}/tx_packets {STATS}/rx_packets); "
           + irqs.format("irq0") +
           "echo start; " f"/h send tcp {R.HOST_IP} 5001 {MIB} >/dev/null; "
           f"echo pk1 $(cat {STATS}/tx_packets {STATS}/rx_packets); "
           + irqs.format("irq1") +
           # The VMM (and its API socket) must outlive the last look.
           "echo done; sleep 5")
    rx = R.receiver("tcp", 5001)
    time.sleep(0.2)
    c = R.vmm_cmd(vmm, k, [(root, False), (data, False)], R.TAP_A, "52:54:00:00:00:0a", R.CID,
                  R.cmdline(cmd, True), domus=binary)
    if vmm == "domus":
        c += ["--api-socket", API]
    p = subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(GUEST_TIMEOUT_S, p.kill)
    watchdog.start()
    out, at = [], {}
    for line in p.stdout:
        out.append(line)
        mark = line.strip()
        if mark in ("start", "done"):
            if mark == "start" and PIN:
                pin(p.pid)
            # The interface's counters first: the VMM exits soon after `done`.
            counters = domus_counters() if vmm == "domus" else {}
            at[mark] = (time.time(), tasks(), {**kvm_stats(), **{
                f"mmio_writes_{x}": n for x, n in mmio_writes().items()}}, counters)
    p.wait()
    watchdog.cancel()
    try:
        got, _ = rx.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        rx.kill()
        got, _ = rx.communicate()
    if len(at) < 2:
        print(f"{label}: no result, the guest never finished (status {p.returncode}):\n"
              + "".join(out)[-2000:], flush=True)
        return
    (t0, a0, k0, c0), (t1, a1, k1, c1) = at["start"], at["done"]
    print(f"{label}: {R.fields(got).get('recv_mbs')} MB/s, {t1 - t0:.1f} s", flush=True)
    kd = diff(k0, k1)
    keep = ("exits", "halt_exits", "irq_window_exits", "irq_exits", "io_exits", "preemption_other",
            "mmio_writes_lapic", "mmio_writes_other")
    print("  kvm:", {x: kd.get(x, 0) for x in keep})
    busy = sorted(((tuple(b - a for a, b in zip(a0.get(key, (0, 0, 0)), v)), key)
                   for key, v in a1.items()), reverse=True)[:5]
    print("  threads (CPU s / waiting s / runs):",
          ", ".join(f"{n}:{v[0]:.2f}/{v[1]:.2f}/{v[2]}" for v, (n, _) in busy))
    pk = {w.split()[0]: [int(x) for x in w.split()[1:]] for w in out if w.startswith("pk")}
    if "pk0" in pk and "pk1" in pk:
        print("  guest frames: tx", pk["pk1"][0] - pk["pk0"][0], "rx", pk["pk1"][1] - pk["pk0"][1])
    # "irqN <irq>: <count> <chip> ... <name>", one CPU.
    seen = {(w.split()[0], w.split()[-1]): int(w.split()[2]) for w in out
            if w.startswith(("irq0 ", "irq1 ")) and len(w.split()) > 3}
    print("  guest interrupts:", ", ".join(
        f"{name} {n - seen.get(('irq0', name), 0)}"
        for (when, name), n in sorted(seen.items())
        if when == "irq1" and n > seen.get(("irq0", name), 0)))
    if c0:
        print("  Domus net0:", diff(c0, c1))


def main():
    subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], capture_output=True)
    subprocess.run(["mount", "-t", "tracefs", "none", "/sys/kernel/tracing"], capture_output=True)
    try:
        with open(os.path.join(os.path.dirname(MMIO_HIST), "trigger"), "w") as f:
            f.write("hist:keys=type,gpa:size=8192")
    except OSError as e:
        print(f"g2h_probe: no MMIO counts ({e})", file=sys.stderr)
    k = R.kit()
    order = vmms()
    work = tempfile.mkdtemp(prefix="domus-g2h-probe-")
    root, data = os.path.join(work, "root.img"), os.path.join(work, "data.img")
    shutil.copy(k["rootfs"], root)
    R.sh("debugfs", "-w", "-R", f"write {R.HELPER} /h", root)
    R.sh("fallocate", "-l", f"{R.DATA_MIB}M", data)
    R.bridge(True)
    try:
        for i in range(REPS):
            for label, binary in (order if i % 2 == 0 else order[::-1]):
                one(label, binary, k, root, data)
    finally:
        R.bridge(False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
