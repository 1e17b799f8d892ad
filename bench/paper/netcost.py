"""bench/paper's `netcost` experiment (run.py; a diagnostic, run only when
--only names it): what a gigabit of Table 6's TCP streams costs in each
environment, to say why Cloud Hypervisor's guest moved more of it per
second than Domus's in the record (Domus at 0.55 to 0.73 of CH, RUNS.md).

Each trial runs Table 6's four iperf3 commands (both directions, MTU 1500
and 500, against a server in the nested host) with cost.py's counters read
around each: the guest's CPU time, packets and network interrupts, the
nested host's CPU time (guest mode, host user and kernel), the VMM
process's own time by thread, and KVM's exits and injections, shown per
gigabit moved. In this nested host every CPU cycle of the host side (the
VMM's device thread, the tap and bridge, the iperf3 server) is emulated, so
a VMM that spends more of the nested host's CPU per byte leaves less for
the rest and moves fewer bytes: its own thread's time per gigabit says
whether it is the one.
"""
import subprocess
import time

import cost
import envs
import webcost
import workloads
from report import median

# The experiments that add a second Domus domain beside the first, its
# interface set otherwise: experiment -> (environment, label, domain, vif
# setting, heading, what the setting does).
VARIANTS = {
    # No mergeable receive buffers: Linux posts each receive buffer as one
    # chain of pages large enough for a whole frame.
    "netmrg": ("domus-nomrg", "Domus, mrg_rxbuf=0", "papernomrg", "mrg_rxbuf=0",
               "without mergeable receive buffers",
               "its interface offers the guest no mergeable receive buffers, so Linux posts each "
               "receive buffer as one chain of pages that takes a whole frame"),
    # No indirect descriptors, as Cloud Hypervisor's interface: each piece
    # of a frame the guest sends takes a slot of the transmit ring, which
    # fifteen 64 KiB frames fill (with them a frame takes one slot and the
    # ring never fills). Whether that is why CH's guest takes half Domus's
    # transmit interrupts: it lowered them by at most a tenth (RUNS.md,
    # 2026-11-30).
    "netind": ("domus-noind", "Domus, indirect_desc=0", "papernoind", "indirect_desc=0",
               "without indirect descriptors",
               "its interface offers the guest no indirect descriptors (as Cloud Hypervisor's "
               "does not), so each piece of a frame takes a slot of the ring"),
}
# The guest's memory in use after the rows (MemTotal less MemFree,
# Buffers, Cached and SReclaimable, MiB). Too noisy to show the receive
# ring's 8 MiB between the domains (RUNS.md, 2026-11-29 evening, which
# measured it around bringing the interface up instead); kept as a check
# that nothing larger grows.
USED_MEM = ("awk '/^(MemTotal|MemFree|Buffers|Cached|SReclaimable):/ {v[$1]=$2} END "
            "{printf \"guest_used_mib=%.1f\\n\", (v[\"MemTotal:\"]-v[\"MemFree:\"]-v[\"Buffers:\"]"
            "-v[\"Cached:\"]-v[\"SReclaimable:\"])/1024}' /proc/meminfo")

# Per gigabit: a row's score is Mbit/s, so seconds (or counts) per Mbit
# times 1000 (ms) and 1000 (Mbit per Gbit).
MS_PER_GBIT = 1e6
PER_GBIT = 1e3
# (key, label, scaling, decimals[, factor]): see cost.tables.
GUEST_COLUMNS = [("tps", "Mbit/s", cost.AS_IS, 0), ("busy", "busy (CPU s/s)", cost.AS_IS, 2),
                 ("sys_share", "of it system+irq", cost.AS_IS, 2),
                 ("user+sys+irq", "CPU ms/Gbit", cost.PER_OP, 1, MS_PER_GBIT),
                 ("netirq", "net IRQs/Gbit", cost.PER_OP, 0, PER_GBIT),
                 ("netirq_rx", "of them receive queue", cost.PER_OP, 0, PER_GBIT),
                 ("netirq_tx", "transmit queue", cost.PER_OP, 0, PER_GBIT),
                 ("rx_packets+tx_packets", "packets/Gbit", cost.PER_OP, 0, PER_GBIT),
                 ("tx_bytes_each", "bytes/TX packet", cost.AS_IS, 0),
                 ("rx_bytes_each", "bytes/RX packet", cost.AS_IS, 0)]
