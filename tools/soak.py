#!/usr/bin/env python3
"""What tools/soak runs (see there for what it is for), in three commands.

  soak.py boots --out DIR --rounds N --guests debian,kit --vmms domus,qemu --first domus
      Runs inside one nested host (tools/kvm-host): boots the guests one after
      another and appends one JSON record per boot to DIR/boots.jsonl (a
      "start" record before each boot, so a boot cut short by the host's death
      is still known). A stalled guest is captured into DIR/stall-NNN/.

  soak.py capture PID DIR [--console FILE]
      Captures a stalled VMM as a soak does (for a test whose guest stalled)
      and prints the verdict.

  soak.py summary [--out OUT] DIR...
      Counts the records of one or more soak runs per platform, guest and VMM,
      and writes results.json and results.md into OUT (default: the first DIR).

Outcomes of a boot:
  clean    the guest reported a finished boot with no failed unit and powered off
  failed   it reported a finished boot, but with failed units or not "running"
  stall    no console output for STALL_S seconds (captured, then killed)
  reset    the VMM exited before the report: a triple fault, reset or crash
  slow     still printing after LIMIT_S seconds
  lost     started, but the nested host died before it ended
"""

import argparse
import base64
import collections
import datetime
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time

STALL_S = 60
LIMIT_S = 600
POWEROFF_S = 180
MARK = "domus-boot-check:"
MARK_RE = re.compile(r"domus-boot-check: state=(\S*) uptime=(\S*) failed=\[(.*)\]")


def now():
    return time.monotonic()


# ------------------------------------------------------------------ boots --


class Guest:
    """What to boot: kernel, initrd, an optional root disk, the command line."""

    def __init__(self, name, kernel, initrd, disk, cmdline):
        self.name, self.kernel, self.initrd = name, kernel, initrd
        self.disk, self.cmdline = disk, cmdline


def guests(scratch, wanted):
    out = {}
    if "kit" in wanted:
        kit = os.environ.get("DOMUS_KIT_DIR") or os.path.expanduser("~/.cache/domus/kit")
        # The kit's init runs the command and powers off.
        cmd = f"echo {MARK} state=running uptime=$(cut -d' ' -f1 /proc/uptime) failed=[]"
        out["kit"] = Guest(
            "kit",
            f"{kit}/vmlinuz",
            f"{kit}/initramfs.cpio",
            None,
            "console=ttyS0 panic=-1 domus.cmd=" + base64.b64encode(cmd.encode()).decode(),
        )
    if "debian" in wanted:
        d = os.environ["DOMUS_DEBIAN_GUEST"]
        # One copy of the image in the nested host's memory, copied again
        # (sparse) for each boot: the guest writes to its root.
        base = os.path.join(scratch, "debian-base.img")
        t = now()
        # Over 9p a plain copy would read all of the sparse image.
        subprocess.run(f"zstd -dc '{d}/root.img.tar.zst' | tar -xSf - -C '{scratch}'"
                       f" && mv '{scratch}/root.img' '{base}'", shell=True, check=True)
        print(f"soak: copied the Debian image in {now() - t:.1f} s", flush=True)
        out["debian"] = Guest(
            "debian",
            f"{d}/vmlinuz",
            f"{d}/initrd.img",
            base,
            "root=/dev/vda rw console=ttyS0 panic=-1 domus.poweroff",
        )
    return out


