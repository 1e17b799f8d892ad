"""Where bench/paper's workloads run: natively in the nested host, in a
Domus domain, in a QEMU guest. Each runs a shell command and returns its
output; the guests run the same Debian image (`domus image build` with the
benchmark packages) with the same vCPUs and memory, and only one of them
runs at a time: the others are paused (`domus pause`, SIGSTOP for QEMU).
"""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench"))
import benchlib  # noqa: E402
import domus_api  # noqa: E402
HELPER = os.path.join(REPO, "target/x86_64-unknown-linux-gnu/release/domus-guest")
BRIDGE, GATEWAY = "dpaper0", "10.205.0.1"
QEMU_MAC, QEMU_TAP = "52:54:00:be:ef:05", "qpaper0"
CH_MAC, CH_TAP = "52:54:00:be:ef:06", "cpaper0"
UP_TIMEOUT_S = 600
# Where a Domus domain's VMM capture goes when its guest fails a trial
# (Domus.capture; run.py sets it beside OUT.json, which outlives the
# nested host); None: no capture.
CAPTURES = None
SOAK = os.path.join(REPO, "tools", "soak.py")
# dnsmasq's lines of each DHCP option and request detail (`log-dhcp`),
# left out of the evidence's daemon lines so that its last ones say more
# than one exchange's options.
DHCP_DETAIL = re.compile(r"dnsmasq-dhcp\[\d+\]: \d+ (sent size|requested options|available DHCP range|"
                         r"next server|vendor class|user class|tags|broadcast response)")
# Where a guest has the helper (Guest.wait_up copies it there).
GUEST_HELPER = "/home/debian/domus-guest"


def say(msg):
    print(f"bench/paper: {msg}", file=sys.stderr, flush=True)


class SessionLost(RuntimeError):
    """ssh lost a guest that still runs (its status 255): a guest that
    hangs in the nested host's way, or an sshd restarted under the
    session."""


class Restarted(Exception):
    """A guest reset or vanished (the nested host's triple faults, README
    "Known issues"): tools/bench-paper runs the experiment again in a
    fresh nested host and counts it."""


def rotate(xs, i):
    """`xs` turned by `i`: trial i's order, so no environment always goes
    first. None to turn: an experiment whose trials earlier nested hosts
    all finished (its record left partial) runs none."""
    if not xs:
        return []
    i %= len(xs)
    return xs[i:] + xs[:i]


def boot(guest, run):
    """Boots `guest` (its start()), again (at most twice more) when it
    resets on the way: the nested host's triple faults (README, known
    issues), counted in boots_retried (`run.note_retry`)."""
    for attempt in range(3):
        try:
            guest.start()
            return attempt
        except Restarted as e:
            say(f"{guest.name}: the guest reset while booting; booting it again: {e}")
            run.note_retry("boots_retried", {"env": guest.name, "why": str(e)[:500]})
    raise RuntimeError(f"{guest.name}: the guest reset in three boots in a row")


