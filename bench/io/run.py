#!/usr/bin/env python3
"""bench/io: virtio-blk, virtio-net and virtio-vsock throughput, Domus vs
QEMU vs native, in one session on one host (the nested KVM host on the
development machines), RUNS interleaved rounds.

Each round, for each VMM (Domus and QEMU, which goes first alternating by
round; QEMU is `-accel kvm -M q35` with the same kernel, initramfs, images, memory and one vCPU, all devices virtio-pci
with QEMU's defaults: cache=writeback aio=threads disks, a userspace
virtio-net backend (vhost=off, like Domus), vhost-vsock):

  * guest A boots with the kit rootfs (plus the helper as /h) as /dev/vda,
    a data image as /dev/vdb, a tap on a bridge and a vsock CID, and runs
      - `domus-guest ioload /dev/vdb SECONDS`: sequential write and read in
        1 MiB blocks, 4 KiB random read and write one at a time, O_DIRECT;
      - TCP guest -> host (the host receives on the bridge), MIB MiB;
      - vsock guest -> host (CID 2), MIB MiB;
      - then receives MIB MiB over TCP from guest B (guest -> guest), which
        the harness boots on the same bridge once A listens.
  * Native, on the host itself: ioload on the data image, and TCP over
    loopback. There is no native vsock row.

More variants, for issue 15's rows (VARIANTS=domus,domus-vfr,domus-qcow2,
domus-qcow2-used,domus-sparse,qemu,qemu-qcow2; OUT_NAME names the results
files):
`domus-vfr`, with the virtual firewall-router's rules on both taps (`domus
vfr apply`, as the daemon puts them on its domains'); `domus-qcow2` and
`qemu-qcow2`, whose root and data disks are fresh qcow2 overlays on the
same raw images (`qemu-img create -b`), as an image-based domain's root
disk is: every first write into a 64 KiB cluster allocates it, and one
that does not cover it whole copies the rest from the base; and
`domus-qcow2-used`, whose data overlay has had every cluster written
(`qemu-io`) before the guest starts, as a domain's overlay that has been
in use for a while; and `domus-sparse`, whose data disk is a fresh sparse
raw file (`truncate`): a fresh overlay is thin, so its first writes pay
the host file system's allocation as a sparse raw disk's do, and this is
the raw disk to hold it against. These four disk variants run the block
tests only: their network rows would be their VMM's own again, and guest
B's transfer is where the nested host most often stalls a round.

STORE says where the images live in the nested host: `tmpfs` (the
default, its /tmp: a file's pages are the host's memory, so a first write
into a sparse file or a fresh overlay allocates and zeroes memory while a
`fallocate`d raw file's pages exist already), or `disk` (an ext4 file
system on the nested host's scratch disk, KVM_HOST_DISK, which
tools/bench-io then gives it: where the README tells users to keep their
images; the VMMs write through the page cache there, whatever the disk's
format).

FIRST_WRITE=1 has ioload write the data disk once from start to end,
timed, before its timed tests (`ioload ... first-write`): the cost of
writing space the disk has never held, the same bytes for every disk,
where the timed tests go round the disk as often as they have time for
(so a fast disk rewrites what it wrote a second before). Every variant
(native too) then gets a data disk of its own, made fresh for it: a raw
one `fallocate`d, a sparse one truncated, an overlay on the never-written
base. BLOCK_ONLY=1 leaves out every variant's network rows.

Throughput is measured at the receiving end (accept to end of stream).
Run with tools/bench-io, which runs each round (`run.py round OUT`) in a
fresh nested host, runs again a round that fails or stalls, and then writes
results.json and results.md here (`run.py report RETRIED ROUNDS...`).
"""
import base64
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench"))
import benchlib  # noqa: E402
RUNS = int(os.environ.get("RUNS", "5"))
SECONDS = os.environ.get("SECONDS_PER_TEST", "2")
NET_MIB = int(os.environ.get("NET_MIB", "64"))
MEMORY_MIB = 512
DATA_MIB = 256
DOMUS = os.path.join(REPO, "target/release/domus")
HELPER = os.path.join(REPO, "target/x86_64-unknown-linux-gnu/release/domus-guest")
# FIRST_WRITE=1: ioload first writes the data disk once, timed, before
# the timed tests (`ioload ... first-write`), which then run on written
# space; the report shows the row when its rounds have it.
FIRST_WRITE = os.environ.get("FIRST_WRITE", "0") == "1"
BLOCK_KEYS = (["first_write_mbs"] if FIRST_WRITE else []) + [
    "seq_read_mbs", "seq_write_mbs", "rand_read_iops", "rand_write_iops"]