def command(vmm, g, disk, vcpus, memory):
    if vmm == "domus":
        cmd = [os.environ.get("DOMUS_BIN", "target/release/domus"), "run"]
        cmd += ["--kernel", g.kernel, "--initrd", g.initrd, "--cmdline", g.cmdline]
        cmd += ["--vcpus", str(vcpus), "--memory", f"{memory}M"]
        if disk:
            cmd += ["--disk", disk]
        return cmd + os.environ.get("SOAK_DOMUS_ARGS", "").split()
    qemu = os.environ.get("KVM_HOST_QEMU", "qemu-system-x86_64")
    cmd = [qemu, "-M", "pc", "-accel", "kvm", "-cpu", "host"]
    if vmm == "qemu-nosmm":
        # No System Management Mode: SeaBIOS then sends no SMI at boot, and
        # the nested host's KVM emulates no SMM entry or RSM for the guest.
        cmd += ["-machine", "smm=off"]
    elif vmm != "qemu":
        raise SystemExit(f"soak: unknown VMM {vmm!r} (domus, qemu, qemu-nosmm)")
    cmd += ["-smp", str(vcpus), "-m", f"{memory}M"]
    cmd += ["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"]
    cmd += ["-serial", "stdio", "-device", "virtio-rng-pci"]
    # Thread names (CPU 0/KVM ...) for the stall captures.
    cmd += ["-name", "soak,debug-threads=on"]
    cmd += ["-kernel", g.kernel, "-initrd", g.initrd, "-append", g.cmdline]
    if disk:
        cmd += ["-drive", f"file={disk},if=virtio,format=raw"]
    return cmd + os.environ.get("SOAK_QEMU_ARGS", "").split()


def read_file(path, limit=65536):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError as e:
        return f"<{e.strerror}>"


def threads(pid):
    """Each thread of PID: comm, state, CPU ticks, wchan, kernel stack."""
    out = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        stat = read_file(f"{base}/stat")
        fields = stat[stat.rfind(")") + 2 :].split()
        out.append(
            {
                "tid": int(tid),
                "comm": read_file(f"{base}/comm").strip(),
                "state": fields[0] if fields else "?",
                "ticks": int(fields[11]) + int(fields[12]) if len(fields) > 12 else -1,
                "wchan": read_file(f"{base}/wchan").strip(),
                "stack": read_file(f"{base}/stack").strip().splitlines(),
            }
        )
    return out


def timer_ticks():
    """The local timer interrupt counts per CPU (the LOC line)."""
    for line in read_file("/proc/interrupts").splitlines():
        if line.strip().startswith("LOC:"):
            return [int(x) for x in line.split()[1:] if x.isdigit()]
    return []


TRACEFS = "/sys/kernel/tracing"


def delivering(line):
    """Whether a kvm_exit trace line has exit_int_info valid (bit 31): the exit
    came while an event was being delivered to the guest."""
    m = re.search(r"intr_info (0x[0-9a-f]+)", line)
    return bool(m and int(m.group(1), 16) >> 31)


def trace_exits(seconds, dest, tids=None):
    """Records the kvm_exit and kvm_userspace_exit tracepoints for SECONDS;
    with TIDS, only those threads' (one VMM's: other guests running beside
    it must not count for it)."""
    if not os.path.isdir(f"{TRACEFS}/events"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=False)
    ev = f"{TRACEFS}/events/kvm"
    if not os.path.isdir(ev):
        return {"error": "no kvm tracepoints"}
    def w(path, text):
        with open(path, "w") as f:
            f.write(text)
    w(f"{TRACEFS}/buffer_size_kb", "4096")
    w(f"{TRACEFS}/trace", "")
    for e in ("kvm_exit", "kvm_userspace_exit"):
        w(f"{ev}/{e}/enable", "1")
    time.sleep(seconds)
    for e in ("kvm_exit", "kvm_userspace_exit"):
        w(f"{ev}/{e}/enable", "0")
    text = read_file(f"{TRACEFS}/trace", 64 << 20)
    w(f"{TRACEFS}/trace", "")
    lines = [l for l in text.splitlines() if not l.startswith("#")]
    if tids is not None:
        def task_tid(l):
            t = re.match(r"\s*.+?-(\d+)\s+\[\d+\]", l)
            return int(t.group(1)) if t else None
        lines = [l for l in lines if task_tid(l) in tids]
    with open(dest, "w") as f:
        f.write("\n".join(lines[:5000]) + "\n")
    return summarize(lines, seconds)


