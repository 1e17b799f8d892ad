"""bench/paper's experiments of many domains at once: clones of one small
template domain, made, resumed and measured here (the paper's Figures 4
and 5 are figs45.py's, Figure 6 isolation.py's, section 4.5 scaling.py's,
slice timeslice.py's, all on these clones).

A Debian guest takes minutes to boot in the nested host, so N domains are
not N cold boots: a domain `multi` of the image (TEMPLATE_MIB, one vCPU:
the paper's many-domain runs gave each domain one CPU, and admission
counts each clone's maxmem, so a small one lets the nested host hold many)
boots once, is prepared for every workload here (PostgreSQL's database, an
nginx of our own), and is saved paused (`domus save -p`); the template
cache below keeps it for the run's later nested hosts. Each experiment
then starts its domains as clones of it (a configuration of a name and
`clone = SNAP`, a batch at a time: start_clones), each with its own name,
disk copy and a new interface with a new MAC on the daemon's network.
systemd-networkd, set up in the template before the save, brings the new
interface up by DHCP, so each clone gets its own lease. Clones an
experiment does not need at a moment are paused.
"""
import hashlib
import inspect
import json
import os
import re
import statistics
import subprocess
import threading
import time

import cpuuse
import envs
import workloads
from envs import say

TEMPLATE = "multi"
TEMPLATE_MIB, TEMPLATE_VCPUS = 320, 1
# What admission reserves per clone: its maxmem and its VMM's allowance
# (crates/daemon/src/cgroup.rs).
FOOTPRINT_MIB = TEMPLATE_MIB + 64
# How many times one clone that reset before it was up is made again.
REPLACEMENTS = 2


class Domain(envs.Guest):
    """A domain of the daemon's other than `paper` (the template, a
    clone), reached by SSH at the address the daemon's DHCP leased it."""

    def __init__(self, work, key, dom, name, cfg=None):
        self.name, self.cfg = name, cfg
        super().__init__(work, key)
        self.dom = dom

    def start(self):
        """Creates the domain from its configuration (one of its name
        destroyed first) and waits until it is up (envs.boot's)."""
        self.dom.domus("destroy", self.name, check=False)
        t0 = time.monotonic()
        self.dom.domus("create", self.cfg)
        self.up(t0 + envs.UP_TIMEOUT_S)
        say(f"{self.name}: up at {self.ip} after {time.monotonic() - t0:.0f} s")

    def alive(self):
        return self.dom.running(self.name)

    def evidence(self):
        """What the daemon and its domains last said, with a capture of
        this domain's VMM (Guest.wait_up's, Guest.failed's)."""
        return self.dom.evidence(self.name, self.ip)

    def up(self, deadline):
        """Waits for its lease, then for an SSH login."""
        self.ip = self.dom.wait_lease(self.name, deadline)
        self.wait_up(deadline)

    def pause(self):
        self.dom.domus("pause", self.name)

    def resume(self):
        self.dom.domus("unpause", self.name)


def template(dom, run):
    """The snapshot this nested host's experiments clone: made on first
    use, kept in `run` (the template domain stays, paused: the clones
    copy its disk, and its snapshot names it), and in the template cache
    when there is one (an earlier nested host's, restored)."""
    if run.snap:
        return run.snap
    cached = cache_restore(dom, run)
    if cached:
        run.snap = cached
        return cached
    t = Domain(run.work, dom.key, dom, TEMPLATE, dom.config(TEMPLATE, TEMPLATE_MIB, TEMPLATE_VCPUS))
    envs.boot(t, run)
    say(f"{TEMPLATE}: preparing the template")
    template_prepare(t, run.quick)
    snap = os.path.join(dom.snaps, f"{TEMPLATE}-{int(time.time())}.snap")
    t0 = time.monotonic()
    dom.domus("save", "-p", TEMPLATE, snap)
    say(f"template saved in {time.monotonic() - t0:.0f} s ({snap})")
    cache_store(dom, run, snap)
    run.snap = snap
    return snap


