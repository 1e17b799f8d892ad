"""bench/paper's Figure 6 (the paper's section 4.4), performance
isolation: two good clones measured alone and beside antisocial ones
(multi.py's clones)."""
import os
import subprocess
import time

import cpuuse
import envs
import workloads
from envs import say
from multi import TEMPLATE_MIB, at_once, cpu_note, destroy, domus_of, start_clones, value, wrk


# Figure 6's antisocial domains: each runs its hog in a loop from its
# start, and is paused in the phases it is not in.
HOGS = {
    # A sustained dd and a file system workload of many small file
    # creations in large directories (the paper's third domain).
    "disk": ("while :; do dd if=/dev/zero of=hog.dd bs=1M count=256 oflag=direct status=none; done & "
             "while :; do mkdir -p hogdir; for i in $(seq 20000); do : > hogdir/f$i; done; "
             "rm -rf hogdir; done & wait"),
    # A fork bomb (bounded by stress-ng's workers) and a memory hog that
    # asks for twice the domain's memory, touches it, and starts again
    # when the guest's OOM killer ends it (the paper's fourth domain).
    "forkmem": ("while :; do stress-ng --fork 8 --vm 2 --vm-bytes 100% --vm-keep -t 60 "
                ">/dev/null 2>&1; done"),
    # TCP to the nested host as fast as it goes, on 4 connections.
    "net": f"while :; do iperf3 -c {envs.GATEWAY} -t 60 -P 4 >/dev/null 2>&1 || sleep 1; done",
}
FIG6_PHASES = {"alone": [], "disk": ["disk"], "forkmem": ["forkmem"], "disk+forkmem": ["disk", "forkmem"],
               "net": ["net"]}


def fig6(environments, run):
    """Figure 6 (the paper's section 4.4), performance isolation: two good
    domains (the web workload under wrk from the nested host, PostgreSQL
    under pgbench -S) measured at once, first with the antisocial domains
    paused ("alone"), then with each antisocial domain running (a disk
    hog, a fork bomb with a memory hog, both, a network hog); every domain
    has the same weight. The good domains' throughput under each, relative
    to alone."""
    dom = domus_of(environments)
    names = ["web", "pg"] + list(HOGS)
    secs = 10 if run.quick else 20
    script = os.path.join(run.work, "pages.lua")
    with open(script, "w") as f:
        f.write(workloads.WRK_SCRIPT)
    server = subprocess.Popen(["iperf3", "-s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        clones = dict(zip(names, start_clones(dom, run, len(names), "iso")))
        clones["web"].sh(workloads.web_prepare(clones["web"].helper, workloads.WEB_PORT, 1), 300)
        for hog, cmd in HOGS.items():
            c = clones[hog]
            c.sh(f"cat > hog.sh <<'HOG_EOF'\n{cmd}\nHOG_EOF\n"
                 "nohup bash hog.sh > /dev/null 2>&1 < /dev/null & echo started", 120)
            c.pause()

        def good():
            web, pg = at_once([
                lambda: wrk(clones["web"].ip, workloads.WEB_PORT, secs, script),
                lambda: value(clones["pg"].sh(workloads.pg_command("pg_ro", 1, run.quick, secs), 600),
                              "pg's pgbench")])
            return {"web": web, "pg": pg}

        res = {"template_mib": TEMPLATE_MIB, "seconds": secs, "phases": {p: [] for p in FIG6_PHASES}}
        for t in range(run.count):
            for phase in envs.rotate(list(FIG6_PHASES), t):
                hogs = [clones[h] for h in FIG6_PHASES[phase]]
                for c in hogs:
                    c.resume()
                try:
                    time.sleep(0 if not hogs else 5)  # the hogs under way
                    vals, use = cpuuse.during(dom, good)
                    vals["cpu"] = use
                finally:
                    for c in hogs:
                        c.pause()
                say(f"fig6: trial {t + 1}: {phase}: web {vals['web']:.0f} req/s, pg {vals['pg']:.0f} tps"
                    + cpu_note(vals["cpu"]))
                res["phases"][phase].append(vals)
        return res
    finally:
        server.kill()
        server.wait()
        destroy(dom, "iso", len(names))
