"""bench/paper's Figures 4 and 5 on multi.py's clones: concurrent domains
each serving the web workload, and differentiated service (PostgreSQL
under CPU weights)."""
import os
import subprocess
import time

import cpuuse
import envs
import workloads
from envs import say
from multi import (TEMPLATE_MIB, Steps, at_once, concurrent_rates, cpu_note, destroy, domus_of, lacking_cells, quiet,
                   resumed, sh_all, start_clones, watchdog_timeouts, wrk)


def pg_script(secs, clients):
    return (workloads.PG_ENV + f"$as_pg $pgbin/pgbench -S -P 1 -T {secs} -c {clients} -j 1 bench")


FIG5_DOMAINS = 8
# --quick's: no nested host has yet lived through 8 clones of this load
# at once (RUNS.md), and 4 on 2 CPUs still give each weight of 1 to 4 a
# share below one CPU, so the weights decide.
FIG5_DOMAINS_QUICK = 4
# xl's default weight is 256; the weighted phase gives domain i (1 to 8)
# i times a base, as the paper's "weights 1 to 8".
FIG5_BASE_WEIGHT = 128


def fig5_phases(n):
    return {"equal": [2 * FIG5_BASE_WEIGHT] * n,
            "weighted": [FIG5_BASE_WEIGHT * (i + 1) for i in range(n)]}


def fig5(environments, run):
    """Figure 5, differentiated service: 8 clones (4 --quick) each running PostgreSQL
    under pgbench (select-only: CPU-bound, so the CPU weights decide; the
    paper showed OSDB-IR's shares) at once, first with equal weights, then
    with weights 1 to N (`domus sched-credit -w`); each domain's
    transactions per second, and its share of the total against its
    weight's share."""
    dom = domus_of(environments)
    n = FIG5_DOMAINS_QUICK if run.quick else FIG5_DOMAINS
    secs = 20 if run.quick else 40
    # Each trial is saved as it ends: a nested host that dies in the
    # weighted phase leaves the equal one's trials to the next.
    res = resumed(run, "fig5", {"template_mib": TEMPLATE_MIB, "domains": n, "seconds": secs},
                  key="phases")
    try:
        clones = start_clones(dom, run, n, "pg")
        # Each clone's PostgreSQL was running when the template was saved.
        sh_all(clones, workloads.PG_ENV + "for i in $(seq 60); do $as_pg $pgbin/pg_isready -q "
               "&& exit 0; sleep 1; done; exit 1", 120)
        for phase, weights in fig5_phases(n).items():
            p = res["phases"].setdefault(phase, {"weights": weights, "tps": [], "windows": []})
            if len(p["tps"]) >= run.count:
                continue
            for c, w in zip(clones, weights):
                dom.domus("sched-credit", "-d", c.name, "-w", str(w))
            for t in range(len(p["tps"]), run.count):
                tps, window = concurrent_rates(clones, pg_script(secs, 2), secs, "pgbench")
                say(f"fig5: {phase} trial {t + 1}: tps " + ", ".join(f"{v:.0f}" for v in tps)
                    + f" (starts {window['spread_s']} s apart)" + cpu_note(window["cpu"]))
                p["tps"].append(tps)
                p["windows"].append(window)
                run.save()
        return res
    finally:
        destroy(dom, "pg", n)


FIG4_COUNTS = [1, 2, 4, 8, 16]