KEYS = BLOCK_KEYS + ["tcp_g2h_mbs", "tcp_g2g_mbs", "vsock_g2h_mbs"]
LABELS = {
    "first_write_mbs": "first sequential write of the disk (MB/s)",
    "seq_read_mbs": "sequential read (MB/s)",
    "seq_write_mbs": "sequential write (MB/s)",
    "rand_read_iops": "4 KiB random read (IOPS)",
    "rand_write_iops": "4 KiB random write (IOPS)",
    "tcp_g2h_mbs": "TCP guest to host (MB/s)",
    "tcp_g2g_mbs": "TCP guest to guest (MB/s)",
    "vsock_g2h_mbs": "vsock guest to host (MB/s)",
}
BRIDGE, TAP_A, TAP_B = "bbr0", "btapa", "btapb"
HOST_IP, A_IP, B_IP = "10.78.0.1", "10.78.0.2", "10.78.0.3"
CID = 42
VARIANTS = os.environ.get("VARIANTS", "domus,domus-jail,qemu").split(",")
OUT_NAME = os.environ.get("OUT_NAME", "results")
# Where the images live: the nested host's tmpfs, or the ext4 scratch disk
# tools/bench-io asks tools/kvm-host for (mounted at /var/tmp there).
# Each store's directory and its file system's type as stat(1) names it.
STORE = os.environ.get("STORE", "tmpfs")
STORE_DIRS = {"tmpfs": ("/tmp", "tmpfs"), "disk": ("/var/tmp", "ext2/ext3")}
# BLOCK_ONLY=1: every variant runs the block tests alone (no network rows).
BLOCK_ONLY = os.environ.get("BLOCK_ONLY", "0") == "1"
NAMES = {"native": "native", "domus": "Domus", "domus-jail": "Domus jailed",
         "domus-vfr": "Domus VFR", "domus-qcow2": "Domus qcow2",
         "domus-qcow2-used": "Domus qcow2 used", "domus-sparse": "Domus sparse raw", "qemu": "QEMU",
         "qemu-qcow2": "QEMU qcow2"}


def say(msg):
    print(f"bench/io: {msg}", file=sys.stderr, flush=True)


def say_results(who, res):
    say(f"{who}: " + ", ".join(f"{key}={res[key]}" for key in KEYS if res[key] is not None))


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, capture_output=True, text=True, **kw)


def kit():
    out = sh(DOMUS, "kit", "--print").stdout
    return dict(line.split("=", 1) for line in out.split())


def fields(out):
    vals = {}
    for word in out.split():
        if "=" in word:
            k, v = word.split("=", 1)
            try:
                vals[k] = float(v)
            except ValueError:
                vals[k] = v
    return vals


def cmdline(cmd, root):
    enc = base64.b64encode(cmd.encode()).decode()
    r = " root=/dev/vda" if root else ""
    return f"console=ttyS0 quiet panic=-1{r} domus.cmd={enc}"


def until_reachable(ip):
    """Guest shell that waits (up to about a minute) until `ip` answers a ping."""
    return f"for i in $(seq 60); do ping -c 1 -W 1 {ip} >/dev/null && break; done; "


def net_up(ip):
    return (f"ip link set lo up; ip link set eth0 up; ip addr add {ip}/24 dev eth0; "
            + until_reachable(HOST_IP))


# Variants that differ from their VMM's own only in the data disk: the
# block tests alone (the module's documentation).
DISK_VARIANTS = {"domus-sparse", "domus-qcow2", "domus-qcow2-used", "qemu-qcow2"}


def ioload_args():
    return f"{SECONDS} first-write" if FIRST_WRITE else SECONDS