HOST_COLUMNS = [("host.guest", "guest mode (ms/Gbit)", cost.PER_OP, 1, MS_PER_GBIT),
                ("vmm.own+vmm.sys+vmm.guest", "VMM process (ms/Gbit)", cost.PER_OP, 1, MS_PER_GBIT),
                ("vmm.sys", "of it host kernel", cost.PER_OP, 1, MS_PER_GBIT),
                ("host.user", "host user (ms/Gbit)", cost.PER_OP, 1, MS_PER_GBIT),
                ("host.kernel", "host kernel (ms/Gbit)", cost.PER_OP, 1, MS_PER_GBIT),
                ("host.idle", "idle (CPU s/s)", cost.PER_S, 2),
                ("kvm.exits", "exits/Gbit", cost.PER_OP, 0, PER_GBIT),
                ("kvm.halt_exits", "HLT exits/Gbit", cost.PER_OP, 0, PER_GBIT),
                ("kvm.irq_injections", "injections/Gbit", cost.PER_OP, 0, PER_GBIT),
                ("kvm.io_exits+kvm.mmio_exits", "I/O+MMIO exits/Gbit", cost.PER_OP, 0, PER_GBIT)]


def experiment(environments, run, running, server_ip, name="netcost", dom=None):
    """Trials in each environment (cost.experiment); each trial runs the
    four iperf3 rows against a server this starts in the nested host
    (`server_ip(e)`: where environment e reaches it). `netmrg` and
    `netind` add a second domain of Domus's daemon (`dom`), its interface
    set as VARIANTS says, and read each guest's memory in use after the
    rows."""
    variant = None
    if name in VARIANTS:
        env, _, domain, vif, *_ = VARIANTS[name]
        variant = envs.DomusVariant(dom, env, domain, "", vif=vif)
        if run.lacking(name, [variant]):
            envs.boot(variant, run)
            variant.pause()
            environments = list(environments) + [variant]
    server = subprocess.Popen(["iperf3", "-s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)

    def command(e, key):
        _, mtu, reverse = workloads.NET_ROWS[key]
        out = e.sh(workloads.net_command(server_ip(e), mtu, reverse, run.quick), 600)
        return workloads.value(out, f"{e.name}: iperf3 ({key})")

    def used(e):
        return workloads.parse(e.sh(USED_MEM, 60))

    try:
        return cost.experiment(name, environments, run, running, workloads.NET_ROWS,
                               lambda e: None, command, also=used if variant else None)
    finally:
        server.kill()
        server.wait()
        if variant:
            variant.close()


def table(exp, envs_order, short, name="netcost"):
    """results.md's lines for a netcost, netmrg or netind record: the
    environment's and the nested host's tables for the four rows, then the
    VMM's threads per row (and the variants' guest memory in use)."""
    n = cost.trial_count(exp, envs_order)
    if name in VARIANTS:
        env, _, _, _, heading, what = VARIANTS[name]
        lines = [f"## Diagnostic: Table 6's TCP streams {heading} (`{name}`)", "",
                 f"netcost with a second Domus domain, {short[env]}, in the same nested hosts "
                 f"({n} trial(s) each, taken in turn in each nested host; medians): {what} "
                 "(bench/paper/netcost.py; RUNS.md reads it). Costs are per gigabit received by "
                 "the far end.", ""]
    else:
        lines = ["## Diagnostic: what Table 6's TCP streams cost (`netcost`)", "",
                 f"Why Table 6's rows differ between the VMMs ({n} trial(s) each, taken in turn in "
                 "each nested host; medians). Table 6's iperf3 commands, with the environment's CPU "
                 "time, network interrupts (by queue in the trials since 2026-11-29 night, n/a "
                 "before) and packets counted around each (its /proc; interfaces "
                 "other than loopback, so none for native), the nested host's CPU time, the VMM "
                 "process's own by thread, and KVM's counters for the guest's VM "
                 "(bench/paper/netcost.py; RUNS.md reads it). Costs are per gigabit received by the "
                 "far end.", ""]
    rows, tbl = cost.guest_and_host_tables(exp, workloads.NET_ROWS, GUEST_COLUMNS, HOST_COLUMNS,
                                           envs_order, short)
    lines += tbl
    for key, (label, *_) in workloads.NET_ROWS.items():
        per_thread, ttbl = webcost.threads(exp, envs_order, short, key, "ms per Gbit", MS_PER_GBIT)
        if per_thread:
            rows.setdefault(key, {})["threads"] = per_thread
            lines += [f"{label}: " + ttbl[0][0].lower() + ttbl[0][1:]] + ttbl[1:]
    # Native's would be the nested host's own, not a guest's.
    used = {e: median(exp["runs"].get(e) or [], "guest_used_mib") for e in envs_order if e != "native"}
    used = {e: v for e, v in used.items() if v is not None}
    if used:
        rows["guest_used_mib"] = used
        lines += ["The guest's memory in use after the four rows (MemTotal less MemFree, Buffers, "
                  "Cached and SReclaimable, MiB; medians): "
                  + ", ".join(f"{short.get(e, e)} {v:.1f}" for e, v in used.items()) + ".", ""]
    return rows, lines


def _test():
    t = {"tx_1500.tps": 500.0, "tx_1500.wall_s": 2.0, "tx_1500.user": 0.1, "tx_1500.sys": 0.2,
         "tx_1500.irq": 0.2, "tx_1500.busy": 0.25, "tx_1500.sys_share": 0.8, "tx_1500.netirq": 100.0, "tx_1500.thread.vcpuN.own": 0.0,
         "tx_1500.thread.vcpuN.sys": 0.1, "tx_1500.thread.vcpuN.guest": 0.5,
         "tx_1500.thread.virtio-net.own": 0.05, "tx_1500.thread.virtio-net.sys": 0.25,
         "kvm.tx_1500.exits": 4000.0, "kvm.tx_1500.wall_s": 2.0}
    rows, lines = table({"runs": {"domus": [t], "native": [{"tx_1500.tps": 2000.0, "tx_1500.wall_s": 2.0}]}},
                        ["native", "domus"], {"native": "native", "domus": "Domus"})
    d = rows["tx_1500"]["domus"]
    # 1 Gbit moved: 0.5 s of guest CPU is 500 ms/Gbit; 4000 exits/Gbit.
    assert abs(d["user+sys+irq"] - 500.0) < 1e-6 and abs(d["kvm.exits"] - 4000.0) < 1e-6, d
    assert abs(d["netirq"] - 100.0) < 1e-6 and d["tps"] == 500.0, d
    th = rows["tx_1500"]["threads"]["domus"]
    assert abs(th["virtio-net"]["sys"] - 250.0) < 1e-6, th
    assert "| TCP transmit, MTU 1500 (Mbit/s) | Domus | 500 | 0.25 | 0.80 | 500.0 | 100 |" in "\n".join(lines), lines
    assert any(line.startswith("TCP transmit, MTU 1500 (Mbit/s): the VMM's threads (ms per Gbit")
               for line in lines), lines
    assert "rx_500" not in rows or "threads" not in rows["rx_500"], rows
    assert rows["tx_1500"]["native"]["kvm.exits"] is None
    assert "guest_used_mib" not in rows, rows
    for name, (env, label, *_) in VARIANTS.items():
        rows, lines = table({"runs": {"domus": [dict(t, guest_used_mib=100.0)],
                                      env: [dict(t, guest_used_mib=117.0), dict(t, guest_used_mib=119.0)]}},
                            ["domus", env], {"domus": "Domus", env: label}, name)
        assert lines[0].endswith(f"(`{name}`)") and env in rows["tx_1500"], lines
        assert label in lines[2], lines
        assert rows["guest_used_mib"] == {"domus": 100.0, env: 118.0}, rows
        assert f"Domus 100.0, {label} 118.0." in lines[-2], lines


if __name__ == "__main__":
    _test()
    print("netcost: ok")
