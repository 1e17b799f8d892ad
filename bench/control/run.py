#!/usr/bin/env python3
"""bench/control: the control daemon under load.

Inside one host (the nested KVM host on the development machines), with a
fresh `domus daemon` and state directory per size N in SIZES, once with its
VMMs jailed (the default) and once with --no-jail (JAIL_MODES):

  * create rate: N domains created by N concurrent clients through the
    daemon's API (each a 128 MiB kit guest that idles); domains per second
    from the first request to the last domain answering on its own API;
  * API latency: while that runs, one client sends GET /v1/info back to
    back; p50 and p99;
  * daemon memory per domain: the daemon's RSS with N domains, minus its
    RSS with none, divided by N;
  * accounting overhead: with N domains, a client lists every domain with
    its CPU accounting once a second (what `domus top` does) for SAMPLE_S
    seconds; the daemon's CPU time over that time, in percent of one CPU.

Run with tools/bench-control; writes results.json and results.md here.
"""
import concurrent.futures
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
sys.path.insert(0, os.path.dirname(HERE))
import benchlib  # noqa: E402
from domus_api import request  # noqa: E402
DOMUS = os.path.join(REPO, "target/release/domus")
SIZES = [int(x) for x in os.environ.get("SIZES", "1,8,32,64").split(",")]
# Each size with the daemon's jail (its default) and with --no-jail.
JAIL = [m == "jail" for m in os.environ.get("JAIL_MODES", "jail,no-jail").split(",")]
SAMPLE_S = float(os.environ.get("SAMPLE_S", "20"))
# N domains created at once on two slow CPUs: a VMM may take more than the
# daemon's default 60 s to answer (every guest already started competes for
# the CPUs), so the daemon is given longer; the table says how long.
START_TIMEOUT_S = int(os.environ.get("START_TIMEOUT_S", "600"))


def say(msg):
    print(f"bench/control: {msg}", file=sys.stderr, flush=True)


