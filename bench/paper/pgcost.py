"""bench/paper's `pgcost` experiment (run.py; a diagnostic, run only when
--only names it): where Figure 3's PostgreSQL rows spend their time in
each environment, to say why Cloud Hypervisor's guest ran them faster
than Domus's in the record of 2026-11-28 (RUNS.md), in other nested hosts.

Each trial runs Figure 3's two pgbench commands (select-only, then
TPC-B-like; 2 clients per vCPU, as `pg`) with cost.py's counters read
around each: the environment's CPU time, switches, IPIs and disk flushes,
the nested host's CPU time and KVM's counters for the guest's VM.
"""

import cost
import workloads

# results.md's columns: (key, label, scaling, decimals), where the key is
# the row's value name after `ROW.` (cost.value).
GUEST_COLUMNS = [("tps", "tps", cost.AS_IS, 1), ("busy", "busy (CPU s/s)", cost.AS_IS, 2),
                 ("sys_share", "of it system+irq", cost.AS_IS, 2), ("iowait", "iowait (CPU s/s)", cost.AS_IS, 2),
                 ("ctxt", "switches/s", cost.PER_S, 0), ("res", "resched IPIs/s", cost.PER_S, 0),
                 ("cal", "call IPIs/s", cost.PER_S, 0), ("tlb", "TLB IPIs/s", cost.PER_S, 0),
                 ("loc", "timer IRQs/s", cost.PER_S, 0), ("flushes", "flushes/s", cost.PER_S, 1),
                 ("flush_ms_each", "ms per flush", cost.AS_IS, 2)]
HOST_COLUMNS = [("host.guest", "guest mode (CPU s/s)", cost.PER_S, 2),
                ("host.user", "host user (CPU s/s)", cost.PER_S, 2),
                ("host.kernel", "host kernel (CPU s/s)", cost.PER_S, 2),
                ("host.idle", "idle (CPU s/s)", cost.PER_S, 2),
                ("kvm.exits", "exits/s", cost.PER_S, 0), ("kvm.halt_exits", "HLT exits/s", cost.PER_S, 0),
                ("kvm.hypercalls", "hypercalls/s", cost.PER_S, 0),
                ("kvm.irq_injections", "injections/s", cost.PER_S, 0),
                ("kvm.io_exits+kvm.mmio_exits", "I/O+MMIO exits/s", cost.PER_S, 0),
                ("kvm.halt_wakeup", "wakeups/s", cost.PER_S, 0)]


def experiment(environments, run, running, vcpus):
    """Trials in each environment (cost.experiment); each trial both
    pgbench rows."""
    def prepare(e):
        e.sh(workloads.pg_prepare(e.name == "native", run.quick), 1800)

    def command(e, key):
        out = e.sh(workloads.pg_command(key, vcpus, run.quick), 900)
        tps = workloads.parse(out).get("value")
        if tps is None:
            raise RuntimeError(f"{e.name}: pgbench ({key}) printed no tps")
        return tps

    return cost.experiment("pgcost", environments, run, running, workloads.PG_ROWS, prepare, command)


def table(exp, envs_order, short):
    """results.md's lines for a pgcost record: for each pgbench row, one
    line per environment in each of two tables (the environment's own
    counters, the nested host's and KVM's), medians of the trials."""
    n = cost.trial_count(exp, envs_order)
    lines = ["## Diagnostic: where pgbench's time goes (`pgcost`)", "",
             f"Why Figure 3's PostgreSQL rows differ between the VMMs ({n} trial(s) each, taken "
             "in turn in each nested host; medians). Figure 3's pgbench commands, with the environment's "
             "CPU time, context switches, interprocessor interrupts and disk flushes counted "
             "around each (its /proc), and the nested host's CPU time and KVM's counters for "
             "the guest's VM (bench/paper/pgcost.py; RUNS.md reads it). Rates are per second "
             "of the row.", ""]
    rows, tbl = cost.guest_and_host_tables(exp, workloads.PG_ROWS, GUEST_COLUMNS, HOST_COLUMNS,
                                           envs_order, short)
    return rows, lines + tbl


def _test():
    exp = {"runs": {"native": [{"pg_ro.tps": 10.0, "pg_ro.wall_s": 2.0, "pg_ro.ctxt": 8.0,
                                "pg_tpcb.tps": 4.0, "pg_tpcb.wall_s": 2.0}],
                    "domus": [{"pg_ro.tps": 6.0, "pg_ro.wall_s": 2.0, "pg_ro.ctxt": 4.0,
                               "kvm.pg_ro.exits": 100.0, "kvm.pg_ro.wall_s": 2.0}]}}
    rows, lines = table(exp, ["native", "domus"], {"native": "native", "domus": "Domus"})
    assert rows["pg_ro"]["native"]["ctxt"] == 4.0 and rows["pg_ro"]["domus"]["kvm.exits"] == 50.0, rows
    assert rows["pg_tpcb"]["domus"]["tps"] is None and "(1 trial(s) each" in lines[2], lines
    assert any(line.startswith("| pgbench select-only | Domus | 6.0 |") for line in lines), lines


if __name__ == "__main__":
    _test()
    print("pgcost: ok")
