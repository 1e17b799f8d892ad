#!/usr/bin/env python3
"""bench/migration: live migration, Domus beside Cloud Hypervisor v53, in
one nested host.

Run inside the nested KVM host by tools/bench-migration (`run.py measure
OUT`), then `run.py report OUT` here. For each load (LOADS) and ROUNDS
rounds, each VMM boots the kit's kernel with an initramfs that holds
`domus-guest`, 1 vCPU and MIB (default 1024) MiB; the guest runs its load
and `domus-guest gaps 20`, which wakes every millisecond and prints each
wake-up more than 20 ms late on its own monotonic clock. Then the guest is
migrated live to a second VMM of the same kind on the same host, with a
300 ms downtime target for both:

  * Domus: `domus run --incoming SOCKET` on the destination; the source's
    `PUT /v1/domain/migrate` connection is relayed to that socket;
  * Cloud Hypervisor: `ch-remote receive-migration unix:SOCKET` on the
    destination, `ch-remote send-migration
    destination_url=unix:RELAY,downtime_ms=300` on the source.

Both streams go through the same relay in this script (a Unix socket
pair of pumps), which counts the bytes sent. Measured:

  * total: from the migration request to the source VMM's exit (both
    exit once the destination runs the guest; v53's send-migration answers
    at once);
  * downtime, the guest's view: the largest gap its `gaps` loop printed
    on the destination's console;
  * bytes sent through the relay.

Loads: `idle` (the guest only runs its gap loop), and `dirty` (it writes
4 MiB of random bytes to a file in its RAM every half second).
Ratios are Domus / Cloud Hypervisor in the same run; absolute times in
the nested host are about ten times native.
"""
import base64
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench"))
import benchlib  # noqa: E402
DOMUS = os.path.join(REPO, "target/release/domus")
HELPER = os.path.join(REPO, "target/x86_64-unknown-linux-gnu/release/domus-guest")
PEERS = os.path.join(os.path.dirname(REPO), "shared/peers")
CH = os.path.join(PEERS, "cloud-hypervisor")
CH_REMOTE = os.path.join(PEERS, "ch-remote")
MIB = int(os.environ.get("MIB", "1024"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
LOADS = os.environ.get("LOADS", "idle,dirty").split(",")
DOWNTIME_MS = 300
WORK = "/tmp/bench-migration"

LOAD_CMD = {
    "idle": "",
    "dirty": "(while :; do dd if=/dev/urandom of=/tmp/x bs=1M count=4 2>/dev/null; "
             "sleep 0.5; done) & ",
}


def kit():
    out = subprocess.run([DOMUS, "kit", "--print"], check=True, capture_output=True,
                         text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def newc(name, mode, data):
    """One cpio newc entry."""
    fields = [0, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0]
    head = b"070701" + b"".join(b"%08x" % f for f in fields) + name.encode() + b"\0"
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def helper_initrd(k):
    """The kit's initramfs with domus-guest at /bin/domus-guest (a second
    archive appended: the kernel unpacks both)."""
    out = os.path.join(WORK, "initramfs.cpio")
    with open(k["initrd"], "rb") as f:
        base = f.read()
    with open(HELPER, "rb") as f:
        helper = f.read()
    with open(out, "wb") as f:
        f.write(base + newc("bin/domus-guest", 0o100755, helper) + newc("TRAILER!!!", 0, b""))
    return out


def cmdline(load):
    cmd = LOAD_CMD[load] + "echo ready; domus-guest gaps 20"
    return "console=ttyS0 quiet panic=-1 domus.cmd=" + base64.b64encode(cmd.encode()).decode()


class Console:
    """Reads a VMM's stdout (the guest's serial console), with each line's
    arrival time."""

    def __init__(self, proc):
        self.lines = []
        self.cv = threading.Condition()
        self.proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            with self.cv:
                self.lines.append((time.monotonic(), raw.decode(errors="replace").strip()))
                self.cv.notify_all()

    def wait(self, text, timeout=300):
        end = time.monotonic() + timeout
        with self.cv:
            while not any(text in l for _, l in self.lines):
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no '{text}' on the console")
                self.cv.wait(min(left, 0.5))

    def max_gap(self, after):
        gaps = [float(m.group(1)) for t, l in self.lines if t >= after
                for m in [re.search(r"gap_ms=([0-9.]+)", l)] if m]
        return max(gaps) if gaps else None


def pump(a, b):
    """Relays between sockets a and b until either closes; returns the
    bytes that went from a to b."""
    sent = 0
    socks = [a, b]
    while True:
        r, _, _ = select.select(socks, [], [], 600)
        if not r:
            raise TimeoutError("the migration stream went silent")
        for s in r:
            d = s.recv(1 << 20)
            if not d:
                return sent
            (b if s is a else a).sendall(d)
            if s is a:
                sent += len(d)


def connect(path, timeout=60):
    end = time.monotonic() + timeout
    while True:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            return s
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.01)


def kill(p):
    if p.poll() is None:
        p.kill()
    p.wait()


def domus_round(k, initrd, load):
    d = os.path.join(WORK, "domus")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    src = subprocess.Popen(
        [DOMUS, "run", "--seccomp", "--kernel", k["kernel"], "--initrd", initrd,
         "--memory", f"{MIB}M", "--api-socket", f"{d}/src.sock", "--console", "stdout",
         "--cmdline", cmdline(load)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    dst = subprocess.Popen(
        [DOMUS, "run", "--seccomp", "--incoming", f"{d}/in.sock", "--memory", f"{MIB}M",
         "--api-socket", f"{d}/dst.sock", "--console", "stdout"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        con, con2 = Console(src), Console(dst)
        con.wait("ready")
        time.sleep(3)
        t0 = time.monotonic()
        a = connect(f"{d}/src.sock")
        body = json.dumps({"downtime_ms": DOWNTIME_MS}).encode()
        a.sendall(b"PUT /v1/domain/migrate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        head = b""
        while b"\r\n\r\n" not in head:
            head += a.recv(1)
        length = int(re.search(rb"Content-Length: (\d+)", head, re.I).group(1))
        answer = b""
        while len(answer) < length:
            answer += a.recv(length - len(answer))
        if b" 200 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(f"domus migrate: {head!r} {answer!r}")
        b = connect(f"{d}/in.sock")
        sent = pump(a, b)
        code = src.wait(timeout=600)
        total_ms = (time.monotonic() - t0) * 1000
        if code != 5:
            raise RuntimeError(f"the source VMM exited {code}, not 5 (migrated)")
        time.sleep(2)
        return {"total_ms": total_ms, "downtime_ms": con2.max_gap(t0), "bytes": sent}
    finally:
        kill(src)
        kill(dst)


def ch_remote(sock, *args, timeout=900):
    return subprocess.run([CH_REMOTE, "--api-socket", sock, *args], capture_output=True,
                          text=True, timeout=timeout)


def ch_round(k, initrd, load):
    d = os.path.join(WORK, "ch")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    src = subprocess.Popen(
        [CH, "--kernel", k["kernel"], "--initramfs", initrd, "--cmdline", cmdline(load),
         "--cpus", "boot=1", "--memory", f"size={MIB}M", "--serial", "tty", "--console", "off",
         "--api-socket", f"{d}/src.sock"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    dst = subprocess.Popen([CH, "--api-socket", f"{d}/dst.sock"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    recv = None
    try:
        con, con2 = Console(src), Console(dst)
        con.wait("ready")
        connect(f"{d}/dst.sock").close()
        recv = subprocess.Popen([CH_REMOTE, "--api-socket", f"{d}/dst.sock",
                                 "receive-migration", f"receiver_url=unix:{d}/in.sock"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        relay = socket.socket(socket.AF_UNIX)
        relay.bind(f"{d}/relay.sock")
        relay.listen(1)
        counted = {}

        def serve():
            a, _ = relay.accept()
            b = connect(f"{d}/in.sock")
            counted["bytes"] = pump(a, b)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        time.sleep(3)
        t0 = time.monotonic()
        r = ch_remote(f"{d}/src.sock", "send-migration",
                      f"destination_url=unix:{d}/relay.sock,downtime_ms={DOWNTIME_MS}")
        if r.returncode != 0:
            raise RuntimeError(f"ch-remote send-migration: {r.stderr.strip()}")
        # v53's send-migration answers at once; the source exits when done.
        src.wait(timeout=600)
        total_ms = (time.monotonic() - t0) * 1000
        t.join(timeout=60)
        if ch_remote(f"{d}/dst.sock", "info").returncode != 0:
            raise RuntimeError("the destination runs no VM")
        time.sleep(2)
        return {"total_ms": total_ms, "downtime_ms": con2.max_gap(t0),
                "bytes": counted.get("bytes")}
    finally:
        for p in (recv, src, dst):
            if p is not None:
                kill(p)


VMMS = (("domus", domus_round), ("cloud-hypervisor", ch_round))


def local_copies():
    """The VMMs run from copies in the nested host's tmpfs, as in
    bench/snapshot."""
    global DOMUS, CH, CH_REMOTE
    bindir = os.path.join(WORK, "bin")
    os.makedirs(bindir, exist_ok=True)
    out = []
    for path in (DOMUS, CH, CH_REMOTE):
        to = os.path.join(bindir, os.path.basename(path))
        shutil.copy2(path, to)
        out.append(to)
    DOMUS, CH, CH_REMOTE = out


def measure(dest):
    os.makedirs(WORK, exist_ok=True)
    k = kit()
    initrd = helper_initrd(k)
    local_copies()
    out = {"where": "nested KVM host (Debian kernel under QEMU TCG)", "mib": MIB, "loads": {}}
    for load in LOADS:
        rows = {name: [] for name, _ in VMMS}
        for r in range(ROUNDS):
            order = VMMS if r % 2 == 0 else VMMS[::-1]
            for name, f in order:
                try:
                    m = f(k, initrd, load)
                except Exception as e:  # a failed round is reported, not hidden
                    m = {"error": str(e)}
                print(f"bench/migration: {load} round {r} {name}: {m}", flush=True)
                rows[name].append(m)
        out["loads"][load] = rows
        with open(dest, "w") as f:
            json.dump(out, f, indent=1)



def report(src, command):
    m = benchlib.stamp(src, HERE, command, ROUNDS)
    cols = [("total_ms", "total (ms)", 1), ("downtime_ms", "downtime, the guest's view (ms)", 1),
            ("bytes", "sent (MiB)", 1 << 20)]
    lines = [
        "# bench/migration: live migration, Domus and Cloud Hypervisor v53",
        "",
        f"{m['where']}; {m['date']}; `{command}`; medians of {ROUNDS} rounds per load. "
        f"A {m['mib']} MiB guest (kit kernel, 1 vCPU, an initramfs with domus-guest) "
        "migrated to a second VMM of the same kind on the same host, downtime target "
        f"{DOWNTIME_MS} ms for both, both streams through the same relay (which counts "
        "the bytes). Downtime is the largest gap the guest's 1 ms loop saw; total is "
        "from the request to the source being done. Loads: idle; dirty (4 MiB of random "
        "bytes written every half second).",
        "",
        "| load | measure | Domus | Cloud Hypervisor | Domus / CH |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for load, rows in m["loads"].items():
        for key, label, scale in cols:
            a, b = (benchlib.med(rows.get(n, []), key) for n in ("domus", "cloud-hypervisor"))
            fa, fb = (f"{x / scale:.1f}" if x is not None else "failed" for x in (a, b))
            ratio = f"{a / b:.2f}" if a is not None and b else "n/a"
            lines.append(f"| {load} | {label} | {fa} | {fb} | {ratio} |")
        for n, rs in rows.items():
            for r in rs:
                if "error" in r:
                    lines.append(f"| {load} | a failed round ({n}) | {r['error']} | | |")
    benchlib.write_markdown(HERE, lines)


if __name__ == "__main__":
    benchlib.main(measure, report, "tools/bench-migration")