def summarize(lines, seconds):
    """Counts a kvm_exit/kvm_userspace_exit trace's exits, in all and per
    thread (the trace line's task, e.g. `vcpu1-523`): a guest's vCPUs stall
    one by one, so one can loop inside KVM_RUN while another's exits still
    reach the VMM."""
    def counts():
        return {"reasons": collections.Counter(), "rips": collections.Counter(),
                "user": 0, "delivery": 0}
    total = counts()
    per = collections.defaultdict(counts)
    for l in lines:
        t = re.match(r"\s*(.+?-\d+)\s+\[\d+\]", l)
        mine = per[t.group(1)] if t else counts()
        if "kvm_userspace_exit" in l:
            total["user"] += 1
            mine["user"] += 1
            continue
        m = re.search(r"reason (\S+) rip (0x[0-9a-f]+)", l)
        if m:
            for c in (total, mine):
                c["reasons"][m.group(1)] += 1
                c["rips"][m.group(2)] += 1
                c["delivery"] += delivering(l)

    def out(c):
        return {
            "seconds": seconds,
            "kvm_exits": sum(c["reasons"].values()),
            "userspace_exits": c["user"],
            "in_delivery": c["delivery"],
            "reasons": dict(c["reasons"].most_common(5)),
            "rips": dict(c["rips"].most_common(3)),
        }
    summary = out(total)
    summary["threads"] = {task: out(c) for task, c in sorted(per.items())}
    return summary


def capture(pid, console, dest, rings=None):
    """What a stalled VMM is doing, before it is killed. `rings`: the
    findings of its virtio rings (the `findings` of the rings.json that the
    guest tests write from GET /v1/domain/rings)."""
    os.makedirs(dest, exist_ok=True)
    before = threads(pid)
    t0 = timer_ticks()
    time.sleep(1)
    after = threads(pid)
    t1 = timer_ticks()
    ticking = len(t0) > 0 and len(t0) == len(t1) and all(b > a for a, b in zip(t0, t1))
    grew = {t["tid"]: t["ticks"] for t in before}
    for t in after:
        t["ticks_in_1s"] = t["ticks"] - grew.get(t["tid"], t["ticks"])
    info = {"threads": after, "timer_ticks": [t0, t1], "host_ticking": ticking,
            "rings": rings or []}
    # Tracing a host whose timers have stopped can finish it off.
    if ticking:
        info["trace"] = trace_exits(2, os.path.join(dest, "kvm_exit.trace"),
                                    {t["tid"] for t in after})
    info["verdict"] = verdict(info)
    with open(os.path.join(dest, "capture.json"), "w") as f:
        json.dump(info, f, indent=1)
    with open(os.path.join(dest, "console.tail"), "w") as f:
        f.write("".join(console[-60:]))
    return info


def is_vcpu(comm):
    return re.fullmatch(r"vcpu\d+|CPU \d+/KVM", comm) is not None


def verdict(info):
    """Tells a platform stall from one the VMM could cause, first from the
    threads and the kvm_exit trace, then from the virtio rings when those
    left it unclear."""
    v = thread_verdict(info)
    if v.startswith(("platform:", "vmm:", "exits reach")):
        return v
    return ring_verdict(info.get("rings") or []) or v


def ring_verdict(findings):
    """A guest that waits on a device it never hears from: the rings say
    whose fault it is (domus_api::rings). A used index past the driver's
    event index with no interrupt sent since is the VMM's; an interrupt
    sent on an unmasked, routed vector that the guest never handled was
    lost between the irqfd and the guest, below Domus."""
    owed = [f["text"] for f in findings if f["kind"] == "owed"]
    if owed:
        return "vmm: a device owes the guest an interrupt: " + "; ".join(owed)
    lost = [f["text"] for f in findings if f["kind"] == "not_handled"]
    if lost:
        return "platform: the guest never handled an interrupt the VMM sent: " + "; ".join(lost)
    return None