# The template cache (BENCH_TEMPLATE_CACHE, tools/bench-paper's): the
# template's snapshot and disks, kept outside the nested host. A nested
# host that dies under the many-domain load takes the template with it,
# and making it again (boot, database, pages) took 7 to 8 minutes of the
# next host's life; the next one restores it instead. A snapshot names its
# disks by absolute path, so the scratch directory has the same path in
# every host (run.py's `work`).
def cache_dir():
    return os.environ.get("BENCH_TEMPLATE_CACHE") or None


def cache_inputs(dom, run):
    """What the cached template was made from: a change to any of it
    (the image too: its overlay is on the image's disk; the helper too:
    the template's copy is what its clones run; the settling its boot
    had, which stops its timers) makes the template again."""
    image = os.stat(os.path.join(dom.images, dom.image, "image.json"))
    with open(envs.HELPER, "rb") as f:
        helper = hashlib.sha256(f.read()).hexdigest()
    text = "\n".join([inspect.getsource(template_prepare), inspect.getsource(envs.Guest.settle),
                      workloads.pg_prepare(False, run.quick),
                      workloads.web_prepare(envs.GUEST_HELPER), str((TEMPLATE_MIB, TEMPLATE_VCPUS, run.quick)),
                      str((image.st_mtime_ns, image.st_size)), helper])
    return {"inputs": hashlib.sha256(text.encode()).hexdigest(), "work": run.work}


def template_files(dom, snap):
    """The files a clone of `snap` reads: the snapshot's own (its state and
    memory) and the template's overlay and cloud-init seed."""
    stem = os.path.basename(snap)
    own = [os.path.join(dom.snaps, f) for f in os.listdir(dom.snaps) if f.startswith(stem)]
    disks = [os.path.join(dom.state, "overlays", f"{TEMPLATE}{ext}") for ext in (".qcow2", ".seed.img")]
    return own + disks