def guest_a_cmd(block_only=False):
    if block_only:
        return net_up(A_IP) + f"/h ioload /dev/vdb {ioload_args()}"
    return (net_up(A_IP) + f"/h ioload /dev/vdb {ioload_args()}; "
            f"echo phase=tcp; /h send tcp {HOST_IP} 5001 {NET_MIB} >/dev/null; "
            f"echo phase=vsock; /h send vsock 2 5002 {NET_MIB} >/dev/null; "
            f"echo phase=g2g; /h recv tcp 5000 | sed 's/recv_mbs/g2g_mbs/'")


def guest_b_cmd(helper_size):
    # The echo lines say how far B got when a round stalls.
    return (f"head -c {helper_size} /dev/vda > /h; chmod +x /h; echo b=loaded; " + net_up(B_IP)
            + until_reachable(A_IP) +
            f"echo b=pinged_a:$i; sleep 1; /h send tcp {A_IP} 5000 {NET_MIB}; echo b=sent:$?")


def vmm_cmd(vmm, k, disks, tap, mac, cid, cl, domus=DOMUS):
    """disks: [(path, read_only)]; domus: the Domus binary to run."""
    if vmm.startswith("domus"):
        # As the daemon runs its VMMs: under the seccomp filter, and jailed
        # unless it has --no-jail.
        jail = ["--jail", "4000200"] if vmm == "domus-jail" else []
        c = [domus, "run", "--seccomp", *jail, "--kernel", k["kernel"], "--initrd", k["initrd"],
             "--memory", f"{MEMORY_MIB}M", "--vcpus", "1", "--cmdline", cl,
             "--net", f"tap={tap},mac={mac}"]
        for i, (path, ro) in enumerate(disks):
            if "qcow2" in vmm and not ro:
                path = overlay(path, vmm, i == 1) + ",format=qcow2"
            elif vmm == "domus-sparse" and i == 1:
                path = own_disk(path, vmm, "sparse")
            elif i == 1:
                path = fresh_raw(path, vmm)
            c += ["--disk", path + (",ro" if ro else "")]
        if cid:
            c += ["--vsock", f"cid={cid}"]
        return c
    c = [os.environ.get("KVM_HOST_QEMU", "qemu-system-x86_64"), "-accel", "kvm", "-cpu", "host", "-M", "q35",
         "-m", str(MEMORY_MIB), "-smp", "1", "-nodefaults", "-no-user-config",
         "-display", "none", "-serial", "stdio", "-no-reboot",
         "-kernel", k["kernel"], "-initrd", k["initrd"], "-append", cl,
         "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no,vhost=off",
         "-device", f"virtio-net-pci,netdev=n0,mac={mac}"]
    for i, (path, ro) in enumerate(disks):
        fmt = "raw"
        if "qcow2" in vmm and not ro:
            path, fmt = overlay(path, vmm, i == 1), "qcow2"
        elif i == 1:
            path = fresh_raw(path, vmm)
        c += ["-drive", f"file={path},if=none,id=d{i},format={fmt}" + (",readonly=on" if ro else ""),
              "-device", f"virtio-blk-pci,drive=d{i}"]
    if cid:
        c += ["-device", f"vhost-vsock-pci,guest-cid={cid}"]
    return c


def overlay(path, vmm, data):
    """`vmm`'s qcow2 overlay on raw image `path` (made once per round and
    variant); the data disk's has every cluster written first in the
    `-used` variants."""
    top = f"{path}.{vmm}.qcow2"
    if not os.path.exists(top):
        sh("qemu-img", "create", "-q", "-f", "qcow2", "-b", path, "-F", "raw", top)
        if data and vmm.endswith("-used"):
            sh("qemu-io", "-f", "qcow2", "-c", f"write -P 0x5a 0 {DATA_MIB}M", top)
    return top


def own_disk(path, vmm, kind):
    """A fresh raw file as large as `path` for `vmm` alone (made once per
    round and variant): `sparse` (truncate) or `raw` (fallocate)."""
    own = f"{path}.{vmm}.{kind}"
    if not os.path.exists(own):
        size = str(os.path.getsize(path))
        sh(*(("truncate", "-s") if kind == "sparse" else ("fallocate", "-l")), size, own)
    return own


def fresh_raw(path, vmm):
    """With FIRST_WRITE, `vmm`'s own fresh fallocated data disk; else
    `path`, the data disk every raw variant shares."""
    return own_disk(path, vmm, "raw") if FIRST_WRITE else path