def thread_verdict(info):
    """The platform's known failure (QEMU TCG's nested SVM, tools/NOTES.md)
    is a vCPU looping inside KVM_RUN on nested page faults at one guest RIP
    while an exception is being delivered, with no exit reaching the VMM. A
    vCPU blocked in the VMM, or exits that reach it, point at the VMM; every
    vCPU halted with no exits may be either (a guest waiting for a device's
    interrupt)."""
    vcpus = [t for t in info["threads"] if is_vcpu(t["comm"])]
    if not vcpus:
        return "no vCPU threads"
    tr = info.get("trace") or {}
    blocked = [t["comm"] for t in vcpus if t["state"] in "SD" and "kvm" not in t["wchan"]
               and not any("kvm_vcpu" in s for s in t["stack"])]
    if blocked:
        return "vmm: vCPU threads blocked outside KVM_RUN: " + ", ".join(blocked)
    # One vCPU in the loop stalls the guest (RCU stalls, IPIs that never
    # return) while the others' exits still reach the VMM.
    for task, t in (tr.get("threads") or {}).items():
        if is_vcpu(task.rsplit("-", 1)[0]) and t["userspace_exits"] == 0 and looping(t):
            return f"platform: {task} loops on nested page faults inside KVM_RUN ({what(t)})"
    if tr.get("userspace_exits", 0) > 0:
        return f"exits reach the VMM ({tr['userspace_exits']} in {tr['seconds']} s)"
    if not info["host_ticking"]:
        return "platform: the nested host's timers stopped (not traced)"
    if tr.get("kvm_exits", 0):
        if looping(tr):
            return f"platform: a vCPU loops on nested page faults inside KVM_RUN ({what(tr)})"
        return "unclear: " + what(tr)
    if all("kvm_vcpu_block" in t["wchan"] for t in vcpus):
        return "unclear: every vCPU halted in the guest, no interrupt arrives, no exits traced"
    return "unclear: no exits traced"


def looping(tr):
    """The nested host's known loop (tools/NOTES.md): nearly every exit a
    nested page fault at one RIP while an event is being delivered."""
    exits = tr.get("kvm_exits", 0)
    if exits < 100:
        return False
    reason, n = next(iter(tr["reasons"].items()))
    _, at = next(iter(tr["rips"].items()))
    return reason == "npf" and n >= 0.9 * exits and at >= 0.9 * exits \
        and tr.get("in_delivery", 0) >= 0.9 * exits


def what(tr):
    reason, n = next(iter(tr["reasons"].items()))
    rip, at = next(iter(tr["rips"].items()))
    return (f"{tr['kvm_exits']} exits in {tr['seconds']} s, {n} {reason}, {at} at rip {rip}, "
            f"{tr.get('in_delivery', 0)} during event delivery, none to the VMM")


def boot_one(vmm, g, disk, vcpus, memory, stall_dir):
    cmd = command(vmm, g, disk, vcpus, memory)
    errpath = os.path.join(os.path.dirname(stall_dir), "last-stderr.log")
    err = open(errpath, "wb")
    t0 = now()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
    console = []
    partial = b""
    last = t0
    rec = {"outcome": None}
    marked_at = None
    fd = p.stdout.fileno()
    while True:
        r, _, _ = select.select([fd], [], [], 1.0)
        t = now()
        if r:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            last = t
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for raw in lines:
                line = raw.decode(errors="replace")
                console.append(line + "\n")
                m = MARK_RE.search(line)
                if m and marked_at is None:
                    marked_at = t
                    rec.update(state=m.group(1), guest_uptime=float(m.group(2) or 0),
                               failed_units=m.group(3).split(), boot_s=round(t - t0, 2))
        if t - last > STALL_S:
            rec["outcome"] = "stall"
            rec["last_output_s"] = round(last - t0, 1)
            if marked_at is not None:
                rec["detail"] = "while powering off, after the report"
            cap = capture(p.pid, console, stall_dir)
            rec["verdict"] = cap["verdict"]
            rec["capture"] = stall_dir
            break
        if marked_at is not None:
            if t - marked_at > POWEROFF_S:
                rec["outcome"] = "slow"
                rec["detail"] = f"no power-off {POWEROFF_S} s after the report"
                break
        elif t - t0 > LIMIT_S:
            rec["outcome"] = "slow"
            rec["detail"] = f"still printing after {LIMIT_S} s"
            break
    if rec["outcome"] is None:
        # The console closed: the VMM is on its way out.
        try:
            p.wait(POWEROFF_S)
        except subprocess.TimeoutExpired:
            rec["outcome"] = "slow"
            rec["detail"] = f"the VMM still ran {POWEROFF_S} s after its console closed"
    if p.poll() is None:
        p.kill()
    code = p.wait()
    err.close()
    rec["exit"] = code
    rec["wall_s"] = round(now() - t0, 2)
    stderr = read_file(errpath)
    if rec["outcome"] is None:
        if marked_at is None:
            rec["outcome"] = "reset"
            rec["detail"] = "triple fault" if "triple-fault" in stderr else f"exit {code} before the report"
        elif rec.get("state") == "running" and not rec["failed_units"] and code == 0:
            rec["outcome"] = "clean"
        else:
            rec["outcome"] = "failed"
    if rec["outcome"] != "clean":
        rec["console_tail"] = "".join(console[-15:])[-3000:]
        rec["stderr_tail"] = stderr[-1500:]
    return rec