def cache_store(dom, run, snap):
    cache = cache_dir()
    if cache is None:
        return
    t0 = time.monotonic()
    files = template_files(dom, snap)
    os.makedirs(cache, exist_ok=True)
    for f in files:
        subprocess.run(["cp", "--sparse=always", f, os.path.join(cache, os.path.basename(f))], check=True)
    manifest = dict(cache_inputs(dom, run), snap=snap, files=files)
    with open(os.path.join(cache, "manifest.json.tmp"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(os.path.join(cache, "manifest.json.tmp"), os.path.join(cache, "manifest.json"))
    say(f"template kept in {cache} for later nested hosts ({time.monotonic() - t0:.0f} s)")


def cache_restore(dom, run):
    """The cached template's snapshot, its files put back where it names
    them; None when there is none made from the same inputs."""
    cache = cache_dir()
    try:
        with open(os.path.join(cache or "", "manifest.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if {k: manifest.get(k) for k in ("inputs", "work")} != cache_inputs(dom, run):
        say(f"{cache}: its template was made from other inputs; making it again")
        return None
    t0 = time.monotonic()
    for f in manifest["files"]:
        os.makedirs(os.path.dirname(f), exist_ok=True)
        subprocess.run(["cp", "--sparse=always", os.path.join(cache, os.path.basename(f)), f], check=True)
    say(f"template restored from {cache} (made in an earlier nested host) in {time.monotonic() - t0:.0f} s")
    return manifest["snap"]


def template_prepare(t, quick):
    # The database, as Figure 3's pg experiment makes it, and a stopped
    # nginx: each experiment starts what it serves.
    t0 = time.monotonic()
    t.sh(workloads.pg_prepare(False, quick), 1800)
    say(f"{TEMPLATE}: PostgreSQL's database made in {time.monotonic() - t0:.0f} s")
    t.sh(workloads.web_prepare(t.helper) + " && " + workloads.web_stop(), 600)
    say(f"{TEMPLATE}: the web pages made")
    # cloud-init's ifupdown brings up the interface it saw at first boot,
    # by name. A clone's interface is a new one, plugged later, with a new
    # MAC and maybe the old name: systemd-networkd (in Debian's systemd)
    # takes every interface but the template's own, by DHCP with the MAC as
    # client ID (dnsmasq then gives each clone its own address; the machine
    # ID they share would not). The template's own is matched first, by
    # MAC, and left unmanaged: ifupdown keeps it, and the SSH session on it.
    dev = t.sh(f"ip -o -4 addr show | awk '$4 ~ /^{t.ip}\\// {{print $2}}'", 60).strip()
    if not dev:
        raise RuntimeError(f"{TEMPLATE}: no interface holds {t.ip}")
    mac = t.sh(f"cat /sys/class/net/{dev}/address", 60).strip()
    units = {"10-template.network": f"[Match]\nMACAddress={mac}\n\n[Link]\nUnmanaged=yes\n",
             "80-clone.network": "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n\n"
                                 "[DHCPv4]\nClientIdentifier=mac\n"}
    for name, text in units.items():
        path = os.path.join(t.work, name)
        with open(path, "w") as f:
            f.write(text)
        t.put(path, name)
    t.sh("sudo install -m 644 " + " ".join(units) + " /etc/systemd/network/ && "
         "sudo systemctl enable --now systemd-networkd >/dev/null 2>&1 && sync", 120)
    say(f"{TEMPLATE}: systemd-networkd takes every new interface")
    # ifupdown's DHCP client of the template's own interface would go on in
    # every clone, renewing the template's lease (the daemon's dnsmasq acked
    # requests for the template's MAC in a nested host where only its
    # clones ran; which process sent them is not confirmed). It ends here:
    # the address it holds stays until the save, and so does the session.
    t.sh("sudo pkill -x dhclient; true", 60)


def most_clones(dom):
    """How many more clones of the template admission takes now."""
    info = json.loads(dom.domus("info", "--json"))
    return info["free_memory_mib"] // FOOTPRINT_MIB


def start_clones(dom, run, n, prefix, prepare=None, paused=False):
    """Clones PREFIX-1 to PREFIX-N of the template, each up (its lease and
    a login) and `prepare(batch)` run in it, all running when it returns
    (paused, with `paused`).

    They are made and brought up a batch of as many as the nested host
    has CPUs at a time, the batches before paused meanwhile. Each clone's
    bring-up (its new interface, networkd, DHCP) takes about 45 s of vCPU
    time there; 8 clones made at once kept 8 vCPUs busy on 2 CPUs for 4
    to 6 minutes, and most nested hosts died during those minutes
    (RUNS.md), where one or two at a time they mostly lived. Each batch
    is prepared before it is paused: a clone resumed after minutes sees
    its clock jump (systemd's watchdogs then restart journald and udevd),
    and 8 of them prepared at once after that lost an SSH session."""
    snap = template(dom, run)
    t0 = time.monotonic()
    batch = max(1, os.cpu_count() or 1)
    clones = []
    for first in range(0, n, batch):
        for c in clones[-batch:]:
            c.pause()
        new = [Domain(run.work, dom.key, dom, f"{prefix}-{i}")
               for i in range(first + 1, min(n, first + batch) + 1)]
        for c in new:
            make_clone(dom, run, snap, c.name)
        deadline = time.monotonic() + 120 + 60 * len(new)
        for c in new:
            deadline = bring_up(dom, run, snap, c, deadline, t0)
        if prepare:
            prepare(new)
        clones += new
    if paused:
        for c in new:
            c.pause()
    elif len(clones) > len(new):
        for c in clones[:-len(new)]:
            c.resume()
        say(f"{n} clones running, quiet {quiet(dom, clones):.0f} s after the earlier ones' resume")
    say(f"{n} clones up in {time.monotonic() - t0:.0f} s: "
        + ", ".join(f"{c.name} {c.ip}" for c in clones))
    return clones


def bring_up(dom, run, snap, c, deadline, t0):
    """Waits until clone `c` (made) is up, by `deadline`; one that reset
    before it was up (the nested host's triple faults, README, known
    issues) is made again, counted, at most REPLACEMENTS times, each with
    at least 300 s more. The deadline it ended with."""
    for attempt in range(REPLACEMENTS + 1):
        try:
            c.up(deadline)
            units = watchdog_timeouts([c])[0]
            say(f"{c.name}: up at {c.ip} after {time.monotonic() - t0:.0f} s"
                + (f"; systemd's watchdog timed out for {', '.join(units)}" if units else ""))
            return deadline
        except envs.Restarted as e:
            if attempt == REPLACEMENTS:
                raise
            say(f"{c.name}: the clone reset before it was up; making it again")
            run.note_retry("clones_replaced", {"clone": c.name, "why": str(e)[:800]})
            replace(dom, run, snap, c.name)
            deadline = max(deadline, time.monotonic() + 300)


def make_clone(dom, run, snap, name):
    """Clone `name` of the snapshot (`replace`), made again if it
    triple-faulted while it was made (the nested host's, README, known
    issues; counted in the results). Anything else ends here, and so does
    a triple fault the daemon logged for any other domain."""
    for attempt in range(REPLACEMENTS + 1):
        try:
            replace(dom, run, snap, name)
            return
        except RuntimeError as e:
            why = str(e)
            # The daemon's log line for the VMM's message ends with the
            # domain's tracing field, `domain="NAME"`: its own, exactly.
            faulted = any(f'domain="{name}"' in line and "triple-faulted" in line for line in why.splitlines())
            if attempt == REPLACEMENTS or not faulted:
                raise
            say(f"{name}: the clone triple-faulted while it was made; making it again")
            run.note_retry("clones_replaced", {"clone": name, "why": why[-800:]})


def replace(dom, run, snap, name):
    """Destroys clone `name` (if there is one) and makes it from the
    snapshot (a configuration of only its name and `clone`)."""
    drop(dom, name)
    cfg = os.path.join(run.work, f"{name}.cfg")
    with open(cfg, "w") as f:
        f.write(f"name = '{name}'\nclone = '{snap}'\n")
    try:
        dom.domus("create", cfg)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{dom.evidence()}") from None


def drop(dom, name):
    """Destroys clone `name` and removes its disk copy, which `domus
    destroy` keeps (and `domus clone` never writes over); the copy is
    named as crates/daemon/src/clone.rs's `clone_disk_path` names it."""
    dom.domus("destroy", name, check=False)
    try:
        os.remove(os.path.join(dom.state, "overlays", f"{TEMPLATE}-{name}.qcow2"))
    except FileNotFoundError:
        pass


def destroy(dom, prefix, n):
    """Drops clones PREFIX-1 to PREFIX-N, whichever exist."""
    for i in range(1, n + 1):
        drop(dom, f"{prefix}-{i}")


class Steps:
    """The clones of an experiment that measures N of them at a time for
    growing N, started only when a count first needs them (each step's
    new ones a group of their own, PREFIX<N>-1 to -K, by start_clones): a
    nested host that dies under 8 clones has measured 1, 2 and 4 by then.
    `prepare(batch)` runs in the new ones, a batch at a time, before they
    are paused."""

    def __init__(self, dom, run, prefix, prepare=None):
        self.dom, self.run, self.prefix, self.prepare = dom, run, prefix, prepare
        self.clones, self.groups = [], []

    def first(self, n):
        """The first n clones, paused, starting the ones missing."""
        if n > len(self.clones):
            k, group = n - len(self.clones), f"{self.prefix}{n}"
            self.groups.append((group, k))
            self.clones += start_clones(self.dom, self.run, k, group, self.prepare, paused=True)
        return self.clones[:n]

    def measure(self, n, fn):
        """`fn(clones)` on the first n clones (it resumes them; they are
        paused again after), its result. A clone that reset meanwhile (the
        platform's triple faults) has lost what `fn` started in it, and
        the others were measured beside its boot: it alone is made again
        in this host (counted in clones_replaced) and `fn` runs again, at
        most REPLACEMENTS times. Before, such a reset failed the attempt
        and the next nested host had to bring every clone up again, which
        at 8 clones few hosts lived through (RUNS.md, 2026-12-02)."""
        for attempt in range(REPLACEMENTS + 1):
            clones, lost = self.first(n), []
            try:
                out = fn(clones)
                no_reset(self.dom, clones, "while measured")
                return out
            except Exception as e:
                lost = reset_ones(self.dom, clones)
                if not lost or attempt == REPLACEMENTS:
                    raise
                why = str(e)
            finally:
                for c in clones:
                    if c.name not in lost:
                        c.pause()
            say(f"{', '.join(lost)}: reset while measured; making {'it' if len(lost) == 1 else 'them'} "
                f"again and measuring {n} again ({attempt + 1}/{REPLACEMENTS})")
            self.remake([c for c in clones if c.name in lost], why)

    def remake(self, clones, why):
        """Each of `clones` made again from the template, up, prepared
        and paused, counted in clones_replaced."""
        snap = template(self.dom, self.run)
        for c in clones:
            self.run.note_retry("clones_replaced", {"clone": c.name, "when": "measured", "why": why[-800:]})
            t0 = time.monotonic()
            make_clone(self.dom, self.run, snap, c.name)
            bring_up(self.dom, self.run, snap, c, t0 + 300, t0)
            if self.prepare:
                self.prepare([c])
            c.pause()

    def destroy(self):
        for group, k in self.groups:
            destroy(self.dom, group, k)


def resumed(run, name, settings, key="runs"):
    """Experiment `name`'s record, `settings` plus `key` (by default
    `runs`, {env: {N: [trial, ...]}}; fig5's `phases`), saved (run.save)
    as the caller adds to it: the one an earlier nested host of this
    measure left in `partial`, if it ran at the same size with the same
    settings, else a fresh one."""
    partial = run.done.setdefault("partial", {})
    mine = partial.get(name)
    if (mine is None or mine.get("quick") != run.quick or key not in mine["runs"]
            or any(mine["runs"].get(k) != v for k, v in settings.items())):
        mine = partial[name] = {"quick": run.quick, "runs": dict(settings, **{key: {}})}
    elif mine["runs"][key]:
        say(f"{name}: keeping what an earlier nested host measured ({kept(mine['runs'][key])})")
    # Which machine measures it: an unfinished record from another one is
    # dropped (run.measure), as the single-guest experiments' are.
    run.note_machine(name)
    return mine["runs"]


def kept(record):
    """What a partial record holds, in a few words: the trials per N per
    environment, or per phase."""
    def count(v):
        if isinstance(v, list):
            return len(v)
        if "tps" in v:  # a fig5 phase
            return len(v["tps"])
        return {k: count(x) for k, x in v.items() if count(x)}
    return ", ".join(f"{k}: {count(v)}" for k, v in record.items())


def lacking_cells(res, run, native, counts):
    """fig4's and scal's cells still to measure, in their order: each trial
    t, the environments in turn (envs.rotate; native only if the run has
    it), each count N. Yields (t, environment, N, the cell's trials so
    far), the list the caller appends the new trial to."""
    for t in range(run.count):
        for name in envs.rotate(["native", "domus"] if native else ["domus"], t):
            for n in counts:
                got = res["runs"].setdefault(name, {}).setdefault(str(n), [])
                if len(got) <= t:
                    yield t, name, n, got


def at_once(fns):
    """Runs the functions at the same time; their results, in order. The
    first failure is raised once all have ended."""
    outs, errs = [None] * len(fns), []

    def one(i, fn):
        try:
            outs[i] = fn()
        except Exception as e:  # raised below, after the others ended
            errs.append(e)

    threads = [threading.Thread(target=one, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise errs[0]
    return outs


# A clone resumed after minutes paused finds its clock moved on by them:
# kvmclock runs while a domain is paused (the guest's wall clock stays
# right, as on Xen; QEMU and CH stop it instead), so systemd's service
# watchdogs (3 minutes for journald, udevd, logind and networkd) time out
# at once and it restarts those services (RUNS.md, "Pausing for
# minutes"). That work, on the clone's one vCPU, would land in the first
# measurement after the resume. `quiet` waits for it to end: until every
# clone's vCPU ran less than QUIET_CPUS of a CPU in QUIET_WINDOWS
# one-second windows in a row, at most QUIET_MAX_S.
QUIET_CPUS, QUIET_WINDOWS, QUIET_MAX_S = 0.10, 2, 180


def quiet(dom, clones, max_s=QUIET_MAX_S):
    """Waits until the running clones are quiet (above), at most `max_s`
    seconds; the seconds it took."""
    t0, calm, told = time.monotonic(), 0, False
    before = cpuuse.sample(dom)
    while calm < QUIET_WINDOWS and time.monotonic() - t0 < max_s:
        time.sleep(1)
        now = cpuuse.sample(dom)
        use = cpuuse.between(before, now)
        before = now
        busy = [c for c in clones
                if use is None or use["domains"].get(c.name, {}).get("vcpu", 1) >= QUIET_CPUS]
        calm = 0 if busy else calm + 1
        if busy and not told and time.monotonic() - t0 > 20:
            # Once: what the busy ones run, for the log.
            told = True
            try:
                tops = sh_all(busy, "top -b -n 2 -d 1 -w 200 | awk '/^top -/ {n++} "
                              "n == 2 && $1 ~ /^[0-9]+$/ {print $9 \"% \" $12}' | head -n 4 | paste -sd ';'", 60)
                say("still busy after 20 s: " + "; ".join(f"{c.name} ({t.strip()})" for c, t in zip(busy, tops)))
            except Exception as e:  # for the log only
                # sh_all's one error names the clone that failed, not each
                say(f"still busy after 20 s: {', '.join(c.name for c in busy)} (top: {str(e)[:160]})")
    waited = time.monotonic() - t0
    # A clone that reset meanwhile (the platform's triple faults) is busy
    # booting again, and comes back without what its experiment started in
    # it (nginx, PostgreSQL): not one to measure.
    no_reset(dom, clones, "while resumed")
    if calm < QUIET_WINDOWS:
        say(f"{len(clones)} clone(s) still busy {waited:.0f} s after their resume: going on anyway")
    return round(waited, 1)


def no_reset(dom, clones, when):
    """Raises envs.Restarted if any of `clones` has reset (the platform's
    triple faults): it boots again without what its experiment started in
    it, and what was measured meanwhile is not its work."""
    reset = reset_ones(dom, clones)
    if reset:
        raise envs.Restarted(f"{', '.join(reset)} reset {when}; {dom.evidence()}")


def reset_ones(dom, clones):
    """The names of those of `clones` that reset or are gone; none when
    the daemon does not answer."""
    listed = dom.domains()
    return [c.name for c in clones
            if listed and not any(d.get("name") == c.name and d.get("restarts", 0) == 0 for d in listed)]


def resume_quiet(dom, clones):
    """Resumes the clones a batch of as many as the nested host has CPUs
    at a time, each batch once the ones running are quiet, and waits until
    all are; the seconds the waits took in all. A clone resumed after
    minutes paused is busy for a while (its watchdogs restart services),
    and 8 resumed at once were 8 busy vCPUs on 2 CPUs, as 8 clones made at
    once were (start_clones). On 2026-12-02 both nested hosts that brought
    scal's 8 clones up died before they were measured, one panicking
    seconds after the last was up (RUNS.md). The batches before the last
    share one QUIET_MAX_S; the last has its own, as all had at once."""
    t0 = time.monotonic()
    batch = max(1, os.cpu_count() or 1)
    for first in range(0, len(clones), batch):
        for c in clones[first:first + batch]:
            c.resume()
        last = first + batch >= len(clones)
        quiet(dom, clones[:first + batch],
              QUIET_MAX_S if last else max(0.0, QUIET_MAX_S - (time.monotonic() - t0)))
    return round(time.monotonic() - t0, 1)


def watchdog_timeouts(clones, since=None):
    """The units whose systemd service watchdog timed out, as each clone's
    journal has them since `since` (the host's clock; the guest's wall
    clock is the host's), or since its boot (the template's: a clone's
    journal goes on from it)."""
    when = f"--since=@{int(since) - 2}" if since else ""
    outs = sh_all(clones, f"sudo -n journalctl -q -b --no-pager {when} 2>/dev/null "
                  "| sed -n 's/.* \\([^ ]*\\): Watchdog timeout.*/\\1/p'", 120)
    return [o.split() for o in outs]


def sh_all(clones, cmd, timeout):
    """`cmd` in every clone at the same time; their outputs, in order."""
    return at_once([lambda c=c: c.sh(cmd, timeout) for c in clones])


# Per-second progress lines: (seconds since the start, rate).
PROGRESS = {
    "sysbench": re.compile(r"^\[\s*(\d+)s\s*\].*?eps:\s*([0-9.]+)", re.M),
    "pgbench": re.compile(r"^progress:\s*([0-9.]+)\s*s,\s*([0-9.]+)\s*tps", re.M),
}


def concurrent_rates(clones, script, secs, kind):
    """Runs `script` (bash; it runs for `secs` seconds and prints `kind`'s
    per-second progress lines) in every clone in the background, and
    returns each clone's mean rate over the seconds when all of them ran.

    The clones start one SSH login after another, seconds apart in the
    nested host, so each one's whole-run rate would count seconds when
    others had not started yet or had ended. Each start is timed on the
    host's clock, so each clone's progress lines are placed on it and only
    the seconds inside every clone's run are kept. The nested host's CPU
    use over that window (cpuuse) comes with it, and each clone's rate per
    second of its vCPU time."""
    start = ("cat > bg.sh <<'BENCH_EOF'\n" + script + "\nBENCH_EOF\n"
             "rm -f bg.out; nohup bash bg.sh > bg.out 2>&1 < /dev/null & echo $! > bg.pid")
    starts = at_once([lambda c=c: (c.sh(start, 120), time.monotonic())[1] for c in clones])
    first, last = min(starts), max(starts)
    lo, hi = last + 1, first + secs - 1
    if hi - lo < 3:
        raise RuntimeError(f"the clones started {last - first:.1f} s apart: too far for {secs} s runs")
    dom = clones[0].dom
    time.sleep(max(0.0, lo - time.monotonic()))
    before = cpuuse.sample(dom)
    time.sleep(max(0.0, hi - time.monotonic()))
    use = cpuuse.between(before, cpuuse.sample(dom))
    time.sleep(max(0.0, last + secs + 5 - time.monotonic()))
    outs = sh_all(clones, "for i in $(seq 120); do kill -0 $(cat bg.pid) 2>/dev/null || break; "
                  "sleep 1; done; cat bg.out", 300)
    rates = []
    for c, t0, out in zip(clones, starts, outs):
        # A line at k seconds covers [k-1, k] after the clone's start, which
        # came before its SSH returned (t0), by less than the 1 s margins.
        kept = [float(r) for k, r in PROGRESS[kind].findall(out)
                if t0 + float(k) - 1 >= lo and t0 + float(k) <= hi]
        if len(kept) < 2:
            raise RuntimeError(f"{c.name}: {kind} printed too few progress lines in the common "
                               f"window: {out[-500:]!r}")
        rates.append(statistics.mean(kept))
    return rates, {"spread_s": round(last - first, 2), "window_s": round(hi - lo, 2), "cpu": use,
                   "per_vcpu_s": cpuuse.per_vcpu_second(rates, use, [c.name for c in clones])}


def sysbench_script(secs):
    return f"sysbench cpu --threads=1 --time={secs} --report-interval=1 run"


def cpu_note(use):
    """The progress line's note of where the nested host's CPUs went."""
    if not use:
        return ""
    h = use["host"]
    doms = ", ".join(f"{name} {d['vcpu']:.2f}+{d['io']:.2f}"
                     + (f" (waited {d['wait']:.2f}" + (f", polled {d['poll']:.2f}" if "poll" in d else "") + ")"
                        if "wait" in d else "")
                     for name, d in sorted(use["domains"].items()) if d["vcpu"] + d["io"] >= 0.01)
    return (f"; CPUs: guest {h['guest']:.2f}, kernel {h['kernel']:.2f}, user {h['user']:.2f}, "
            f"idle {h['idle']:.2f}" + (f"; vCPU+I/O: {doms}" if doms else "")
            + (f"; outside the domains {use['outside']:.2f}" if use["outside"] is not None else "")
            + (f"; vCPU switches {cpuuse.domains_total(use, 'switches'):.0f}/s, migrations "
               f"{cpuuse.domains_total(use, 'migrations'):.0f}/s" if use["domains"] else "")
            + (f"; outer machine busy outside the nested host {use['outer']['outside']:.2f}"
               if use.get("outer") else ""))


def wrk(ip, port, secs, script):
    """One wrk (one thread, 4 connections) against ip:port; requests/s."""
    return workloads.wrk(ip, port, 1, 4, secs, script, secs + 120)


def domus_of(environments):
    return next(e for e in environments if e.name == "domus")


def _test():
    """`multi.py`: Steps.measure makes a clone that reset again, in this
    host, and measures again; any other failure ends the attempt."""
    import tempfile
    import types

    class Dom:
        def __init__(self, state):
            self.state, self.calls, self.restarts = state, [], {}

        def domus(self, *args, check=True):
            self.calls.append(args[:2])
            if args[0] == "create":
                with open(args[1]) as f:
                    self.restarts[f.read().split("'")[1]] = 0
            return ""

        def domains(self):
            return [{"name": k, "restarts": v} for k, v in self.restarts.items()]

        def evidence(self, *_):
            return "evidence"

    class Clone:
        def __init__(self, dom, name):
            self.dom, self.name, self.ip, self.paused = dom, name, "10.0.0.1", True

        def up(self, deadline):
            self.ip = "10.0.0.2"

        def sh(self, cmd, timeout):
            return ""  # no watchdog timeouts in its journal

        def pause(self):
            self.paused = True

        def resume(self):
            self.paused = False

    with tempfile.TemporaryDirectory() as d:
        dom = Dom(d)
        saved = []
        run = types.SimpleNamespace(work=d, snap="snap", done={})
        # run.py's Run.note_retry, with each save noted (how many were counted)
        run.note_retry = lambda key, record: (run.done.setdefault(key, []).append(record),
                                         saved.append(len(run.done[key])))
        steps = Steps(dom, run, "t")
        steps.clones = [Clone(dom, f"t-{i}") for i in (1, 2)]
        dom.restarts = {"t-1": 0, "t-2": 0}
        tries = []

        def fn(clones):
            tries.append([c.ip for c in clones])
            if len(tries) == 1:  # t-2 reset in the measurement, which failed
                dom.restarts["t-2"] = 1
                raise RuntimeError("ssh: no answer")
            if len(tries) == 2:  # t-1 reset after a measurement that went on
                dom.restarts["t-1"] = 1
            return "rates"

        assert steps.measure(2, fn) == "rates"
        assert tries == [["10.0.0.1"] * 2, ["10.0.0.1", "10.0.0.2"], ["10.0.0.2"] * 2]
        assert [r["clone"] for r in run.done["clones_replaced"]] == ["t-2", "t-1"]
        assert all(r["when"] == "measured" for r in run.done["clones_replaced"])
        # Each saved as it was counted, before the clone was made again.
        assert saved == [1, 2], saved
        assert all(c.paused for c in steps.clones)
        assert ("create", os.path.join(d, "t-1.cfg")) in dom.calls

        # A failure with no clone reset is the attempt's.
        def broken(clones):
            raise RuntimeError("sysbench printed nothing")
        try:
            steps.measure(2, broken)
            raise AssertionError("a failure without a reset was retried")
        except RuntimeError as e:
            assert "printed nothing" in str(e)
        assert len(run.done["clones_replaced"]) == 2 and all(c.paused for c in steps.clones)

        # A clone that resets every time: REPLACEMENTS times made again, then
        # the attempt fails (the next nested host's).
        def resets(clones):
            dom.restarts["t-1"] = 1
            return "rates"
        try:
            steps.measure(2, resets)
            raise AssertionError("a clone that always resets was measured")
        except envs.Restarted as e:
            assert "t-1 reset while measured" in str(e)
        assert len(run.done["clones_replaced"]) == 2 + REPLACEMENTS


if __name__ == "__main__":
    _test()
    print("multi: ok")
