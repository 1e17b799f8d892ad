#!/usr/bin/env python3
"""bench/clones: clones of a snapshot against cold boots, and density.

Run inside the nested KVM host by tools/bench-clones. One `domus daemon`
(jailed VMMs, its defaults: the balloon with free page reporting on), kit
guests that print `up` from init and then idle:

  * cold boots: N domains of 256 MiB created at once (N in COUNTS); the time
    from the first request until every guest printed `up`, and each
    domain's own time to `up`;
  * clones: a 256 MiB template booted, idled, saved; then `POST /v1/clone`
    of N; the time until the answer (every clone's VMM running its vCPUs);
  * one of each (N = 1): a cold boot to init against a clone to running, the
    ratio the issue asks for;
  * host memory per domain (PSS of its VMM process, which holds its guest
    memory) after SETTLE_S seconds idle, for each of the above;
  * density at 128 MiB, DENSITY domains each way: booted from the kit's
    bzImage, from its ELF vmlinux, from the ELF with `mergeable = 1` (KSM
    run until it stops merging), and clones; host memory per idle domain,
    and how many such domains this host's memory would hold at that rate
    (admission control, which reserves maxmem, admits fewer).

Writes results.json and results.md here (from outside: `run.py report`).
"""
import concurrent.futures
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "bench"))
import benchlib  # noqa: E402
from domus_api import request  # noqa: E402
DOMUS = os.path.join(REPO, "target/release/domus")
COUNTS = [int(x) for x in os.environ.get("COUNTS", "8,32,64").split(",")]
DENSITY = int(os.environ.get("DENSITY", "16"))
SETTLE_S = float(os.environ.get("SETTLE_S", "20"))
WORK = "/tmp/bench-clones"
INIT = "console=ttyS0 quiet panic=-1 -- echo up; while :; do sleep 5; done"


def say(msg):
    print(f"bench/clones: {msg}", file=sys.stderr, flush=True)