def cmd_boots(a):
    os.makedirs(a.out, exist_ok=True)
    scratch = os.environ.get("TMPDIR", "/tmp") + "/soak"
    os.makedirs(scratch, exist_ok=True)
    gs = guests(scratch, a.guests.split(","))
    vmms = a.vmms.split(",")
    if a.first in vmms:
        vmms.remove(a.first)
        vmms.insert(0, a.first)
    log = open(os.path.join(a.out, "boots.jsonl"), "a")
    def write(rec):
        log.write(json.dumps(rec) + "\n")
        log.flush()
        os.fsync(log.fileno())
    n = 0
    for r in range(a.rounds):
        order = vmms if r % 2 == 0 else vmms[::-1]  # ABBA
        for gname in a.guests.split(","):
            g = gs[gname]
            for vmm in order:
                n += 1
                base = {"host": a.host, "platform": a.platform, "guest": gname, "vmm": vmm, "seq": n}
                write(dict(base, event="start", at=datetime.datetime.now().isoformat(timespec="seconds")))
                disk = None
                if g.disk:
                    disk = os.path.join(scratch, "boot.img")
                    subprocess.run(["cp", "--sparse=always", g.disk, disk], check=True)
                rec = boot_one(vmm, g, disk, a.vcpus, a.memory, os.path.join(a.out, f"stall-{a.host}-{n:03d}"))
                if disk:
                    os.unlink(disk)
                write(dict(base, event="end", **rec))
                extra = rec.get("verdict") or rec.get("detail") or ""
                print(f"soak: host {a.host} #{n} {gname} {vmm}: {rec['outcome']} in {rec['wall_s']} s"
                      + (f" (boot {rec['boot_s']} s)" if "boot_s" in rec else "")
                      + (f": {extra}" if extra else ""), flush=True)


def cmd_capture(a):
    console = open(a.console, errors="replace").readlines() if a.console else []
    rings = json.load(open(a.rings))["findings"] if a.rings else None
    info = capture(a.pid, console, a.dir, rings)
    # Each thread's exits, so that a log that outlives the capture still
    # shows which vCPU did what.
    for task, t in ((info.get("trace") or {}).get("threads") or {}).items():
        print(f"soak: {task}: {t['kvm_exits']} exits {t['reasons']}, top rips {t['rips']}, "
              f"{t['in_delivery']} in delivery, {t['userspace_exits']} to the VMM")
    for f in info["rings"]:
        print(f"soak: rings: {f['kind']}: {f['text']}")
    print(f"soak: captured in {a.dir}\nverdict: {info['verdict']}")


# ---------------------------------------------------------------- summary --

OUTCOMES = ["clean", "failed", "stall", "reset", "slow", "lost"]


def load(dirs):
    boots, hosts, runs = [], [], []
    for d in dirs:
        rp = os.path.join(d, "run.json")
        if os.path.exists(rp):
            runs.append(dict(json.load(open(rp)), dir=os.path.basename(os.path.normpath(d))))
        starts, ends = {}, {}
        path = os.path.join(d, "boots.jsonl")
        if os.path.exists(path):
            for line in open(path):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut by the host's death
                key = (r["host"], r["seq"])
                (starts if r["event"] == "start" else ends)[key] = r
        for key, s in starts.items():
            b = ends.get(key) or dict(s, outcome="lost")
            if b.get("capture"):
                # The verdict again, from the capture, by this version's rules.
                cap = os.path.join(d, os.path.basename(b["capture"]))
                try:
                    info = json.load(open(os.path.join(cap, "capture.json")))
                    tr = info.get("trace")
                    if tr is not None and "in_delivery" not in tr:
                        trace = open(os.path.join(cap, "kvm_exit.trace"))
                        tr["in_delivery"] = sum(map(delivering, trace))
                    b["verdict"] = verdict(info)
                except (OSError, ValueError):
                    pass
            boots.append(b)
        hp = os.path.join(d, "hosts.jsonl")
        if os.path.exists(hp):
            hosts += [json.loads(l) for l in open(hp) if l.strip()]
    return boots, hosts, runs


