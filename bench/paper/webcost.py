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
import envs
import workloads
from envs import say
from report import median

ROW = "web"
CGROUPS = "/sys/fs/cgroup"

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
                ("vmm.own+vmm.sys+vmm.guest", "VMM process (ms/req)", cost.PER_OP, 3, 1000),
                ("vmm.sys", "of it host kernel", cost.PER_OP, 3, 1000),
                ("client", "wrk (ms/req)", cost.PER_OP, 3, 1000),
                ("host.kernel", "host kernel (ms/req)", cost.PER_OP, 3, 1000),
                ("host.idle", "idle (CPU s/s)", cost.PER_S, 2),
                ("kvm.exits", "exits/req", cost.PER_OP, 1), ("kvm.halt_exits", "HLT exits/req", cost.PER_OP, 2),
                ("kvm.irq_injections", "injections/req", cost.PER_OP, 2),
                ("kvm.io_exits+kvm.mmio_exits", "I/O+MMIO exits/req", cost.PER_OP, 2),
                ("kvm.hypercalls", "hypercalls/req", cost.PER_OP, 2)]


def _write(path, value):
    with open(path, "w") as f:
        f.write(value)


def group_peer(e):
    """Moves a peer's VMM process (QEMU, CH) into a cgroup of its own under
    the nested host's root, at cgroup v2's default weight, as Domus's daemon
    keeps each domain's VMM in a group (`domus/NAME`, under `domus` at that
    same weight): then under every VMM the guest's threads compete with the
    nested host's other tasks (wrk, the kernel's threads) as one entity,
    not each thread on its own. Nothing for native and Domus."""
    pid = e.vmm_pid()
    if e.name in ("native", "domus") or not pid:
        return
    g = os.path.join(CGROUPS, f"bench-{e.name}")
    os.makedirs(g, exist_ok=True)
    _write(os.path.join(CGROUPS, "cgroup.subtree_control"), "+cpu")
    _write(os.path.join(g, "cgroup.procs"), str(pid))
    with open(os.path.join(g, "cpu.weight")) as f:
        say(f"webgroup: {e.name}: its VMM (pid {pid}) in {g}, cpu.weight {f.read().strip()}")


def ungroup_peer(e):
    """Puts a peer's VMM back in the root group and removes its own."""
    g = os.path.join(CGROUPS, f"bench-{e.name}")
    pid = e.vmm_pid()
    if not os.path.isdir(g):
        return
    if pid:
        _write(os.path.join(CGROUPS, "cgroup.procs"), str(pid))
    os.rmdir(g)


# `webllc`'s second Domus domain, as an environment.
VARIANT = "domus-nollc"
# What webllc also measures in each trial: Table 4's context switches.
SWITCHES = [k for k in workloads.OSBENCH_ROWS if k.startswith("ctx_")]

# What `webllc`'s second Domus domain is given: CPUID that shows no
# last-level cache shared by its vCPUs, as CH's guest sees on these
# machines. An AMD guest kernel takes its LLC from the L3 in leaf
# 0x80000006 (EDX); an Intel one from leaf 4's L3 (subleaf 3), whose bits
# 25-14 say how many logical CPUs share it, less one (0 already in Domus's
# CPUID: on Intel the two domains see the same).
NO_SHARED_LLC = {"AuthenticAMD": "0x80000006:edx=" + "0" * 32,
                 "GenuineIntel": "4,3:eax=" + "x" * 6 + "0" * 12 + "x" * 14}


def no_shared_llc():
    """The cpuid rule (xl.cfg line) that hides the shared LLC on this CPU."""
    with open("/proc/cpuinfo") as f:
        vendor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    if vendor not in NO_SHARED_LLC:
        raise RuntimeError(f"webllc: no rule for a {vendor or 'nameless'} CPU's caches")
    return f"cpuid = ['{NO_SHARED_LLC[vendor]}']\n"


