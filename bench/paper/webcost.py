"""bench/paper's `webcost` experiment (run.py; a diagnostic, run only when
--only names it): what a request of Figure 3's web row costs in each
environment, to say why Cloud Hypervisor's guest served more requests per
second than Domus's in the record of 2026-11-29 (RUNS.md).

Each trial runs the web row's wrk (same script, threads, connections and
duration as `web`) against the environment's nginx, with cost.py's
counters read around it, and the results show them per request: the
guest's CPU time, switches, network interrupts and packets, the bytes
per packet (large ones mean segmentation offload is in use), the nested
host's CPU time (guest mode, the VMM process's own time by thread, wrk's,
the host kernel's), and KVM's exits and interrupt injections. A VMM whose
device emulation costs more per request shows in its own time and its
exits; a guest that does more work per request (more packets, more
interrupts) shows in the environment's columns.
"""
import os
import statistics

import cost
import workloads

ROW = "web"

# (key, label, scaling, decimals[, factor]): see cost.tables.
GUEST_COLUMNS = [("tps", "req/s", cost.AS_IS, 0), ("busy", "busy (CPU s/s)", cost.AS_IS, 2),
                 ("sys_share", "of it system+irq", cost.AS_IS, 2),
                 ("user+sys+irq", "CPU ms/req", cost.PER_OP, 3, 1000),
                 ("ctxt", "switches/req", cost.PER_OP, 2), ("res", "resched IPIs/req", cost.PER_OP, 2),
                 ("netirq", "net IRQs/req", cost.PER_OP, 2),
                 ("rx_packets+tx_packets", "packets/req", cost.PER_OP, 2),
                 ("tx_bytes_each", "bytes/TX packet", cost.AS_IS, 0),
                 ("rx_bytes_each", "bytes/RX packet", cost.AS_IS, 0)]
HOST_COLUMNS = [("host.guest", "guest mode (ms/req)", cost.PER_OP, 3, 1000),
                ("vmm.own+vmm.sys", "VMM's own (ms/req)", cost.PER_OP, 3, 1000),
                ("client", "wrk (ms/req)", cost.PER_OP, 3, 1000),
                ("host.kernel", "host kernel (ms/req)", cost.PER_OP, 3, 1000),
                ("host.idle", "idle (CPU s/s)", cost.PER_S, 2),
                ("kvm.exits", "exits/req", cost.PER_OP, 1), ("kvm.halt_exits", "HLT exits/req", cost.PER_OP, 2),
                ("kvm.irq_injections", "injections/req", cost.PER_OP, 2),
                ("kvm.io_exits+kvm.mmio_exits", "I/O+MMIO exits/req", cost.PER_OP, 2),
                ("kvm.hypercalls", "hypercalls/req", cost.PER_OP, 2)]


def experiment(environments, run, running, vcpus):
    """Trials in each environment (cost.experiment), each one wrk run."""
    script = os.path.join(run.work, "pages.lua")
    with open(script, "w") as f:
        f.write(workloads.WRK_SCRIPT)

    def prepare(e):
        e.sh(workloads.web_prepare(e.helper), 600)

    def command(e, key):
        ip = "127.0.0.1" if e.name == "native" else e.ip
        secs = 5 if run.quick else 20
        return workloads.wrk(ip, workloads.WEB_PORT, vcpus, 8 * vcpus, secs, script, 600)

    def cleanup(e):
        e.sh(workloads.web_stop(), 60)

    return cost.experiment("webcost", environments, run, running, {ROW: workloads.WEB_ROWS[ROW]},
                           prepare, command, cleanup)


def threads(exp, envs_order, short):
    """One line per environment: its VMM's threads by name (cost.group),
    their own CPU time (user+system, guest mode left out) and their time
    in guest mode per request, medians of the trials, busiest first."""
    lines = ["The VMM's threads (own ms/req, guest-mode ms/req; threads by name, numbers folded):", "",
             "| environment | threads |", "| --- | --- |"]
    out = {}
    for e in envs_order:
        trials = exp["runs"].get(e) or []
        prefix = f"{ROW}.thread."
        groups = sorted({k[len(prefix):].rsplit(".", 1)[0] for t in trials for k in t if k.startswith(prefix)})
        cells = []
        for g in groups:
            own = [x for x in (cost.scaled(t, ROW, f"thread.{g}.own+thread.{g}.sys", cost.PER_OP, 1000)
                               for t in trials) if x is not None]
            guest = [x for x in (cost.scaled(t, ROW, f"thread.{g}.guest", cost.PER_OP, 1000)
                                 for t in trials) if x is not None]
            if own:
                out.setdefault(e, {})[g] = {"own": statistics.median(own),
                                            "guest": statistics.median(guest) if guest else None}
        for g, v in sorted(out.get(e, {}).items(), key=lambda kv: -(kv[1]["own"] + (kv[1]["guest"] or 0))):
            cells.append(f"{g}: {v['own']:.3f}, {v['guest'] or 0:.3f}")
        if cells:
            lines.append(f"| {short[e]} | " + "; ".join(cells) + " |")
    return out, lines + [""]


def table(exp, envs_order, short):
    """results.md's lines for a webcost record."""
    n = cost.trial_count(exp, envs_order)
    lines = ["## Diagnostic: what a web request costs (`webcost`)", "",
             f"Why Figure 3's web row differs between the VMMs ({n} trial(s) each, taken in turn "
             "in each nested host; medians). The web row's wrk run, with the environment's CPU time, "
             "switches, network interrupts and packets counted around it (its /proc; packets of "
             "interfaces other than loopback, so none for native), the nested host's CPU time, "
             "the VMM process's own, wrk's, and KVM's counters for the guest's VM "
             "(bench/paper/webcost.py; RUNS.md reads it). Costs are per request served.", ""]
    rows, tbl = cost.tables(exp, {ROW: workloads.WEB_ROWS[ROW]},
                            (("the environment", GUEST_COLUMNS), ("the nested host and KVM", HOST_COLUMNS)),
                            envs_order, short)
    per_thread, ttbl = threads(exp, envs_order, short)
    rows[ROW]["threads"] = per_thread
    return rows, lines + tbl + ttbl


def _test():
    t = {"web.tps": 100.0, "web.wall_s": 2.0, "web.user": 0.1, "web.sys": 0.06, "web.irq": 0.04,
         "web.thread.vcpuN.own": 0.02, "web.thread.vcpuN.sys": 0.02, "web.thread.vcpuN.guest": 0.3,
         "web.thread.net.own": 0.01, "web.thread.net.sys": 0.05, "web.client": 0.2,
         "kvm.web.exits": 1000.0, "kvm.web.wall_s": 2.0}
    rows, lines = table({"runs": {"domus": [t], "native": [{"web.tps": 300.0, "web.wall_s": 2.0}]}},
                        ["native", "domus"], {"native": "native", "domus": "Domus"})
    d = rows[ROW]["domus"]
    assert abs(d["user+sys+irq"] - 1.0) < 1e-9 and d["kvm.exits"] == 5.0 and d["client"] == 1.0, d
    assert rows[ROW]["native"]["kvm.exits"] is None
    th = rows[ROW]["threads"]["domus"]
    assert abs(th["vcpuN"]["own"] - 0.2) < 1e-9 and abs(th["net"]["own"] - 0.3) < 1e-9, th
    assert any(line == "| Domus | vcpuN: 0.200, 1.500; net: 0.300, 0.000 |" for line in lines), lines
    assert "native" not in rows[ROW]["threads"]


if __name__ == "__main__":
    _test()
    print("webcost: ok")
