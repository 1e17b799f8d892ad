#!/usr/bin/env python3
"""bench/snapshot: save and restore, Domus beside Cloud Hypervisor v53 and
Firecracker v1.16.

Run inside the nested KVM host by tools/bench-snapshot (`run.py measure
OUT`), then `run.py report OUT` here. For each guest size (SIZES, MiB) and
ROUNDS rounds, each VMM boots the kit's kernel and initramfs with 1 vCPU;
the guest fills an eighth of its memory with random bytes, then prints
`tick` every 20 ms. Then, for each VMM:

  * save: the time from the request to the snapshot on disk (Domus: PUT
    /v1/domain/snapshot, which pauses; Cloud Hypervisor: ch-remote pause,
    then snapshot), and its size (apparent, and allocated on disk);
  * restore: the time from starting the restoring VMM to its API saying the
    guest runs (Domus: GET /v1/domain says running; Cloud Hypervisor, which
    restores paused: ch-remote resume returned; Firecracker: PUT
    /snapshot/load with resume_vm answered), and to the guest's next `tick`
    on its console.

Firecracker boots the ELF vmlinux only (the others the bzImage), and saves
with PATCH /vm Paused then PUT /snapshot/create (a full snapshot).

Snapshots go to the nested host's /tmp (a tmpfs) for all, and the VMMs'
binaries are run from copies there. Ratios are
Domus / Cloud Hypervisor and Domus / Firecracker in the same run; absolute times in the nested
host are about ten times native.
"""
import json
import os
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
PEERS = os.path.join(os.path.dirname(REPO), "shared/peers")
CH = os.path.join(PEERS, "cloud-hypervisor")
CH_REMOTE = os.path.join(PEERS, "ch-remote")
FC = os.path.join(PEERS, "firecracker")
SIZES = [int(s) for s in os.environ.get("SIZES", "128,512,2048").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
WORK = "/tmp/bench-snapshot"


def kit():
    out = subprocess.run([DOMUS, "kit", "--print"], check=True, capture_output=True,
                         text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def guest_cmd(mib):
    fill = max(mib // 8, 1)
    return (f"console=ttyS0 quiet panic=-1 -- dd if=/dev/urandom of=/tmp/fill bs=1M "
            f"count={fill} 2>/dev/null; echo filled; while :; do echo tick; sleep 0.02; done")


class Console:
    """Reads a VMM's stdout (the guest's serial console) line by line, and
    remembers when each awaited line arrived."""

    def __init__(self, proc):
        self.proc = proc
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            with self.cv:
                self.lines.append((time.monotonic(), line))
                self.cv.notify_all()

    def wait(self, text, after=0.0, timeout=300):
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, line in self.lines:
                    if t >= after and text in line:
                        return t
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self.lines:
                    raise TimeoutError(f"no '{text}' on the console")
                self.cv.wait(min(left, 0.5))


def wait_socket(sock, proc, timeout=120):
    end = time.monotonic() + timeout
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(f"no API socket {sock}")
        time.sleep(0.005)


def sizes_of(paths):
    apparent = sum(os.stat(p).st_size for p in paths)
    allocated = sum(os.stat(p).st_blocks * 512 for p in paths)
    return apparent, allocated


def kill(proc):
    proc.kill()
    proc.wait()


def finish_round(d, back, con2, t0, save_ms, apparent, allocated):
    """A round's numbers once the restored guest runs (now): the times
    since t0 to running and to its next console tick; the restored VMM is
    killed and the round's directory removed."""
    running_ms = (time.monotonic() - t0) * 1000
    tick_ms = (con2.wait("tick", after=t0) - t0) * 1000
    kill(back)
    shutil.rmtree(d, ignore_errors=True)
    return {"save_ms": save_ms, "apparent_bytes": apparent, "allocated_bytes": allocated,
            "restore_running_ms": running_ms, "restore_console_ms": tick_ms}


def domus_round(k, mib):
    d = os.path.join(WORK, f"domus-{mib}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    api, api2, snap = f"{d}/api.sock", f"{d}/api2.sock", f"{d}/guest.snap"
    boot = subprocess.Popen(
        [DOMUS, "run", "--seccomp", "--kernel", k["kernel"], "--initrd", k["initrd"],
         "--memory", f"{mib}M", "--api-socket", api, "--console", "stdout",
         "--cmdline", guest_cmd(mib)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    con = Console(boot)
    con.wait("filled")
    con.wait("tick", after=time.monotonic())
    t0 = time.monotonic()
    status, text = http(api, "PUT", "/v1/domain/snapshot", {"path": snap})
    save_ms = (time.monotonic() - t0) * 1000
    if status != 200:
        raise RuntimeError(f"domus save: {status} {text}")
    kill(boot)
    apparent, allocated = sizes_of([snap, snap + ".mem"])
    t0 = time.monotonic()
    back = subprocess.Popen(
        [DOMUS, "run", "--seccomp", "--restore", snap, "--api-socket", api2,
         "--console", "stdout"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    con2 = Console(back)
    wait_socket(api2, back)
    while True:
        try:
            status, text = http(api2, "GET", "/v1/domain")
            if status == 200 and json.loads(text).get("state") == "running":
                break
        except OSError:
            pass
        time.sleep(0.002)
    return finish_round(d, back, con2, t0, save_ms, apparent, allocated)


def ch_remote(sock, *args):
    subprocess.run([CH_REMOTE, "--api-socket", sock, *args], check=True,
                   capture_output=True, timeout=600)


def ch_round(k, mib):
    d = os.path.join(WORK, f"ch-{mib}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(f"{d}/snap")
    api, api2 = f"{d}/api.sock", f"{d}/api2.sock"
    boot = subprocess.Popen(
        [CH, "--kernel", k["kernel"], "--initramfs", k["initrd"], "--cmdline", guest_cmd(mib),
         "--cpus", "boot=1", "--memory", f"size={mib}M", "--serial", "tty", "--console", "off",
         "--api-socket", api],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    con = Console(boot)
    con.wait("filled")
    con.wait("tick", after=time.monotonic())
    t0 = time.monotonic()
    ch_remote(api, "pause")
    ch_remote(api, "snapshot", f"file://{d}/snap")
    save_ms = (time.monotonic() - t0) * 1000
    kill(boot)
    files = [os.path.join(f"{d}/snap", f) for f in os.listdir(f"{d}/snap")]
    apparent, allocated = sizes_of(files)
    t0 = time.monotonic()
    back = subprocess.Popen(
        [CH, "--api-socket", api2, "--restore", f"source_url=file://{d}/snap"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    con2 = Console(back)
    wait_socket(api2, back)
    while True:
        try:
            ch_remote(api2, "resume")
            break
        except subprocess.CalledProcessError:
            time.sleep(0.002)
    return finish_round(d, back, con2, t0, save_ms, apparent, allocated)


def http(sock, method, path, body=None, timeout=600):
    """One request to a VMM's API socket; the answer is read up to its
    Content-Length (Firecracker keeps the connection open)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock)
    data = json.dumps(body).encode() if body is not None else b""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Accept: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    head, _, rest = out.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    s.close()
    return int(head.split()[1]), rest.decode(errors="replace")


def fc_round(k, mib):
    d = os.path.join(WORK, f"fc-{mib}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    api, api2 = f"{d}/api.sock", f"{d}/api2.sock"
    snap, mem = f"{d}/vm.snap", f"{d}/vm.mem"
    vmlinux = os.path.join(os.path.dirname(k["kernel"]), "vmlinux")
    with open(f"{d}/config.json", "w") as f:
        json.dump({"boot-source": {"kernel_image_path": vmlinux, "initrd_path": k["initrd"],
                                   "boot_args": guest_cmd(mib).replace(" -- ", " reboot=k -- ", 1)},
                   "machine-config": {"vcpu_count": 1, "mem_size_mib": mib},
                   "drives": []}, f)
    boot = subprocess.Popen([FC, "--api-sock", api, "--config-file", f"{d}/config.json"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    con = Console(boot)
    con.wait("filled")
    con.wait("tick", after=time.monotonic())
    t0 = time.monotonic()
    for method, path, body in (("PATCH", "/vm", {"state": "Paused"}),
                               ("PUT", "/snapshot/create", {"snapshot_type": "Full",
                                                            "snapshot_path": snap,
                                                            "mem_file_path": mem})):
        status, text = http(api, method, path, body)
        if status >= 300:
            raise RuntimeError(f"firecracker {method} {path}: {status} {text}")
    save_ms = (time.monotonic() - t0) * 1000
    kill(boot)
    apparent, allocated = sizes_of([snap, mem])
    t0 = time.monotonic()
    back = subprocess.Popen([FC, "--api-sock", api2], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    con2 = Console(back)
    wait_socket(api2, back)
    status, text = http(api2, "PUT", "/snapshot/load",
                           {"snapshot_path": snap, "resume_vm": True,
                            "mem_backend": {"backend_path": mem, "backend_type": "File"}})
    if status >= 300:
        raise RuntimeError(f"firecracker snapshot/load: {status} {text}")
    return finish_round(d, back, con2, t0, save_ms, apparent, allocated)


VMMS = (("domus", domus_round), ("cloud-hypervisor", ch_round), ("firecracker", fc_round))


def local_copies():
    """Copies of the three VMMs' binaries in the nested host's tmpfs: run
    from the host's files (9p, read as pages fault in) each start paid for
    its binary's size, about 100 ms more for Domus's 9 MiB than from
    memory (2026-11-25)."""
    global DOMUS, CH, CH_REMOTE, FC
    bindir = os.path.join(WORK, "bin")
    os.makedirs(bindir, exist_ok=True)
    copies = []
    for path in (DOMUS, CH, CH_REMOTE, FC):
        to = os.path.join(bindir, os.path.basename(path))
        shutil.copy2(path, to)
        copies.append(to)
    DOMUS, CH, CH_REMOTE, FC = copies


def measure(dest):
    k = kit()
    local_copies()
    out = {"where": "nested KVM host (Debian kernel under QEMU TCG)", "sizes": {}}
    for mib in SIZES:
        rows = {name: [] for name, _ in VMMS}
        for r in range(ROUNDS):
            for name, f in VMMS:
                try:
                    m = f(k, mib)
                except Exception as e:  # a failed round is reported, not hidden
                    m = {"error": str(e)}
                print(f"bench/snapshot: {mib} MiB round {r} {name}: {m}", flush=True)
                rows[name].append(m)
        out["sizes"][str(mib)] = rows
    with open(dest, "w") as f:
        json.dump(out, f, indent=1)



def report(src, command):
    m = benchlib.stamp(src, HERE, command, ROUNDS)
    cols = [("save_ms", "save (ms)"), ("restore_running_ms", "restore to running (ms)"),
            ("restore_console_ms", "restore to the guest's console (ms)"),
            ("apparent_bytes", "snapshot, apparent (MiB)"),
            ("allocated_bytes", "snapshot, on disk (MiB)")]
    lines = [
        "# bench/snapshot: save and restore, Domus, Cloud Hypervisor v53 and Firecracker v1.16",
        "",
        f"{m['where']}; {m['date']}; `{command}`; medians of {ROUNDS} rounds per size. "
        "Each guest (kit kernel and initramfs, 1 vCPU; Firecracker the ELF vmlinux, the "
        "others the bzImage) filled an eighth of its memory "
        "with random bytes, then printed a line every 20 ms; snapshots on the nested "
        "host's tmpfs, the VMMs run from copies in it. Restore is timed from starting "
        "the restoring VMM.",
        "",
        "| guest | measure | Domus | Cloud Hypervisor | Firecracker | Domus / CH | Domus / FC |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mib, rows in m["sizes"].items():
        for key, label in cols:
            a, b, c = (benchlib.med(rows.get(n, []), key)
                       for n in ("domus", "cloud-hypervisor", "firecracker"))
            scale = (1 << 20) if key.endswith("bytes") else 1
            fa, fb, fc = (f"{x / scale:.1f}" if x is not None else "failed" for x in (a, b, c))
            rb, rc = (f"{a / x:.2f}" if a is not None and x else "n/a" for x in (b, c))
            lines.append(f"| {mib} MiB | {label} | {fa} | {fb} | {fc} | {rb} | {rc} |")
        errors = [r["error"] for n in rows.values() for r in n if "error" in r]
        for e in errors:
            lines.append(f"| {mib} MiB | a failed round | {e} | | | | |")
    benchlib.write_markdown(HERE, lines)


if __name__ == "__main__":
    benchlib.main(measure, report, "tools/bench-snapshot")