def cmd_summary(a):
    boots, hosts, runs = load(a.dirs)
    rows = collections.OrderedDict()
    for b in boots:
        key = (b["platform"], b["guest"], b["vmm"])
        row = rows.setdefault(key, collections.Counter())
        row[b["outcome"]] += 1
        row["boots"] += 1
        if b["outcome"] == "stall" and not str(b.get("verdict", "")).startswith("platform"):
            row["stall_not_platform"] += 1
    boot_s = collections.defaultdict(list)
    for b in boots:
        if b["outcome"] == "clean":
            boot_s[(b["platform"], b["guest"], b["vmm"])].append(b["boot_s"])
    deaths = collections.Counter(h["platform"] for h in hosts if h["outcome"] != "ok")
    nhosts = collections.Counter(h["platform"] for h in hosts)
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "runs": runs,
        "rows": [dict(platform=k[0], guest=k[1], vmm=k[2], median_boot_s=statistics.median(boot_s[k]) if boot_s[k] else None, **v)
                 for k, v in rows.items()],
        "hosts": hosts,
        "host_deaths": dict(deaths),
    }
    out = a.out or a.dirs[0]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    md = [f"# Soak: {result['date']}", "", "Runs (started, machine, command):", ""]
    md += [f"- {r['dir']}: {r.get('started', '?')}, {r.get('machine', '?')}: `{r.get('command', '?')}`"
           for r in runs]
    md += ["",
          "| platform | guest | VMM | boots | clean | failed units | stalls (not platform) | resets | slow | lost | median boot s |",
          "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        mb = f"{r['median_boot_s']:.1f}" if r["median_boot_s"] is not None else "-"
        md.append(f"| {r['platform']} | {r['guest']} | {r['vmm']} | {r['boots']} | {r.get('clean', 0)} | "
                  f"{r.get('failed', 0)} | {r.get('stall', 0)} ({r.get('stall_not_platform', 0)}) | "
                  f"{r.get('reset', 0)} | {r.get('slow', 0)} | {r.get('lost', 0)} | {mb} |")
    md += ["", "| platform | nested hosts | died |", "| --- | ---: | ---: |"]
    for p, n in nhosts.items():
        md.append(f"| {p} | {n} | {deaths.get(p, 0)} |")
    md += ["", "Boots that were not clean:", ""]
    for b in boots:
        if b["outcome"] != "clean":
            why = b.get("verdict") or b.get("detail") or ", ".join(b.get("failed_units", [])) or ""
            md.append(f"- {b['platform']} host {b['host']} #{b['seq']} {b['guest']} {b['vmm']}: {b['outcome']}"
                      + (f": {why}" if why else ""))
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("boots")
    b.add_argument("--out", required=True)
    b.add_argument("--host", type=int, default=1)
    b.add_argument("--platform", default=os.environ.get("KVM_HOST_PLATFORM", "backports"))
    b.add_argument("--rounds", type=int, default=2)
    b.add_argument("--guests", default="debian,kit")
    b.add_argument("--vmms", default="domus,qemu")
    b.add_argument("--first", default="domus")
    b.add_argument("--vcpus", type=int, default=2)
    b.add_argument("--memory", type=int, default=1024)
    c = sub.add_parser("capture", help="capture a stalled VMM (as a stall of a soak boot is)")
    c.add_argument("pid", type=int)
    c.add_argument("dir")
    c.add_argument("--console", help="a file with the console's output")
    c.add_argument("--rings", help="the rings.json the guest tests write (GET /v1/domain/rings)")
    s = sub.add_parser("summary")
    s.add_argument("--out", help="where results.json and results.md go (default: the first DIR)")
    s.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    {"boots": cmd_boots, "summary": cmd_summary, "capture": cmd_capture}[a.cmd](a)


if __name__ == "__main__":
    main()