def fig4(environments, run):
    """Figure 4, concurrent domains: 1, 2, 4, 8 and 16 clones each serving
    the web workload (an nginx of one worker on the clone's vCPU) to its
    own wrk in the nested host, all at once; their aggregate requests per
    second against as many native nginx instances (one worker each, on the
    native environment's CPUs) under the same wrk load. Clones not in a
    count are paused."""
    dom = domus_of(environments)
    native = next((e for e in environments if e.name == "native"), None)
    # --quick stops at 8, as scal's does: 16 clones' bring-up alone takes
    # the nested host most of the life it tends to have under that load.
    counts = [n for n in FIG4_COUNTS if n <= 8] if run.quick else FIG4_COUNTS
    most = max(counts)
    script = os.path.join(run.work, "pages.lua")
    with open(script, "w") as f:
        f.write(workloads.WRK_SCRIPT)
    secs = 5 if run.quick else 20
    res = resumed(run, "fig4", {"template_mib": TEMPLATE_MIB, "counts": counts, "seconds": secs})
    if native is not None:
        native.sh(" && ".join(f"(mkdir -p web{i} && cd web{i} && "
                              + workloads.web_prepare(native.helper, workloads.WEB_PORT + i, 1) + ")"
                              for i in range(most)), 600)
    steps = Steps(dom, run, "web", lambda new: sh_all(
        new, workloads.web_prepare(envs.GUEST_HELPER, workloads.WEB_PORT, 1), 300))
    try:
        def wrk_all(targets, clones=None):
            try:
                return at_once([lambda ip=ip, port=port: wrk(ip, port, secs, script) for ip, port in targets])
            except RuntimeError as e:
                if not clones:
                    raise
                raise RuntimeError(f"{e}\n{web_evidence(dom, clones)}") from e

        for t, name, n, got in lacking_cells(res, run, native, counts):
            if name == "native":
                each, use = cpuuse.during(
                    dom, lambda: wrk_all([("127.0.0.1", workloads.WEB_PORT + i) for i in range(n)]))
                per_vcpu, extra = None, {}
            else:
                def measure(clones):
                    # A clone made again (Steps.measure) may have a new lease.
                    targets = [(c.ip, workloads.WEB_PORT) for c in clones]
                    at = time.time()
                    for c in clones:
                        c.resume()
                    # Once right after the resume, as the records before
                    # 2026-11-30 measured, then once the clones are quiet
                    # (`quiet`): the difference is what the resume's own
                    # work cost.
                    first = cpuuse.during(dom, lambda: wrk_all(targets, clones))
                    settle = quiet(dom, clones)
                    each, use = cpuuse.during(dom, lambda: wrk_all(targets, clones))
                    per_vcpu = cpuuse.per_vcpu_second(each, use, [c.name for c in clones])
                    kills = [len(u) for u in watchdog_timeouts(clones, at)]
                    return first, settle, each, use, per_vcpu, kills

                (first, first_use), settle, each, use, per_vcpu, kills = steps.measure(n, measure)
                extra = {"at_resume": {"total": sum(first), "each": first, "cpu": first_use},
                         "settle_s": settle, "watchdog_timeouts": kills}
                say(f"fig4: trial {t + 1}: domus, {n} server(s): {sum(first):.0f} req/s right "
                    f"after the resume; quiet {settle:.0f} s later; systemd's watchdog timeouts "
                    f"since the resume: {kills}")
            say(f"fig4: trial {t + 1}: {name}, {n} server(s): {sum(each):.0f} req/s"
                + cpu_note(use))
            got.append({"total": sum(each), "each": each, "cpu": use, "per_vcpu_s": per_vcpu,
                        **extra})
            run.save()
        return res
    finally:
        steps.destroy()
        if native is not None:
            native.sh("; ".join(f"(cd web{i} && {workloads.web_stop()})" for i in range(most))
                      + "; true", 60)


def web_evidence(dom, clones):
    """What each web clone says about its address and its nginx, and whom
    the nested host reaches at the clone's address, after a wrk that
    failed (a clone's server refused a connection at the start of fig4's
    8-server count once, 2026-11-30)."""
    probe = ("ip -4 -o addr show scope global | awk '{print $2, $4}'; "
             f"ss -ltn | grep -c ':{workloads.WEB_PORT} ' | sed 's/^/listening on {workloads.WEB_PORT}: /'; "
             "pgrep -c nginx | sed 's/^/nginx processes: /'; tail -n 3 nginx.err 2>/dev/null; "
             "sudo -n dmesg 2>/dev/null | grep -iE 'oom|killed process' | tail -n 3; "
             "sudo -n journalctl -q -b --no-pager -p warning 2>/dev/null | tail -n 5")
    out = []
    for c in clones:
        try:
            said = c.sh(probe, 60)
        except Exception as e:  # evidence only: a clone that does not answer says so
            said = f"no answer: {str(e)[:200]}"
        neigh = subprocess.run(["ip", "neigh", "show", c.ip], capture_output=True, text=True).stdout.strip()
        out.append(f"{c.name} (leased {c.ip}; the nested host's neighbour entry: {neigh or 'none'}):\n"
                   + said.strip())
    try:
        out.append("leases: " + dom.domus("network-list", "--json", check=False)[:1500])
    except OSError:
        pass
    return "\n".join(out)
