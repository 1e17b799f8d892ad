"""What the bench scripts share: medians of rounds, the results files with
the run's date and command, and the `measure OUT` / `report OUT [COMMAND]`
entry point (measure runs in the nested host, report here); and for the
benchmarks of image-based domains (bench/image, bench/paper), the daemon,
its leases and QEMU booting the same image."""
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time


def med(rows, key):
    """The median of `key` over the rounds that have it (None if none)."""
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else None


def stamp(src, here, command, rounds):
    """Reads the measurements in `src`, adds the date, command and round
    count, writes them to `here`/results.json and returns them."""
    with open(src) as f:
        m = json.load(f)
    m["date"] = datetime.date.today().isoformat()
    m["command"] = command
    m["rounds"] = rounds
    with open(os.path.join(here, "results.json"), "w") as f:
        json.dump(m, f, indent=1)
    return m


def machine():
    """The machine a record is made on: its name, kernel and CPUs where
    this runs, and the KVM the measurements ran on."""
    return {"host": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "kvm": "nested KVM host under QEMU TCG (tools/kvm-host)"}


def boot_id():
    """This (nested) host's kernel boot id, which tells one host from the
    next: records keep it so that ratios can be taken within a host."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def write_markdown(here, lines):
    """Writes `here`/results.md and prints it."""
    with open(os.path.join(here, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(measure, report, default_command):
    """`run.py measure OUT` or `run.py report OUT [COMMAND...]`."""
    if sys.argv[1] == "measure":
        measure(sys.argv[2])
    else:
        report(sys.argv[2], " ".join(sys.argv[3:]) or default_command)


# What the benchmarks of image-based domains share (bench/image,
# bench/paper): the daemon, its leases, QEMU booting the same image.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOMUS = os.path.join(REPO, "target/release/domus")


def domus(state, *args, check=True):
    """`domus ARGS...` against the daemon in `state`; its stdout."""
    r = subprocess.run([DOMUS, *args], env=dict(os.environ, DOMUS_STATE_DIR=state),
                       capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"domus {' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout


def start_daemon(state, images, bridge, gateway, log, more_dirs=()):
    """A daemon on `state` serving `images` (and `more_dirs`), its default
    network on `bridge` with `gateway`/24, its log to the file `log`;
    returns once its socket answers."""
    dirs = [a for d in [images, *more_dirs] for a in ("--image-dir", d)]
    daemon = subprocess.Popen([DOMUS, "daemon", "--state-dir", state, *dirs,
                               "--network-bridge", bridge, "--network", f"{gateway}/24"],
                              stderr=log)
    while not os.path.exists(os.path.join(state, "domusd.sock")):
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon ended at start (its log: {log.name})")
        time.sleep(0.1)
    time.sleep(1)
    return daemon


def stop_daemon(daemon, state):
    """Kills the daemon and every VMM it started."""
    daemon.kill()
    daemon.wait()
    subprocess.run(["pkill", "-9", "-f", f"api-socket {state}/"], capture_output=True)


def domain_lease(state, name):
    """The address the daemon's DHCP leased to domain `name` (its
    `network-list`), or None while it has none. A domain the daemon does
    not have (gone, or never made) raises LookupError with the CLI's
    error."""
    r = subprocess.run([DOMUS, "network-list", "--json", name],
                       env=dict(os.environ, DOMUS_STATE_DIR=state), capture_output=True, text=True)
    if r.returncode != 0:
        raise LookupError(r.stderr.strip())
    devs = json.loads(r.stdout)
    return next((d["info"].get("ip") for d in devs if d["info"].get("ip")), None)


def lease_of(state, bridge, mac):
    """The address the daemon's dnsmasq leased to `mac`, or None."""
    try:
        with open(os.path.join(state, "network", f"{bridge}.leases")) as f:
            for line in f:
                w = line.split()
                if len(w) >= 3 and w[1].lower() == mac:
                    return w[2]
    except FileNotFoundError:
        pass
    return None


def last_lines(path, n):
    """The last `n` lines of the file `path` ("" if it cannot be read)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


def ssh_banner(ip, deadline):
    """True once `ip`:22 answers with an SSH banner, False at `deadline`
    (time.monotonic())."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((ip, 22), timeout=2) as s:
                s.settimeout(5)
                if s.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def image_record(images, name):
    """Image `name`'s kernel, initrd and base disk (absolute paths) and root
    device, from its image.json."""
    d = os.path.join(images, name)
    with open(os.path.join(d, "image.json")) as f:
        rec = json.load(f)
    return {"kernel": os.path.join(d, rec["kernel"]), "initrd": os.path.join(d, rec["initrd"]),
            "disk": os.path.join(d, rec["disk"]), "root": rec.get("root") or "/dev/vda"}


def add_tap(tap, bridge):
    subprocess.run(["ip", "tuntap", "add", "dev", tap, "mode", "tap"], check=True)
    subprocess.run(["ip", "link", "set", tap, "master", bridge, "up"], check=True)


def del_tap(tap):
    subprocess.run(["ip", "link", "del", tap], capture_output=True)


def qemu_image_cmd(rec, top, seed, tap, mac, vcpus, memory_mib, console):
    """QEMU booting an image as the daemon boots its domain: `-accel kvm
    -cpu host -M q35`, the image's kernel and initrd, the qcow2 overlay
    `top` on its base and the cloud-init `seed` as virtio disks, a virtio
    NIC on `tap`; the serial console to the file `console`. -no-reboot: a
    guest reset (the nested host's triple faults) ends QEMU. No image
    locking: the base lies on the nested host's 9p root, where the Domus
    VMM's flock of it is a POSIX lock, which QEMU's OFD lock protocol reads
    as another user's refusal to share it."""
    qemu = os.environ.get("KVM_HOST_QEMU", "qemu-system-x86_64")
    return [qemu, "-accel", "kvm", "-cpu", "host", "-M", "q35", "-m", str(memory_mib),
            "-no-reboot", "-smp", str(vcpus), "-nodefaults", "-no-user-config",
            "-display", "none", "-serial", f"file:{console}",
            "-kernel", rec["kernel"], "-initrd", rec["initrd"],
            "-append", f"root={rec['root']} rw console=ttyS0",
            "-drive", f"file={top},if=virtio,format=qcow2,file.locking=off,backing.file.locking=off",
            "-drive", f"file={seed},if=virtio,format=raw,readonly=on",
            "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=n0,mac={mac}"]


def qemu_overlay(base, top):
    """A fresh qcow2 overlay `top` on `base` (qemu-img create -b)."""
    if os.path.exists(top):
        os.remove(top)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", top],
                   check=True)