class Native:
    """The nested host's own kernel and CPUs, on as many CPUs as a guest
    has vCPUs (taskset), running the guests' own userspace: a chroot into
    a copy of the image's root file system, ext4 on a loop device on the
    scratch disk. So native runs the same binaries as the guests, from the
    same kind of file system, and not this machine's tools read through
    the nested host's 9p root, which caches nothing (native's build row
    read its compiler over it and took 1.7 times the guest's time). `dir`
    is the work directory seen from outside, `inner` from inside."""

    name = "native"
    inner = "/native"
    # The device nodes the workloads use, in a /dev of the chroot's own:
    # a bind of the nested host's /dev would put it under the work
    # directory that the bench removes at the end.
    NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8),
             "urandom": (1, 9), "tty": (5, 0)}

    def __init__(self, work, vcpus, disk):
        self.root = os.path.join(work, "native-root")
        self.mounts = []
        img = os.path.join(work, "native-root.img")
        t0 = time.monotonic()
        self.run(["qemu-img", "convert", "-O", "raw", disk, img])
        os.makedirs(self.root)
        self.mount(["-o", "loop", img], self.root)
        for fs, where in (("proc", "proc"), ("sysfs", "sys"), ("tmpfs", "dev")):
            self.mount(["-t", fs, fs], os.path.join(self.root, where))
        dev = os.path.join(self.root, "dev")
        for name, (major, minor) in self.NODES.items():
            os.mknod(os.path.join(dev, name), 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(os.path.join(dev, name), 0o666)
        for d in ("pts", "shm"):
            os.makedirs(os.path.join(dev, d))
        self.mount(["-t", "devpts", "-o", "newinstance,ptmxmode=0666", "devpts"], os.path.join(dev, "pts"))
        self.mount(["-t", "tmpfs", "-o", "mode=1777", "shm"], os.path.join(dev, "shm"))
        for name, to in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
            os.symlink(to, os.path.join(dev, name))
        self.dir = os.path.join(self.root, self.inner.lstrip("/"))
        os.makedirs(self.dir)
        # The workloads' own users (postgres, nginx's workers) reach it.
        os.chmod(self.dir, 0o755)
        self.fs = "chroot"
        say(f"native: the image's root file system copied and mounted ({time.monotonic() - t0:.0f} s)")
        self.cpus = f"0-{vcpus - 1}"
        self.put(HELPER, "domus-guest")
        self.helper = f"{self.inner}/domus-guest"

    @staticmethod
    def run(cmd):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"native: `{' '.join(cmd)}` failed ({r.returncode}): {r.stderr[-2000:]}")

    def mount(self, args, where):
        self.run(["mount", *args, where])
        self.mounts.append(where)

    def put(self, local, name):
        shutil.copy(local, os.path.join(self.dir, name))

    def sh(self, cmd, timeout):
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "TMPDIR": self.inner}
        r = subprocess.run(["taskset", "-c", self.cpus, "chroot", self.root,
                            "env", "-C", self.inner, "bash", "-c", cmd],
                           capture_output=True, text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"native: `{cmd}` failed ({r.returncode}): {r.stderr[-2000:]}")
        return r.stdout

    def pause(self):
        pass

    def resume(self):
        pass

    @staticmethod
    def vmm_pid():
        return None  # no VMM: cost.py's VMM columns are left empty

    def close(self):
        """Unmounts what __init__ mounted; raises if any is left, so that
        the work directory is not removed through a mount."""
        for where in reversed(self.mounts):
            subprocess.run(["umount", "-l", where], capture_output=True)
        left = [m for m in self.mounts if os.path.ismount(m)]
        if left:
            raise RuntimeError(f"native: still mounted: {', '.join(left)}")