def experiment(environments, run, running, vcpus, name="webcost", dom=None):
    """Trials in each environment (cost.experiment), each one wrk run.
    `webgroup` (run.py) has each peer's VMM in a cgroup of its own for it
    (group_peer); `webllc` adds a second domain of Domus's daemon (`dom`),
    `domus-nollc`, whose vCPUs see no shared last-level cache."""
    grouped = name == "webgroup"
    variant = None
    if name == "webllc":
        variant = envs.DomusVariant(dom, VARIANT, "paperllc", no_shared_llc())
        if run.lacking(name, [variant]):
            envs.boot(variant, run)
            variant.pause()
            environments = list(environments) + [variant]
    script = os.path.join(run.work, "pages.lua")
    with open(script, "w") as f:
        f.write(workloads.WRK_SCRIPT)

    def prepare(e):
        e.sh(workloads.web_prepare(e.helper), 600)
        if grouped:
            group_peer(e)

    def command(e, key):
        ip = "127.0.0.1" if e.name == "native" else e.ip
        secs = 5 if run.quick else 20
        return workloads.wrk(ip, workloads.WEB_PORT, vcpus, 8 * vcpus, secs, script, 600)

    def cleanup(e):
        e.sh(workloads.web_stop(), 60)
        if grouped:
            ungroup_peer(e)

    def switches(e):
        """webllc's context switches: osbench's, as Table 4 runs it."""
        vals = workloads.parse(e.sh(workloads.osbench_command(e.helper, run.quick), 1800))
        return {f"osbench.{k}": vals[k] for k in SWITCHES if k in vals}

    try:
        return cost.experiment(name, environments, run, running, {ROW: workloads.WEB_ROWS[ROW]},
                               prepare, command, cleanup, switches if variant else None)
    finally:
        if variant:
            variant.close()


def threads(exp, envs_order, short, row=ROW, unit="ms per request", factor=1000):
    """One line per environment: its VMM's threads by name (cost.group),
    their CPU time in host user mode, host kernel and guest mode per unit
    of the row's score (seconds per operation times `factor`), medians of
    the trials, busiest first."""
    lines = [f"The VMM's threads ({unit} in host user mode, host kernel, guest mode; threads "
             "by name, numbers folded; a vCPU thread's user time is the kernel's user time less its "
             "guest time, which the kernel's scaling of user time makes approximate, even negative):",
             "", "| environment | threads |", "| --- | --- |"]
    out = {}
    prefix = f"{row}.thread."
    for e in envs_order:
        trials = exp["runs"].get(e) or []
        groups = sorted({k[len(prefix):].rsplit(".", 1)[0] for t in trials for k in t if k.startswith(prefix)})
        for g in groups:
            meds = {}
            for part in ("own", "sys", "guest"):
                xs = [x for x in (cost.scaled(t, row, f"thread.{g}.{part}", cost.PER_OP, factor)
                                  for t in trials)
                      if x is not None]
                meds[part] = statistics.median(xs) if xs else 0.0
            out.setdefault(e, {})[g] = meds
        busiest = sorted(out.get(e, {}).items(), key=lambda kv: -sum(kv[1].values()))
        cells = [f"{g}: {v['own']:.3f}, {v['sys']:.3f}, {v['guest']:.3f}" for g, v in busiest]
        if cells:
            lines.append(f"| {short[e]} | " + "; ".join(cells) + " |")
    return out, lines + [""]


TITLES = {"webcost": ("## Diagnostic: what a web request costs (`webcost`)", ""),
          "webgroup": ("## Diagnostic: what a web request costs, each VMM in a cgroup (`webgroup`)",
                       "As `webcost`, but QEMU's and CH's VMM processes each in a cgroup of their own at "
                       "the default weight, as Domus's daemon keeps its domain's (so every guest competes "
                       "with wrk and the nested host's other tasks as one entity). "),
          "webllc": ("## Diagnostic: what a web request costs, with and without a shared last-level cache "
                     "(`webllc`)",
                     "As `webcost`, with a second Domus domain (`Domus, no LLC`) whose vCPUs are told "
                     "by CPUID (`cpuid = [...]`, webcost.py's NO_SHARED_LLC) that they share no "
                     "last-level cache, as CH's guest sees on these machines: a guest kernel that "
                     "thinks its CPUs share one wakes a task on the idle CPU, here at the price of an "
                     "IPI and a halt. ")}