def kit():
    out = subprocess.run([DOMUS, "kit", "--print"], check=True, capture_output=True,
                         text=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        s = f.read()
    fields = s[s.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def one_size(n, k, jail):
    state = tempfile.mkdtemp(prefix="domus-bench-control-")
    daemon = subprocess.Popen([DOMUS, "daemon", "--state-dir", state, "--host-reserve", "256",
                               "--start-timeout", str(START_TIMEOUT_S), "--no-network"]
                              + ([] if jail else ["--no-jail"]),
                              stderr=subprocess.DEVNULL)
    sock = os.path.join(state, "domusd.sock")
    for _ in range(500):
        if os.path.exists(sock):
            try:
                if request(sock, "GET", "/v1/info")[0] == 200:
                    break
            except OSError:
                pass
        time.sleep(0.02)
    time.sleep(0.5)
    rss0 = proc_rss_kib(daemon.pid)
    cfg = ("name = '{name}'\nmemory = 128\nkernel = '" + k["kernel"] + "'\nramdisk = '" +
           k["initrd"] + "'\nextra = 'console=ttyS0 quiet panic=-1 -- while :; do sleep 5; done'\n")

    latencies, stop = [], threading.Event()

    def pinger():
        while not stop.is_set():
            t = time.perf_counter()
            request(sock, "GET", "/v1/info")
            latencies.append((time.perf_counter() - t) * 1000)

    def create(i):
        body = json.dumps({"config": cfg.format(name=f"b{i}"), "file": f"b{i}.cfg"})
        status, text = request(sock, "POST", "/v1/domains", body)
        if status != 201:
            raise RuntimeError(f"create b{i}: {status} {text}")

    p = threading.Thread(target=pinger)
    p.start()
    t0 = time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as ex:
            list(ex.map(create, range(n)))
    except BaseException:
        # Leave nothing running: the nested host ends only when all is gone.
        stop.set()
        daemon.kill()
        subprocess.run(["pkill", "-9", "-f", "--", f"--config {state}"])
        raise
    create_s = time.perf_counter() - t0
    stop.set()
    p.join()
    time.sleep(2)
    rss_n = proc_rss_kib(daemon.pid)

    # Accounting: list with CPU accounting once a second, as `domus top` does.
    c0, t1 = proc_cpu_s(daemon.pid), time.perf_counter()
    while time.perf_counter() - t1 < SAMPLE_S:
        status, _ = request(sock, "GET", "/v1/domains")
        assert status == 200
        time.sleep(1)
    acct_pct = (proc_cpu_s(daemon.pid) - c0) / (time.perf_counter() - t1) * 100

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
        list(ex.map(lambda i: request(sock, "DELETE", f"/v1/domains/b{i}"), range(n)))
    daemon.kill()
    daemon.wait()
    shutil.rmtree(state, ignore_errors=True)
    lat = sorted(latencies)
    return {
        "domains": n,
        "jail": jail,
        "create_s": create_s,
        "domains_per_s": n / create_s,
        "api_requests": len(lat),
        "api_p50_ms": statistics.median(lat) if lat else None,
        "api_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        "daemon_rss_kib_idle": rss0,
        "daemon_rss_kib": rss_n,
        "daemon_kib_per_domain": (rss_n - rss0) / n,
        "accounting_cpu_pct": acct_pct,
    }


def main():
    k = kit()
    rows = []
    for n in SIZES:
        for jail in JAIL:
            say(f"{n} domains, " + ("jailed" if jail else "--no-jail"))
            rows.append(one_size(n, k, jail))
            say(json.dumps(rows[-1]))
    doc = {
        "benchmark": "bench/control",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "tools/bench-control",
        "machine": benchlib.machine(),
        "config": {"sizes": SIZES, "guest_memory_mib": 128, "accounting_sample_s": SAMPLE_S,
                   "jail": JAIL, "start_timeout_s": START_TIMEOUT_S},
        "results": rows,
    }
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    lines = [
        "# bench/control results",
        "",
        f"{doc['date']}, nested KVM host ({doc['machine']['cpus']} CPUs, "
        f"kernel {doc['machine']['kernel']}), "
        f"command `tools/bench-control`. Guests: the kit kernel, 128 MiB, idle.",
        "",
        "| domains | VMMs | create (s) | domains/s | API p50 (ms) | API p99 (ms) | daemon KiB/domain | accounting CPU (%) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mode = "jailed" if r["jail"] else "--no-jail"
        lines.append(f"| {r['domains']} | {mode} | {r['create_s']:.2f} | {r['domains_per_s']:.1f} | "
                     f"{r['api_p50_ms']:.2f} | {r['api_p99_ms']:.2f} | "
                     f"{r['daemon_kib_per_domain']:.0f} | {r['accounting_cpu_pct']:.1f} |")
    lines += [
        "",
        "Create is measured from the first request to the last domain's VMM answering on its "
        "own API (the guest kernels keep booting after that). API latency is GET /v1/info sent "
        "back to back while the creates run. Accounting CPU is the daemon's CPU time while a "
        f"client lists every domain with its CPU accounting once a second for {SAMPLE_S:.0f} s. "
        "Jailed is the daemon's default (each VMM in its namespaces, root, user and Landlock, "
        "see README, Security); --no-jail runs them as root in the host's namespaces, both "
        "under the seccomp filter, in the same run. The daemon runs with "
        f"`--start-timeout {START_TIMEOUT_S}`: with every domain created at once on two slow "
        "CPUs, a VMM can take longer than the default 60 s to answer.",
        "",
    ]
    by = {(r["domains"], r["jail"]): r for r in rows}
    pairs = [(n, by[(n, True)], by[(n, False)]) for n in SIZES if (n, True) in by and (n, False) in by]
    if pairs:
        lines += ["| domains | create time jailed / --no-jail | API p50 jailed / --no-jail |",
                  "| ---: | ---: | ---: |"]
        for n, j, nj in pairs:
            lines.append(f"| {n} | {j['create_s'] / nj['create_s']:.2f} | "
                         f"{j['api_p50_ms'] / nj['api_p50_ms']:.2f} |")
        lines.append("")
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