class Guest:
    """What the two guests share: SSH to the image's default user, with
    the key the daemon's cloud-init seed gave it."""

    def __init__(self, work, key):
        self.work, self.key, self.ip = work, key, None
        self.known = os.path.join(work, f"known-{self.name}")
        self.helper = GUEST_HELPER

    def ssh_args(self):
        # ServerAlive: a guest that vanishes (reset, crashed, destroyed)
        # ends the session within a minute instead of leaving it hanging.
        # ConnectTimeout covers the banner exchange too: 8 clones running
        # sysbench on the nested host's 2 CPUs left a ninth login's sshd
        # more than 10 s to answer (2026-11-27).
        return ["-i", self.key, "-o", "BatchMode=yes", "-o", "ConnectTimeout=30",
                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
                "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={self.known}"]

    def alive(self):
        raise NotImplementedError

    def sh(self, cmd, timeout):
        try:
            r = subprocess.run(["ssh", *self.ssh_args(), f"debian@{self.ip}", cmd],
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            if not self.alive():
                raise Restarted(f"{self.name}: the guest vanished during `{cmd}`; {self.evidence()}")
            raise
        if r.returncode != 0:
            self.failed(f"`{cmd}`", r)
        return r.stdout

    def put(self, local, name):
        r = subprocess.run(["scp", "-q", *self.ssh_args(), local, f"debian@{self.ip}:{name}"],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            self.failed(f"scp of {name}", r)

    def failed(self, what, r):
        """Raises for ssh's or scp's failed `r`: Restarted when the guest
        reset or vanished under it (the caller makes it again), SessionLost
        for ssh's 255 with what the guest and its VMM last said, else a
        RuntimeError."""
        if not self.alive():
            raise Restarted(f"{self.name}: the guest vanished during {what}; {self.evidence()}")
        what = f"{self.name}: {what} failed ({r.returncode}): {r.stderr[-2000:]}"
        if r.returncode == 255:
            raise SessionLost(f"{what}; {self.evidence()}")
        raise RuntimeError(what)

    def settle(self):
        """Waits for the boot's own work to end (cloud-init's last stage,
        systemd's start-up jobs): it printed SSH keys to the serial
        console and ran its jobs beside the first trial, which it then
        charged to whichever guest went first (a paused guest picks up
        where it left off). cloud-init may restart sshd meanwhile, which
        drops the session (ssh's 255, "Broken pipe"): asked again, at
        most three times.

        Then its timers stop (apt's, dpkg's and man-db's daily jobs,
        fstrim, e2scrub, tmpfiles' cleaning): native, in a chroot, runs
        none, and a clone of a template saved hours before would find them
        all overdue as its clock moves on, and run them beside its first
        trial. The first trial after 8 clones came up once ran at 0.71 of
        the next one's rate, with the domains' I/O threads and the nested
        host's kernel busy: likely this, not confirmed (RUNS.md,
        2026-11-27 evening)."""
        for attempt in range(3):
            try:
                self.sh("timeout 300 cloud-init status --wait >/dev/null 2>&1; "
                        "timeout 120 systemctl is-system-running --wait >/dev/null 2>&1; "
                        "sudo -n systemctl stop $(systemctl list-units --type=timer --state=active "
                        "--plain --no-legend | awk '{print $1}') >/dev/null 2>&1; true", 600)
                return
            except SessionLost:
                if attempt == 2:
                    raise
                say(f"{self.name}: the session ended while the boot settled; asking again")
                time.sleep(5)

    def wait_up(self, deadline):
        """Waits for the SSH banner, then for a login with the key."""
        while time.monotonic() < deadline:
            if not self.alive():
                raise Restarted(f"{self.name}: the guest reset before it was up; {self.evidence()}")
            if benchlib.ssh_banner(self.ip, min(deadline, time.monotonic() + 5)):
                break
        while time.monotonic() < deadline:
            try:
                r = subprocess.run(["ssh", *self.ssh_args(), f"debian@{self.ip}", "true"],
                                   capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                r = None  # a login that hung: a guest that reset under it, or a slow one
            if r is not None and r.returncode == 0:
                self.put(HELPER, "domus-guest")
                self.settle()
                return
            if not self.alive():
                raise Restarted(f"{self.name}: the guest reset before its SSH login; {self.evidence()}")
            time.sleep(2)
        raise RuntimeError(f"{self.name}: no SSH login within {UP_TIMEOUT_S} s")


def net_state(sock):
    """Each interface of the VMM at `sock` (GET /v1/devices): its tap,
    the device's counters, and the host kernel's for the tap (`ip -s
    link`: its tx is what the host handed the guest, its tx dropped what
    the tap's queue dropped because the VMM did not read it) with its
    state. {} when the VMM does not answer."""
    try:
        status, body = domus_api.request(sock, "GET", "/v1/devices", timeout=10)
        devices = json.loads(body) if status == 200 else []
    except (OSError, ValueError):
        return {}
    out = {}
    for dv in devices:
        tap = (dv.get("info") or {}).get("tap")
        if dv.get("type") != "net" or not tap:
            continue
        link = {}
        try:
            r = subprocess.run(["ip", "-j", "-s", "link", "show", "dev", tap],
                               capture_output=True, text=True, timeout=10)
            got = json.loads(r.stdout) if r.returncode == 0 else []
            if got:
                link = {"state": got[0].get("operstate"), "flags": got[0].get("flags"),
                        **{f"{way}_{k}": v for way in ("rx", "tx")
                           for k, v in got[0].get("stats64", {}).get(way, {}).items()}}
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
        out[dv.get("id", tap)] = {"tap": tap, "device": dv.get("counters", {}), "link": link}
    return out


def net_moved(before, after):
    """Lines saying what moved on each interface between two net_state
    readings."""
    out = []
    for dev, a in sorted(after.items()):
        b = before.get(dev, {})

        def moved(side, key):
            return a[side].get(key, 0) - b.get(side, {}).get(key, 0)
        out.append(
            f"{dev} (tap {a['tap']}, {a['link'].get('state')}): the host handed its tap "
            f"{moved('link', 'tx_packets')} frames ({moved('link', 'tx_dropped')} dropped there) "
            f"and took {moved('link', 'rx_packets')}; the device delivered "
            f"{moved('device', 'rx_packets')} (dropped {moved('device', 'rx_dropped')}, "
            f"{moved('device', 'rx_kicks')} receive kicks) and sent {moved('device', 'tx_packets')}")
    return out or ["no interface counters (the VMM did not answer /v1/devices)"]


class Domus(Guest):
    """A domain of the daemon's, created from the image as a user would
    (`image = NAME`: qcow2 overlay, cloud-init seed, default network, VFR,
    jailed VMM under seccomp)."""

    name = "domus"
    domain = "paper"

    def __init__(self, work, key, image, images, vcpus, memory_mib):
        super().__init__(work, key)
        self.state = os.path.join(work, "state")
        self.image, self.images = image, images
        self.vcpus, self.memory_mib = vcpus, memory_mib
        self.cfg = self.config(self.domain, memory_mib, vcpus)
        self.log = open(os.path.join(work, "daemon.log"), "w")
        # Where snapshots go (multi.py's templates): the daemon saves only
        # into directories it serves.
        self.snaps = os.path.join(work, "snaps")
        os.makedirs(self.snaps, exist_ok=True)
        self.daemon = benchlib.start_daemon(self.state, images, BRIDGE, GATEWAY, self.log,
                                            [self.snaps])

    def config(self, name, memory_mib, vcpus, extra="", vif=""):
        """Writes the configuration of a domain `name` of the image (maxmem
        = memory: admission counts maxmem; a crashed domain is kept, with
        its console, for the evidence), with the xl.cfg lines `extra` and
        an interface of spec `vif` on the daemon's network, and returns its
        path."""
        with open(self.key + ".pub") as f:
            public = f.read().strip()
        cfg = os.path.join(self.work, f"{name}.cfg")
        with open(cfg, "w") as f:
            f.write(f"name = '{name}'\nimage = '{self.image}'\nmemory = {memory_mib}\n"
                    f"maxmem = {memory_mib}\nvcpus = {vcpus}\nvif = ['{vif}']\nssh_keys = ['{public}']\n"
                    "on_crash = 'preserve'\n" + extra)
        return cfg

    def domus(self, *args, check=True):
        return benchlib.domus(self.state, *args, check=check)

    def alive(self):
        return self.running(self.domain)

    def domains(self):
        """The daemon's `list --json`; [] when it does not answer."""
        try:
            return json.loads(self.domus("list", "--json"))
        except (RuntimeError, ValueError):
            return []

    def running(self, name):
        """Whether domain `name` runs (or is paused) and never reset."""
        return any(d.get("name") == name and d.get("restarts", 0) == 0
                   and d.get("state") not in ("restarting", "shutdown", "crashed", "destroying")
                   for d in self.domains())

    def lease(self, name):
        """The address the daemon's DHCP leased to domain `name`, or None."""
        try:
            return benchlib.domain_lease(self.state, name)
        except LookupError:
            return None  # gone: wait_lease's running() says why

    def wait_lease(self, name, deadline):
        """Domain `name`'s address once the daemon's DHCP leased it, before
        `deadline` (time.monotonic())."""
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(f"domain {name} got no lease; {self.evidence(name)}")
            if not self.running(name):
                raise Restarted(f"{name}: the guest reset before it got a lease; {self.evidence(name)}")
            ip = self.lease(name)
            if ip is not None:
                return ip
            time.sleep(0.5)

    def start(self):
        self.ip = None
        self.domus("destroy", self.domain, check=False)
        t0 = time.monotonic()
        deadline = t0 + UP_TIMEOUT_S
        self.domus("create", self.cfg)
        self.ip = self.wait_lease(self.domain, deadline)
        self.wait_up(deadline)
        say(f"{self.name}: up at {self.ip} after {time.monotonic() - t0:.0f} s")

    def evidence(self, name=None, ip=None):
        """What the domains and the daemon last said (for a failed boot or
        trial), with a capture of domain `name`'s VMM (at `ip`; by default
        this environment's own domain)."""
        out = []
        domains = os.path.join(self.state, "domains")
        for d in sorted(os.listdir(domains)):
            # A reset restarts the domain, which keeps the boot that reset
            # as console.log.1 and starts console.log afresh.
            for log in ("console.log.1", "console.log"):
                path = os.path.join(domains, d, log)
                if os.path.isfile(path):
                    out.append(f"{path}'s last lines:\n" + benchlib.last_lines(path, 8))
        # The daemon's own lines: its log also carries every console's.
        try:
            with open(self.log.name, errors="replace") as f:
                own = [line.rstrip() for line in f
                   if " console: " not in line and not line.startswith(" domain=")
                   and not DHCP_DETAIL.search(line)]
        except OSError:
            own = []
        out.append(f"{self.log.name}'s last lines but the consoles':\n" + "\n".join(own[-30:]))
        try:
            out.append("list: " + self.domus("list", "--json", check=False)[:800])
        except OSError:
            pass
        try:
            out.append(self.capture(name or self.domain, ip or self.ip))
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
            out.append(f"no capture: {e}")
        return "\n".join(out)

    def capture(self, name, ip):
        """What domain `name`'s VMM was doing when its guest (at `ip`)
        failed a trial,
        into a directory of CAPTURES: tools/soak.py's capture (its threads'
        CPU time, the kvm_exit trace, the verdict), its virtio rings read
        twice a second apart (GET /v1/domain/rings: rings.json), and
        whether the guest still answers ping. Returns the lines that say
        so; "" without a VMM, or with one that booted the guest again (the
        guest that failed is gone)."""
        d = next((d for d in self.domains() if d.get("name") == name), None)
        if CAPTURES is None or d is None or not d.get("pid") or d.get("restarts", 0) > 0:
            return ""
        dest = os.path.join(CAPTURES, time.strftime("%Y%m%d-%H%M%S-") + name)
        os.makedirs(dest, exist_ok=True)
        sock = os.path.join(self.state, "domains", str(d["id"]), "api.sock")
        # The rings are read twice a second apart while ping is sent to
        # the guest, and the interfaces' counters (the VMM's device's and
        # the host kernel's for its tap) before and after: a receive ring
        # with buffers posted and none used then says whether the host
        # handed the tap no frame (nobody sent to it), the VMM left them
        # in the tap (its tx dropped grows), or took them and delivered
        # none.
        before = net_state(sock)
        ping, ping_lines = None, []
        if ip:
            try:
                ping = subprocess.Popen(["ping", "-c", "3", "-W", "1", ip],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            except OSError as e:
                ping_lines = [f"ping {ip}: {e}"]
        readings = []
        for i in range(2):
            if i:
                time.sleep(1)
            # A VMM too wedged to answer its API in 10 s says so too.
            status, body = domus_api.request(sock, "GET", "/v1/domain/rings", timeout=10)
            readings.append(json.loads(body) if status == 200 else [])
        if ping is not None:
            try:
                text = ping.communicate(timeout=15)[0]
            except subprocess.TimeoutExpired:
                ping.kill()
                text = ping.communicate()[0] + "\n(ping did not end in 15 s)"
            ping_lines = [f"ping {ip}: {line}" for line in text.splitlines()
                          if "transmitted" in line or "did not end" in line]
        after = net_state(sock)
        with open(os.path.join(dest, "rings.json"), "w") as f:
            json.dump({"first": readings[0], "second": readings[1],
                       "net_before": before, "net_after": after}, f, indent=1)
        console = os.path.join(self.state, "domains", str(d["id"]), "console.log")
        r = subprocess.run([sys.executable, SOAK, "capture", str(d["pid"]), dest]
                           + (["--console", console] if os.path.isfile(console) else []),
                           capture_output=True, text=True, timeout=60)
        out = [f"VMM capture ({dest}):", r.stdout.strip()] + ([r.stderr.strip()[-500:]] if r.stderr.strip() else [])
        # Each queue's second reading; `held` when the first was the same.
        for q in readings[1]:
            v = q.get("vector") or {}
            out.append(f"ring {q['device']} queue {q['queue']}: avail {q['avail_idx']} used "
                       f"{q['used_idx']} used_event {q['used_event']} avail_event {q['avail_event']} "
                       f"signalled_at {q['signalled_at']} vector {v.get('index')} fired "
                       f"{v.get('fired')} masked {v.get('masked')} pending {v.get('pending')}"
                       + (" (held)" if q in readings[0] else " (moved)"))
        if ip:
            out += ping_lines
            out += net_moved(before, after)
            try:
                n = subprocess.run(["ip", "neigh", "show", ip], capture_output=True, text=True, timeout=10)
                out.append(f"neighbour {ip}: {n.stdout.strip() or 'none'}")
            except (OSError, subprocess.SubprocessError) as e:
                out.append(f"neighbour {ip}: {e}")
            now = self.lease(name)
            out.append(f"lease of {name} now: {now}" + (" (the same)" if now == ip else " (changed)"))
        return "\n".join(out)

    def seed(self):
        return os.path.join(self.state, "overlays", f"{self.domain}.seed.img")

    def vmm_pid(self):
        """The domain's VMM process (cost.py reads its CPU time)."""
        return next((d.get("pid") for d in self.domains() if d.get("name") == self.domain), None)

    def pause(self):
        self.domus("pause", self.domain)

    def resume(self):
        self.domus("unpause", self.domain)

    def close(self):
        self.domus("destroy", self.domain, check=False)
        benchlib.stop_daemon(self.daemon, self.state)


class DomusVariant(Domus):
    """A second domain of `dom`'s daemon, `domain`, made as `dom`'s with
    the xl.cfg lines `extra` added and its interface's spec `vif`,
    measured as environment `name`: one setting's effect, in the same
    nested host (webcost's `webllc`, netcost's `netmrg` and `netind`)."""

    def __init__(self, dom, name, domain, extra, vif=""):
        self.name, self.domain = name, domain
        Guest.__init__(self, dom.work, dom.key)
        self.state, self.image, self.images = dom.state, dom.image, dom.images
        self.vcpus, self.memory_mib = dom.vcpus, dom.memory_mib
        self.log, self.snaps = dom.log, dom.snaps
        self.cfg = self.config(domain, dom.memory_mib, dom.vcpus, extra, vif)

    def close(self):
        """Destroys the domain; the daemon is `dom`'s."""
        self.domus("destroy", self.domain, check=False)


class Process(Guest):
    """A guest of a VMM process of its own (QEMU, Cloud Hypervisor) booting
    the same image: its own qcow2 overlay on the same base, a copy of the
    Domus domain's cloud-init seed, the image's kernel and initrd, a tap
    on the daemon's bridge (its address from the daemon's dnsmasq). Paused
    by SIGSTOP. Subclasses give `name`, `label`, `tap`, `mac` and
    `command(record, top, seed, vcpus, memory_mib)`."""

    def __init__(self, work, key, record, seed, state, vcpus, memory_mib):
        super().__init__(work, key)
        self.state = state
        self.top, self.base = os.path.join(work, f"{self.name}.qcow2"), record["disk"]
        own_seed = os.path.join(work, f"{self.name}-seed.img")
        shutil.copy(seed, own_seed)
        benchlib.add_tap(self.tap, BRIDGE)
        self.console = os.path.join(work, f"{self.name}.console")
        self.cmd = self.command(record, self.top, own_seed, vcpus, memory_mib)
        self.p = None

    def alive(self):
        """The VMM runs and its guest booted once: QEMU ends on a reset
        (-no-reboot), Cloud Hypervisor boots the guest again, which its
        console shows as a second kernel banner."""
        if self.p is None or self.p.poll() is not None:
            return False
        try:
            with open(self.console, "rb") as f:
                return f.read().count(b"Linux version ") <= 1
        except FileNotFoundError:
            return True

    def evidence(self):
        """How the VMM ended and what its guest last printed."""
        out = []
        if self.p is not None and self.p.poll() is not None:
            out.append(f"{self.label}'s exit status {self.p.returncode}: "
                       + self.p.stderr.read().decode(errors="replace")[-500:])
        out.append("console's last lines:\n" + benchlib.last_lines(self.console, 10))
        return "\n".join(out)

    def start(self):
        self.ip = None
        if self.p is not None:
            self.p.kill()
            self.p.wait()
        # A fresh overlay each boot, as the domain's.
        benchlib.qemu_overlay(self.base, self.top)
        t0 = time.monotonic()
        deadline = t0 + UP_TIMEOUT_S
        self.p = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while self.ip is None:
            if not self.alive():
                raise Restarted(f"{self.name}: the guest reset before it got a lease; {self.evidence()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {self.label} guest got no lease")
            self.ip = benchlib.lease_of(self.state, BRIDGE, self.mac)
            if self.ip is None:
                time.sleep(0.5)
        self.wait_up(deadline)
        say(f"{self.name}: up at {self.ip} after {time.monotonic() - t0:.0f} s")

    def vmm_pid(self):
        return self.p.pid if self.alive() else None

    def pause(self):
        if self.alive():
            self.p.send_signal(signal.SIGSTOP)

    def resume(self):
        if self.alive():
            self.p.send_signal(signal.SIGCONT)

    def close(self):
        if self.p is not None:
            self.resume()
            self.p.kill()
            self.p.wait()
        benchlib.del_tap(self.tap)


class Qemu(Process):
    """QEMU (`-accel kvm -cpu host -M q35`, virtio disk and net)."""

    name, label, tap, mac = "qemu", "QEMU", QEMU_TAP, QEMU_MAC

    def command(self, record, top, seed, vcpus, memory_mib):
        # (a guest reset ends QEMU: -no-reboot)
        return benchlib.qemu_image_cmd(record, top, seed, self.tap, self.mac, vcpus, memory_mib,
                                       self.console)


def ch_binary():
    """Cloud Hypervisor's binary (CH_BIN, else the peers' build beside the
    checkout: ../shared/peers), or None where there is none."""
    path = os.environ.get("CH_BIN") or os.path.join(os.path.dirname(REPO), "shared", "peers",
                                                    "cloud-hypervisor")
    return path if os.access(path, os.X_OK) else None


class CloudHypervisor(Process):
    """Cloud Hypervisor (the peers' v53 build: KVM, seccomp on, virtio-pci
    disk and net), the image's bzImage booted directly; its qcow2 overlay
    names the base as its backing file (`backing_files=on`)."""

    name, label, tap, mac = "ch", "Cloud Hypervisor", CH_TAP, CH_MAC

    def command(self, record, top, seed, vcpus, memory_mib):
        return [ch_binary(), "--kernel", record["kernel"], "--initramfs", record["initrd"],
                "--cmdline", f"root={record['root']} rw console=ttyS0",
                "--cpus", f"boot={vcpus}", "--memory", f"size={memory_mib}M",
                "--disk", f"path={top},image_type=qcow2,backing_files=on",
                f"path={seed},image_type=raw,readonly=on",
                "--net", f"tap={self.tap},mac={self.mac}",
                "--serial", f"file={self.console}", "--console", "off"]