def table(exp, envs_order, short, name="webcost"):
    """results.md's lines for a webcost (or webgroup) record."""
    n = cost.trial_count(exp, envs_order)
    title, first = TITLES[name]
    lines = [title, "",
             f"{first}Why Figure 3's web row differs between the VMMs ({n} trial(s) each, taken in turn "
             "in each nested host; medians). The web row's wrk run, with the environment's CPU time, "
             "switches, network interrupts and packets counted around it (its /proc; packets of "
             "interfaces other than loopback, so none for native), the nested host's CPU time, "
             "the VMM process's own, wrk's, and KVM's counters for the guest's VM "
             "(bench/paper/webcost.py; RUNS.md reads it). Costs are per request served.", ""]
    rows, tbl = cost.guest_and_host_tables(exp, {ROW: workloads.WEB_ROWS[ROW]}, GUEST_COLUMNS, HOST_COLUMNS,
                                           envs_order, short)
    per_thread, ttbl = threads(exp, envs_order, short)
    rows.setdefault(ROW, {})["threads"] = per_thread
    return rows, lines + tbl + ttbl + switch_table(exp, envs_order, short, rows)


def switch_table(exp, envs_order, short, rows):
    """webllc's context switches (osbench's, µs, medians), one column per
    environment that has them; adds them to `rows` as rows["switches"]."""
    runs = exp["runs"]
    names = [e for e in envs_order if any(f"osbench.{k}" in t for t in runs.get(e, []) for k in SWITCHES)]
    if not names:
        return []
    lines = ["Context switches in the same trials (osbench's, as Table 4; µs, medians, lower is better):",
             "", "| switch | " + " | ".join(short[e] for e in names) + " |",
             "| --- | " + " | ".join("---:" for _ in names) + " |"]
    out = rows.setdefault("switches", {})
    for k in SWITCHES:
        cells = []
        for e in names:
            med = median(runs[e], f"osbench.{k}")
            out.setdefault(e, {})[k] = med
            cells.append("n/a" if med is None else f"{med:.2f}")
        lines.append(f"| {workloads.OSBENCH_ROWS[k][0]} | " + " | ".join(cells) + " |")
    return lines + [""]


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
    assert abs(th["vcpuN"]["sys"] - 0.1) < 1e-9 and abs(th["net"]["sys"] - 0.25) < 1e-9, th
    assert any(line == "| Domus | vcpuN: 0.100, 0.100, 1.500; net: 0.050, 0.250, 0.000 |"
               for line in lines), lines
    assert table({"runs": {}}, [], {}, "webgroup")[1][0].endswith("(`webgroup`)")
    assert "native" not in rows[ROW]["threads"]
    # webllc's rules are xl's xend form: 32 bits, L3 sharing cleared.
    for rule in NO_SHARED_LLC.values():
        bits = rule.split("=", 1)[1]
        assert len(bits) == 32 and set(bits) <= set("x0"), rule
    assert NO_SHARED_LLC["GenuineIntel"].endswith("=" + "x" * 6 + "0" * 12 + "x" * 14)
    rows, lines = table({"runs": {VARIANT: [dict(t, **{"osbench.ctx_2p_0k_us": 9.0})], "domus": [t]}},
                        ["domus", VARIANT], {"domus": "Domus", VARIANT: "Domus, no LLC"}, "webllc")
    assert lines[0].endswith("(`webllc`)") and VARIANT in rows[ROW], lines
    assert rows["switches"][VARIANT]["ctx_2p_0k_us"] == 9.0 and "domus" not in rows["switches"], rows
    assert "| 2 processes, 0 KiB | 9.00 |" in lines, lines


if __name__ == "__main__":
    _test()
    print("webcost: ok")