def kit():
    out = subprocess.run([DOMUS, "kit", "--print"], check=True, capture_output=True,
                         text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Daemon:
    def __init__(self, k):
        self.state = os.path.join(WORK, "state")
        self.images = os.path.join(WORK, "images")
        shutil.rmtree(WORK, ignore_errors=True)
        os.makedirs(self.images)
        kit_dir = os.path.dirname(k["kernel"])
        self.proc = subprocess.Popen(
            [DOMUS, "daemon", "--state-dir", self.state, "--host-reserve", "256",
             "--start-timeout", "600", "--image-dir", self.images, "--image-dir", kit_dir, "--no-network"],
            stderr=open(os.path.join(WORK, "daemon.log"), "w"))
        self.sock = os.path.join(self.state, "domusd.sock")
        for _ in range(500):
            try:
                if request(self.sock, "GET", "/v1/info")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError("the daemon did not come up")

    def call(self, method, path, body=None, want=200):
        status, text = request(self.sock, method, path,
                               json.dumps(body) if body is not None else None)
        if status != want:
            raise RuntimeError(f"{method} {path}: {status} {text}")
        return json.loads(text) if text else None

    def create(self, name, mib, kernel, initrd, mergeable=False):
        cfg = (f"name = '{name}'\nmemory = {mib}\nkernel = '{kernel}'\nramdisk = '{initrd}'\n"
               f"extra = '{INIT}'\n" + ("mergeable = 1\n" if mergeable else ""))
        return self.call("POST", "/v1/domains", {"config": cfg, "file": f"{name}.cfg"}, 201)

    def console(self, dom_id):
        try:
            with open(os.path.join(self.state, "domains", str(dom_id), "console.log")) as f:
                return f.read()
        except OSError:
            return ""

    def domains(self):
        return [d for d in self.call("GET", "/v1/domains") if d["id"] != 0]

    def destroy_all(self):
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
            list(ex.map(lambda d: self.call("DELETE", f"/v1/domains/{d['id']}", want=204),
                        self.domains()))

    def stop(self):
        self.destroy_all()
        self.proc.kill()
        self.proc.wait()


def wait_up(d, ids, t0, timeout=1200):
    """Seconds from t0 until each domain in ids printed `up`."""
    up = {}
    end = time.monotonic() + timeout
    while len(up) < len(ids):
        for i in ids:
            if i not in up and "up" in d.console(i).split():
                up[i] = time.monotonic() - t0
        if time.monotonic() > end:
            raise TimeoutError(f"{len(ids) - len(up)} guests never printed up")
        time.sleep(0.05)
    return [up[i] for i in ids]


def memory_per_domain(d, ksm=False):
    """Mean PSS per domain in MiB after SETTLE_S seconds idle (with KSM, once
    it stops merging)."""
    time.sleep(SETTLE_S)
    if ksm:
        last, end = -1, time.monotonic() + 300
        while time.monotonic() < end:
            with open("/sys/kernel/mm/ksm/pages_sharing") as f:
                now = int(f.read())
            if now == last and now > 0:
                break
            last = now
            time.sleep(10)
    doms = d.domains()
    return sum(pss_kib(x["pid"]) for x in doms) / len(doms) / 1024


def cold(d, n, mib, kernel, initrd, mergeable=False):
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
        made = list(ex.map(lambda i: d.create(f"cold{i}", mib, kernel, initrd, mergeable),
                           range(n)))
    times = wait_up(d, [c["domain"]["id"] for c in made], t0)
    row = {"kind": "cold", "n": n, "mib": mib, "kernel": os.path.basename(kernel),
           "mergeable": mergeable, "all_up_s": max(times), "median_up_s": statistics.median(times),
           "per_s": n / max(times),
           "pss_mib_per_domain": memory_per_domain(d, ksm=mergeable)}
    d.destroy_all()
    return row


def clones(d, n, mib, kernel, initrd):
    made = d.create("tpl", mib, kernel, initrd)
    wait_up(d, [made["domain"]["id"]], time.monotonic())
    time.sleep(5)
    snap = os.path.join(d.images, f"tpl-{mib}-{n}.snap")
    d.call("PUT", "/v1/domains/tpl/save", {"file": snap})
    t0 = time.monotonic()
    out = d.call("POST", "/v1/clone", {"file": snap, "count": n, "prefix": "c"}, 201)
    took = time.monotonic() - t0
    assert len(out["domains"]) == n
    row = {"kind": "clone", "n": n, "mib": mib, "kernel": os.path.basename(kernel),
           "mergeable": False, "all_up_s": took, "median_up_s": None, "per_s": n / took,
           "pss_mib_per_domain": memory_per_domain(d)}
    d.destroy_all()
    for f in (snap, snap + ".mem"):
        os.remove(f)
    return row


def local_copy():
    """Runs the daemon (which starts each VMM as `domus run`, from its own
    binary) from a copy in the nested host's tmpfs: from the host's files
    (9p, read as pages fault in) every VMM start paid about 100 ms more
    for its 9 MiB binary (bench/snapshot, 2026-11-25)."""
    global DOMUS
    os.makedirs("/tmp/bench-clones-bin", exist_ok=True)
    to = "/tmp/bench-clones-bin/domus"
    shutil.copy2(DOMUS, to)
    DOMUS = to


def measure(dest):
    k = kit()
    local_copy()
    vmlinux = os.path.join(os.path.dirname(k["kernel"]), "vmlinux")
    with open("/sys/kernel/mm/ksm/pages_to_scan", "w") as f:
        f.write("10000")
    with open("/sys/kernel/mm/ksm/run", "w") as f:
        f.write("1")
    with open("/proc/meminfo") as f:
        host_mib = int(f.readline().split()[1]) // 1024
    # Rows measured by an earlier nested host that died are kept: each row
    # is written out as soon as it is measured (tools/bench-clones starts a
    # fresh host when one dies).
    rows = []
    if os.path.exists(dest):
        with open(dest) as f:
            rows = [r for r in json.load(f)["rows"] if "error" not in r]
    done = {r["label"] for r in rows}
    d = Daemon(k)
    try:
        plan = [("one cold boot", lambda: cold(d, 1, 256, k["kernel"], k["initrd"])),
                ("one clone", lambda: clones(d, 1, 256, k["kernel"], k["initrd"]))]
        for n in COUNTS:
            plan.append((f"{n} cold boots", lambda n=n: cold(d, n, 256, k["kernel"], k["initrd"])))
            plan.append((f"{n} clones", lambda n=n: clones(d, n, 256, k["kernel"], k["initrd"])))
        plan += [
            ("density, bzImage", lambda: cold(d, DENSITY, 128, k["kernel"], k["initrd"])),
            ("density, ELF", lambda: cold(d, DENSITY, 128, vmlinux, k["initrd"])),
            ("density, ELF + KSM", lambda: cold(d, DENSITY, 128, vmlinux, k["initrd"], True)),
            ("density, clones", lambda: clones(d, DENSITY, 128, vmlinux, k["initrd"])),
        ]
        for label, f in plan:
            if label in done:
                say(f"{label}: measured by an earlier host")
                continue
            say(label)
            try:
                r = f()
            except Exception as e:  # reported in the table, not hidden
                r = {"error": str(e)}
                d.destroy_all()
            r["label"] = label
            say(json.dumps(r))
            rows.append(r)
            with open(dest, "w") as f:
                json.dump({"host_mib": host_mib, "rows": rows, "settle_s": SETTLE_S,
                           "kernel": platform.release()}, f, indent=1)
    finally:
        d.stop()


def report(src, command):
    with open(src) as f:
        m = json.load(f)
    rows = {r["label"]: r for r in m["rows"]}
    doc = {
        "benchmark": "bench/clones",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": {**benchlib.machine(), "nested_host_mib": m["host_mib"],
                    "nested_kernel": m["kernel"]},
        "settle_s": m["settle_s"],
        "results": m["rows"],
    }
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    def cell(r, key, fmt):
        return fmt.format(r[key]) if r and r.get(key) is not None else "n/a"

    lines = [
        "# bench/clones: clones against cold boots, and density",
        "",
        f"{doc['date']}; nested KVM host ({m['host_mib']} MiB, 2 TCG CPUs, kernel {m['kernel']}); "
        f"`{command}`. One jailed daemon, run from a copy in the nested host's tmpfs; kit guests whose init prints `up` and idles. "
        f"Memory is the PSS of each domain's VMM process (its guest memory included) after "
        f"{m['settle_s']:.0f} s idle.",
        "",
        "| run | domains | guest | all running (s) | domains/s | median to init (s) | host MiB per domain | % of guest memory |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in m["rows"]:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error']} | | | | | | |")
            continue
        guest = f"{r['mib']} MiB, {r['kernel']}" + (", mergeable" if r["mergeable"] else "")
        pct = 100 * r["pss_mib_per_domain"] / r["mib"]
        lines.append(f"| {r['label']} | {r['n']} | {guest} | {r['all_up_s']:.2f} | "
                     f"{r['per_s']:.2f} | {cell(r, 'median_up_s', '{:.2f}')} | "
                     f"{r['pss_mib_per_domain']:.1f} | {pct:.1f} |")
    one_cold, one_clone = rows.get("one cold boot"), rows.get("one clone")
    lines += ["", "Ratios, in this run:", ""]
    if one_cold and one_clone and "error" not in one_cold and "error" not in one_clone:
        lines.append(f"- a cold boot to init / a clone to running (one domain): "
                     f"{one_cold['all_up_s'] / one_clone['all_up_s']:.1f}x "
                     f"({one_cold['all_up_s']:.2f} s against {one_clone['all_up_s']:.2f} s; "
                     "the issue's target is 100x)")
    for n in sorted({r["n"] for r in m["rows"] if "n" in r and r.get("mib") == 256}):
        c, k = rows.get(f"{n} cold boots"), rows.get(f"{n} clones")
        if c and k and "error" not in c and "error" not in k:
            lines.append(f"- {n} domains: clones/s over cold boots/s {k['per_s'] / c['per_s']:.1f}x; "
                         f"host memory per clone / per cold-booted domain "
                         f"{k['pss_mib_per_domain'] / c['pss_mib_per_domain']:.2f}")
    usable = m["host_mib"] - 256
    for label in ("density, bzImage", "density, ELF", "density, ELF + KSM", "density, clones"):
        r = rows.get(label)
        if r and "error" not in r:
            lines.append(f"- {label}: {r['pss_mib_per_domain']:.1f} MiB per idle 128 MiB domain, "
                         f"so this host's {usable} MiB would hold about "
                         f"{int(usable / r['pss_mib_per_domain'])} of them (admission, which "
                         f"reserves maxmem and 64 MiB per VMM, admits {usable // 192})")
    benchlib.write_markdown(HERE, lines)


if __name__ == "__main__":
    benchlib.main(measure, report, "tools/bench-clones")