def vfr(on):
    """The VFR's rules on both taps (domus-vfr), or none."""
    for tap, mac, ip in ((TAP_A, "52:54:00:00:00:0a", A_IP), (TAP_B, "52:54:00:00:00:0b", B_IP)):
        if on:
            sh(DOMUS, "vfr", "apply", tap, f"mac={mac},ip={ip}")
        else:
            subprocess.run([DOMUS, "vfr", "remove", tap], capture_output=True)


def receiver(kind, port):
    return subprocess.Popen([HELPER, "recv", kind, str(port)], stdout=subprocess.PIPE, text=True)


def one_round(vmm, k, root, data, helper_img, helper_size):
    """Runs guest A (and B) under `vmm`; returns the measurements."""
    block_only = vmm in DISK_VARIANTS or BLOCK_ONLY
    say(f"{vmm}: guest A (block" + (" only)" if block_only else ", TCP and vsock to the host)"))
    # The host's receivers of guest A's streams (none for the block tests
    # alone).
    tcp, vs = (None, None) if block_only else (receiver("tcp", 5001), receiver("vsock", 5002))
    time.sleep(0.2)
    a = subprocess.Popen(
        vmm_cmd(vmm, k, [(root, False), (data, False)], TAP_A, "52:54:00:00:00:0a", CID,
                cmdline(guest_a_cmd(block_only), True)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, b = [], None
    why = []

    def guard():
        # A guest that is stuck prints nothing, so the loop below cannot see
        # the time pass. Stop the guests (and say why) when A has run for
        # 600 s, B for 240 s, or A for 60 s after B ended (its receiver would
        # wait for ever); tools/bench-io stops a round after 300 s of silence.
        start, b_start, b_end = time.time(), None, None
        while a.poll() is None:
            time.sleep(1)
            now = time.time()
            if b is not None and b_start is None:
                b_start = now
            if b is not None and b_end is None and b.poll() is not None:
                b_end = now
            if now - start > 600:
                why.append("guest A ran for 600 s")
            elif b_end is None and b_start is not None and now - b_start > 240:
                why.append("guest B ran for 240 s")
                b.kill()
            elif b_end is not None and now - b_end > 60:
                why.append(f"guest A still ran 60 s after guest B ended (exit status {b.returncode})")
            else:
                continue
            a.kill()
            return

    threading.Thread(target=guard, daemon=True).start()
    for line in a.stdout:
        out.append(line)
        word = line.strip()
        # Progress on stderr: tools/bench-io stops a round that prints
        # nothing for a while (a frozen nested host).
        if word in ("phase=tcp", "phase=vsock"):
            say(f"{vmm}: guest A: {word[6:]} to the host")
        elif any(f"{key}=" in line for key in BLOCK_KEYS):
            say(f"{vmm}: guest A: {word}")
        if word == "phase=g2g" and b is None:
            say(f"{vmm}: guest B (TCP to guest A)")
            b = subprocess.Popen(
                vmm_cmd(vmm, k, [(helper_img, True)], TAP_B, "52:54:00:00:00:0b", None,
                        cmdline(guest_b_cmd(helper_size), False)),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    a.wait()
    text = "".join(out)
    if b is not None:
        try:
            b_out, b_err = b.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            b.kill()
            b_out, b_err = b.communicate()
            why.append("guest B still ran 120 s after guest A ended")
    receivers = [r for r in (tcp, vs) if r is not None]
    if why:
        for r in receivers:
            r.kill()
        b_text = f"\nguest B output:\n{b_out[-2000:]}\n{b_err[-2000:]}" if b is not None else ""
        raise RuntimeError(f"{vmm}: {'; '.join(why)}; guest A output:\n{text[-3000:]}\n"
                           f"{a.stderr.read()[-2000:]}{b_text}")
    try:
        tcp_out, vs_out = [r.communicate(timeout=10)[0] for r in receivers] or ["", ""]
    except subprocess.TimeoutExpired:
        for r in receivers:
            r.kill()
        raise RuntimeError(f"{vmm}: the host never got the guest's streams; guest output:\n"
                           f"{text[-3000:]}\n{a.stderr.read()[-2000:]}")
    v = fields(text)
    res = {key: v.get(key) for key in BLOCK_KEYS}
    res["direct"] = v.get("direct")
    res["tcp_g2h_mbs"] = fields(tcp_out).get("recv_mbs")
    res["vsock_g2h_mbs"] = fields(vs_out).get("recv_mbs")
    res["tcp_g2g_mbs"] = v.get("g2g_mbs")
    missing = [key for key in (BLOCK_KEYS if block_only else KEYS) if res.get(key) is None]
    if missing:
        raise RuntimeError(f"{vmm}: no {missing}; the VMM's exit status {a.returncode}; "
                           f"guest output:\n{text[-3000:]}\nVMM's stderr:\n"
                           f"{a.stderr.read()[-3000:]}")
    say_results(vmm, res)
    return res


def native(data):
    say("native")
    v = fields(sh(HELPER, "ioload", data, *ioload_args().split()).stdout)
    r = receiver("tcp", 5003)
    time.sleep(0.2)
    sh(HELPER, "send", "tcp", "127.0.0.1", "5003", str(NET_MIB))
    tcp_out, _ = r.communicate(timeout=60)
    res = {key: v[key] for key in BLOCK_KEYS}
    res["direct"] = v.get("direct")
    res["tcp_g2h_mbs"] = res["tcp_g2g_mbs"] = fields(tcp_out)["recv_mbs"]
    res["vsock_g2h_mbs"] = None
    say_results("native", res)
    return res


def bridge(up):
    if not up:
        for link in (TAP_A, TAP_B, BRIDGE):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        return
    bridge(False)
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{HOST_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for t in (TAP_A, TAP_B):
        sh("ip", "tuntap", "add", "dev", t, "mode", "tap")
        sh("ip", "link", "set", t, "master", BRIDGE)
        sh("ip", "link", "set", t, "up")


def store_fs(path):
    """The type of the file system `path` is on, as stat(1) names it
    (`tmpfs`, `ext2/ext3` for ext4 too)."""
    return sh("stat", "-f", "-c", "%T", path).stdout.strip()


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def workspace(k, prefix):
    """A directory on STORE's file system (checked to be the one expected)
    with the round's images: the kit's root file system with the helper as
    /h, a fallocated data disk, and the helper alone padded to whole sectors
    (guest B's disk). Returns (dir, root, data, helper image, helper size)."""
    if STORE not in STORE_DIRS:
        sys.exit(f"STORE={STORE}: expected one of {', '.join(STORE_DIRS)}")
    where, want = STORE_DIRS[STORE]
    fs = store_fs(where)
    if fs != want:
        sys.exit(f"STORE={STORE}: {where} is {fs}, not {want} "
                 "(STORE=disk needs tools/kvm-host's scratch disk, KVM_HOST_DISK)")
    work = tempfile.mkdtemp(prefix=prefix, dir=where)
    root = os.path.join(work, "root.img")
    data = os.path.join(work, "data.img")
    helper_img = os.path.join(work, "helper.img")
    shutil.copy(k["rootfs"], root)
    sh("debugfs", "-w", "-R", f"write {HELPER} /h", root)
    sh("fallocate", "-l", f"{DATA_MIB}M", data)
    helper_size = os.path.getsize(HELPER)
    shutil.copy(HELPER, helper_img)
    with open(helper_img, "ab") as f:
        f.write(b"\0" * (-helper_size % 512))
    return work, root, data, helper_img, helper_size


def remove_made(root, data, vmm):
    """Removes the disks `vmm`'s run made for itself (overlay, own disks)."""
    for p in (root, data):
        for made in (f"{p}.{vmm}.qcow2", f"{p}.{vmm}.sparse", f"{p}.{vmm}.raw"):
            if os.path.exists(made):
                os.remove(made)


def one_full_round(out_path):
    """Native, Domus (jailed and not) and QEMU once; writes {"native": .., "domus": ..,
    "domus-jail": .., "qemu": ..}."""
    k = kit()
    work, root, data, helper_img, helper_size = workspace(k, "domus-bench-io-")
    bridge(True)
    try:
        res = {"store": STORE, "native": native(fresh_raw(data, "native"))}
        # Alternate which VMM goes first, so neither always runs on a
        # fresher host (ROUND is the round's number, from tools/bench-io).
        order = list(VARIANTS)
        turn = int(os.environ.get("ROUND", "1")) % len(order)
        order = order[turn:] + order[:turn]
        for vmm in order:
            vfr(vmm == "domus-vfr")
            try:
                res[vmm] = one_round(vmm, k, root, data, helper_img, helper_size)
            finally:
                vfr(False)
            remove_made(root, data, vmm)
    finally:
        bridge(False)
        shutil.rmtree(work, ignore_errors=True)
    with open(out_path, "w") as f:
        json.dump(res, f)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "round":
        if not os.path.exists(HELPER):
            sys.exit(f"{HELPER} missing: run tools/bench-io")
        return one_full_round(sys.argv[2])
    if len(sys.argv) < 3 or sys.argv[1] != "report":
        sys.exit("usage: run.py round OUT.json | run.py report RETRIED ROUND.json...")
    retried = int(sys.argv[2])
    rounds = []
    for p in sys.argv[3:]:
        with open(p) as f:
            rounds.append(json.load(f))
    stores = {r.get("store", "tmpfs") for r in rounds}
    if len(stores) != 1:
        sys.exit(f"rounds measured on different stores: {', '.join(sorted(stores))}")
    store = stores.pop()
    names = [n for n in NAMES if all(n in r for r in rounds)]
    # The rows the rounds measured (first_write_mbs only with FIRST_WRITE,
    # no network rows with BLOCK_ONLY).
    global KEYS
    KEYS = [key for key in LABELS if any(r["domus"].get(key) is not None for r in rounds)]
    results = {n: [r[n] for r in rounds] for n in names}
    jailed = "domus-jail" in results
    global RUNS
    RUNS = len(rounds)
    median = {n: {key: med(x[key] for x in runs) for key in KEYS} for n, runs in results.items()}

    def ratio(a, b):
        return a / b if a is not None and b else None

    doc = {
        "benchmark": "bench/io",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": os.environ.get("BENCH_COMMAND", "tools/bench-io"),
        "machine": benchlib.machine(),
        "config": {"runs": RUNS, "rounds_retried": retried, "seconds_per_block_test": float(SECONDS), "net_mib": NET_MIB,
                   "memory_mib": MEMORY_MIB, "vcpus": 1, "data_mib": DATA_MIB,
                   "guest_direct_io": all(x.get("direct") == 1 for x in results["domus"]),
                   "native_direct_io": all(x.get("direct") == 1 for x in results["native"]),
                   "qemu_net_backend": "tap, vhost=off", "domus_net_backend": "tap, userspace",
                   "vsock_backend": "vhost-vsock (both)", "store": store,
                   "first_write": "first_write_mbs" in KEYS},
        "runs": results,
        "median": median,
        "ratios": {key: {"domus_vs_qemu": ratio(median["domus"][key], median["qemu"][key]),
                         "domus_vs_native": ratio(median["domus"][key], median["native"][key]),
                         "jail_vs_no_jail": ratio(median["domus-jail"][key], median["domus"][key])
                         if jailed else None,
                         "vfr_vs_no_vfr": ratio(median["domus-vfr"][key], median["domus"][key])
                         if "domus-vfr" in median else None,
                         "qcow2_vs_raw": ratio(median["domus-qcow2"][key], median["domus"][key])
                         if "domus-qcow2" in median else None,
                         "qcow2_used_vs_raw": ratio(median["domus-qcow2-used"][key], median["domus"][key])
                         if "domus-qcow2-used" in median else None,
                         "qemu_qcow2_vs_raw": ratio(median["qemu-qcow2"][key], median["qemu"][key])
                         if "qemu-qcow2" in median else None,
                         "qcow2_vs_sparse": ratio(median["domus-qcow2"][key], median["domus-sparse"][key])
                         if "domus-qcow2" in median and "domus-sparse" in median else None}
                   for key in KEYS},
    }
    with open(os.path.join(HERE, f"{OUT_NAME}.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    def fmt(x, p=0):
        return "n/a" if x is None else f"{x:.{p}f}"

    lines = [
        "# bench/io results",
        "",
        f"{doc['date']} on `{doc['machine']['host']}` ({doc['machine']['cpus']} CPUs, kernel "
        f"{doc['machine']['kernel']}), in the nested KVM host; command `{os.environ.get('BENCH_COMMAND', 'tools/bench-io')}`; "
        f"medians of {RUNS} rounds; block tests {SECONDS} s each on a {DATA_MIB} MiB data "
        + ("disk (after a first write of all of it, its own row), " if "first_write_mbs" in KEYS else "disk, ")
        + f"network tests {NET_MIB} MiB each; guests have 1 vCPU and {MEMORY_MIB} MiB.",
        "",
    ]
    extra = [("jail_vs_no_jail", "jailed/Domus", "domus-jail"),
             ("vfr_vs_no_vfr", "VFR/Domus", "domus-vfr"),
             ("qcow2_vs_raw", "qcow2/Domus", "domus-qcow2"),
             ("qcow2_used_vs_raw", "qcow2 used/Domus", "domus-qcow2-used"),
             ("qemu_qcow2_vs_raw", "QEMU qcow2/QEMU", "qemu-qcow2"),
             ("qcow2_vs_sparse", "qcow2/sparse raw", "domus-sparse")]
    extra = [e for e in extra if e[2] in median and (e[0] != "qcow2_vs_sparse" or "domus-qcow2" in median)]
    head = ["test"] + [NAMES[n] for n in names] + ["Domus/QEMU", "Domus/native"] + [e[1] for e in extra]
    lines += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for key in KEYS:
        r = doc["ratios"][key]
        cells = ([LABELS[key]] + [fmt(median[n][key]) for n in names]
                 + [fmt(r["domus_vs_qemu"], 2), fmt(r["domus_vs_native"], 2)]
                 + [fmt(r[e[0]], 2) for e in extra])
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Guests use O_DIRECT on /dev/vdb; the image lives on "
        + ("the host's tmpfs" if store == "tmpfs" else
           "an ext4 file system on the host's scratch disk (STORE=disk)")
        + ", where native's O_DIRECT is " + ("used" if doc["config"]["native_direct_io"] else
                                              "not available, so native block numbers are page-cache copies") + "."
        + (" The VMMs' own writes into the images go through the host's page cache (both VMMs "
           "open them buffered); at writeback ext4 allocates blocks for a sparse or a qcow2 "
           "file's new space and converts a fallocated file's unwritten extents."
           if store == "disk" else
           " On tmpfs a file's pages are the host's memory: a first write into a sparse file or "
           "a fresh overlay allocates and zeroes them, a fallocated raw file's exist already."),
        "Native TCP is loopback on the host (both TCP rows); there is no native vsock row.",
        "Both VMMs use a userspace virtio-net backend on the same taps and bridge, and "
        "vhost-vsock. Domus runs under its seccomp filter; \"Domus jailed\" also in its jail "
        "(`domus run --jail`, as `domus daemon` runs VMMs by default); \"Domus VFR\" with "
        "the virtual firewall-router's rules on both taps (`domus vfr apply`, as the daemon "
        "puts them); \"qcow2\" with both disks as fresh qcow2 overlays on the raw images "
        "(64 KiB clusters: a cluster's first write allocates it and copies from the base what "
        "the write does not cover), \"qcow2 used\" with every cluster of the data overlay "
        "written before the guest starts, \"sparse raw\" with a fresh sparse raw data disk "
        "(truncate). The raw data disk is allocated (fallocate)."
        + (" The first-write row writes each data disk once from start to end before the timed "
           "rows, which then run on space written once (a fresh overlay's rows after it are a "
           "used overlay's); the timed rows go round the disk as often as they have time for. "
           "Each variant, native's too, has a data disk of its own, made fresh for it."
           if "first_write_mbs" in KEYS else ""),
        f"Each round runs in a fresh nested host; {retried} attempt(s) failed or stalled "
        "(see README, known issues) and were run again.",
        "",
        "Domus/QEMU per round:",
        "",
        "| round | " + " | ".join(LABELS[key] for key in KEYS) + " |",
        "| ---: |" + " ---: |" * len(KEYS),
    ]
    for i, (d, q) in enumerate(zip(results["domus"], results["qemu"]), 1):
        lines.append(f"| {i} | " + " | ".join(fmt(ratio(d[key], q[key]), 2) for key in KEYS) + " |")
    lines.append("")
    with open(os.path.join(HERE, f"{OUT_NAME}.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
