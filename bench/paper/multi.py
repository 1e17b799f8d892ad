"""bench/paper's experiments of many domains at once (the paper's Figures
4-6 and section 4.5): clones of the booted `paper` domain.

A Debian guest takes minutes to boot in the nested host, so N domains are
not N cold boots: the `paper` domain is prepared once for the workload,
saved paused (`domus save -p`), and `domus clone` starts N domains from
that snapshot at once, each with its own name, disk copy and a new
interface with a new MAC on the daemon's network. systemd-networkd, set
up in the template before the save, brings the new interface up by DHCP,
so each clone gets its own lease.
"""
import os
import subprocess
import threading
import time

import envs
import workloads
from envs import say

LEASE_TIMEOUT_S = 300


class Clone(envs.Guest):
    """One clone of the template, reached by SSH at the address the
    daemon's DHCP leased to its new interface."""

    def __init__(self, work, key, dom, name):
        self.name = name
        super().__init__(work, key)
        self.dom = dom

    def alive(self):
        return self.dom.running(self.name)

    def evidence(self):
        """What the daemon and its domains last said (Guest.wait_up's)."""
        return self.dom.evidence()

    def up(self, deadline):
        """Waits for its lease, then for an SSH login."""
        self.ip = self.dom.wait_lease(self.name, deadline)
        self.wait_up(deadline)


def template(dom, prepare):
    """Runs `prepare` in the `paper` domain, lets its network follow a new
    interface, and saves it paused; returns the snapshot's path. The domain
    stays, paused."""
    dom.resume()
    try:
        template_prepare(dom, prepare)
    except Exception:
        try:
            dom.pause()
        except Exception:
            pass
        raise
    snap = os.path.join(dom.snaps, f"paper-{int(time.time())}.snap")
    t0 = time.monotonic()
    dom.domus("save", "-p", "paper", snap)
    say(f"template saved in {time.monotonic() - t0:.0f} s ({snap})")
    return snap


def template_prepare(dom, prepare):
    dom.sh(prepare, 1800)
    # cloud-init's ifupdown brings up the interface it saw at first boot,
    # by name. A clone's interface is a new one, plugged later, with a new
    # MAC and maybe a new name: systemd-networkd (in Debian's systemd) takes
    # every interface but the template's own (which ifupdown keeps), by
    # DHCP with the MAC as client ID (dnsmasq then gives each clone its own
    # address; the machine ID they share would not).
    dev = dom.sh(f"ip -o -4 addr show | awk '$4 ~ /^{dom.ip}\\// {{print $2}}'", 60).strip()
    if not dev:
        raise RuntimeError(f"domus: no interface holds {dom.ip}")
    mac = dom.sh(f"cat /sys/class/net/{dev}/address", 60).strip()
    unit = os.path.join(dom.work, "80-clone.network")
    with open(unit, "w") as f:
        f.write(f"[Match]\nName=en* eth*\nMACAddress=!{mac}\n\n[Network]\nDHCP=ipv4\n\n"
                "[DHCPv4]\nClientIdentifier=mac\n")
    dom.put(unit, "80-clone.network")
    dom.sh("sudo install -m 644 80-clone.network /etc/systemd/network/ && "
           "sudo systemctl enable --now systemd-networkd >/dev/null 2>&1 && sync", 120)


def start_clones(dom, work, key, snap, n, prefix):
    """`domus clone SNAP N PREFIX`, then each clone's lease and login."""
    t0 = time.monotonic()
    dom.domus("clone", snap, str(n), prefix)
    clones = [Clone(work, key, dom, f"{prefix}-{i}") for i in range(1, n + 1)]
    deadline = time.monotonic() + LEASE_TIMEOUT_S
    for c in clones:
        c.up(deadline)
    say(f"{n} clones up in {time.monotonic() - t0:.0f} s: "
        + ", ".join(f"{c.name} {c.ip}" for c in clones))
    return clones


def destroy(dom, prefix, n):
    """Destroys clones PREFIX-1 to PREFIX-N, whichever exist."""
    for i in range(1, n + 1):
        dom.domus("destroy", f"{prefix}-{i}", check=False)


def at_once(clones, cmd, timeout):
    """Runs `cmd` in every clone at the same time; their outputs, in order."""
    outs, errs = [None] * len(clones), []

    def one(i, c):
        try:
            outs[i] = c.sh(cmd, timeout)
        except Exception as e:  # reported below, with the clone's name
            errs.append(f"{c.name}: {e}")

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errs:
        raise RuntimeError("; ".join(errs))
    return outs


FIG5_DOMAINS = 8
# xl's default weight is 256; the weighted phase gives domain i (1 to 8)
# i times a base, as the paper's "weights 1 to 8".
FIG5_BASE_WEIGHT = 128


def fig5_phases(n):
    return {"equal": [2 * FIG5_BASE_WEIGHT] * n,
            "weighted": [FIG5_BASE_WEIGHT * (i + 1) for i in range(n)]}


def fig5(environments, run):
    """Figure 5, differentiated service: 8 clones each running PostgreSQL
    under pgbench (select-only: CPU-bound, so the CPU weights decide; the
    paper ran OSDB-OLTP) at once, first with equal weights, then with
    weights 1 to 8 (`domus sched-credit -w`); each domain's transactions per
    second, and its share of the total against its weight's share."""
    dom = next(e for e in environments if e.name == "domus")
    n = FIG5_DOMAINS
    snap = template(dom, workloads.pg_prepare(False, run.quick))
    try:
        clones = start_clones(dom, run.work, dom.key, snap, n, "pg")
        # Each clone's PostgreSQL was running when it was saved.
        at_once(clones, workloads.PG_ENV + "for i in $(seq 60); do $as_pg $pgbin/pg_isready -q "
                "&& exit 0; sleep 1; done; exit 1", 120)
        res = {"domains": n, "phases": {}}
        for phase, weights in fig5_phases(n).items():
            for c, w in zip(clones, weights):
                dom.domus("sched-credit", "-d", c.name, "-w", str(w))
            rounds = []
            for t in range(run.count):
                outs = at_once(clones, workloads.pg_command("pg_ro", 1, run.quick), 900)
                tps = [workloads.parse(o).get("value") for o in outs]
                if any(v is None for v in tps):
                    raise RuntimeError(f"fig5 {phase}: a clone's pgbench printed no tps: {outs}")
                say(f"fig5: {phase} trial {t + 1}: tps " + ", ".join(f"{v:.0f}" for v in tps))
                rounds.append(tps)
            res["phases"][phase] = {"weights": weights, "tps": rounds}
        return res
    finally:
        destroy(dom, "pg", n)
        for f in (snap, snap + ".mem"):
            try:
                os.remove(f)
            except OSError:
                pass
        subprocess.run(["sync"])
