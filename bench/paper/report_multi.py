"""bench/paper's report of the experiments of many domains at once
(multi.py): Figures 4-6 and section 4.5's scalability, their tables and
plots in the paper's manner."""
import statistics

import cpuuse
from report import finish, fmt, pyplot

# Figure 6's target (issue 16): the good domains keep at least 95% of
# their alone throughput under each antisocial load.
ISOLATION_TARGET = 0.95
# Scalability's: N domains' aggregate within 10% of N=1's times the CPUs
# (times N below as many domains as CPUs).
SCALING_TARGET = 0.90


def pair_bars(ax, xs, pairs, value_format):
    """Two bars at each of `xs` (pairs: [(label, colour, values)]), each
    with its value above it."""
    for j, (label, colour, ys) in enumerate(pairs):
        bars = ax.bar([i + (j - 0.5) * 0.38 for i in range(len(xs))], ys, 0.38, label=label, color=colour)
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y, format(y, value_format), ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(range(len(xs)))


def totals(runs, env, n):
    return [r["total"] for r in runs.get(env, {}).get(str(n), [])]


def med(xs):
    return statistics.median(xs) if xs else None


def fig4_table(exp):
    """Figure 4: the aggregate requests per second of N clones' web
    servers against N native nginx instances."""
    res = exp["runs"]
    rows, lines = {}, ["| servers | native (req/s) | Domus (req/s) | Domus/native | Domus, least and most "
                       "of one server | Domus right after the resume (req/s) | settling (s) | systemd's "
                       "watchdog timeouts |", "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for n in res["counts"]:
        nat, dom = med(totals(res["runs"], "native", n)), med(totals(res["runs"], "domus", n))
        trials = res["runs"].get("domus", {}).get(str(n), [])
        each = [x for r in trials for x in r["each"]]
        ratio = dom / nat if nat and dom is not None else None
        # Since 2026-11-30 each Domus trial is measured right after the
        # clones' resume and again once they are quiet (multi.quiet).
        first = med([r["at_resume"]["total"] for r in trials if "at_resume" in r])
        settle = med([r["settle_s"] for r in trials if "settle_s" in r])
        kills = med([sum(k or 0 for k in r["watchdog_timeouts"]) for r in trials if r.get("watchdog_timeouts")])
        rows[str(n)] = {"native": nat, "domus": dom, "domus_vs_native": ratio, "domus_at_resume": first,
                        "settle_s": settle, "watchdog_timeouts": kills}
        lines.append(f"| {n} | {fmt(nat, 0)} | {fmt(dom, 0)} | {fmt(ratio)} | "
                     + (f"{min(each):.0f} to {max(each):.0f} | " if each else "n/a | ")
                     + f"{fmt(first, 0)} | {fmt(settle, 0)} | {fmt(kills, 0)} |")
    return rows, lines


def plot_fig4(rows, path):
    """Figure 4 as the paper drew it: a pair of bars (native, Domus) per
    number of servers, the aggregate throughput on each."""
    plt = pyplot()
    if plt is None:
        return False
    ns = list(rows)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    pair_bars(ax, ns, [(label, colour, [rows[n][env] or 0 for n in ns])
                       for env, label, colour in (("native", "native (N nginx)", "#4c4c4c"),
                                                  ("domus", "Domus (N domains)", "#2b7bba"))], ".0f")
    ax.set_xticklabels(ns)
    ax.set_xlabel("concurrent web servers")
    ax.set_ylabel("aggregate requests/s (wrk)")
    ax.legend(fontsize=8)
    return finish(plt, fig, ax, "Figure 4: concurrent web servers (bench/paper)", path)


def phase_name(phase, weights):
    """A Figure 5 phase's heading: equal weights, or weights 1 to N (in
    units of the smallest)."""
    if phase == "equal":
        return "equal weights"
    if phase == "weighted" and weights:
        return f"weights 1 to {max(weights) // min(weights)}"
    return phase


def fig5_table(exp):
    """Figure 5: each domain's median transactions per second and its share
    of the total against its weight's share, per phase. Target (issue 16):
    each share within 10% of its weight's share. Beside it, each domain's
    share of the domains' vCPU time (cpuuse), which the weights govern
    directly: where the two differ, a vCPU second bought a different
    number of transactions in different domains."""
    res = exp["runs"]
    rows, lines = {}, []
    for phase, p in res["phases"].items():
        w = p["weights"]
        if not p["tps"]:
            continue
        tps = [statistics.median(r[i] for r in p["tps"]) for i in range(len(w))]
        total, wsum = sum(tps), sum(w)
        share = [x / total if total else None for x in tps]
        want = [x / wsum for x in w]
        cpu = vcpu_shares(p.get("windows", []), len(w))
        off = [abs(s / t - 1) if s is not None else None for s, t in zip(share, want)]
        worst = max((x for x in off if x is not None), default=None)
        ok = worst is not None and worst <= 0.10
        rows[phase] = {"weights": w, "tps": tps, "share": share, "weight_share": want,
                       "vcpu_share": cpu, "worst_off": worst, "aggregate_tps": total,
                       "target": "met" if ok else f"missed: a share {worst * 100:.0f}% off its "
                       "weight's (target 10%)" if worst is not None else "not measured"}
        lines += ["", f"### {phase_name(phase, w)}: aggregate {total:.0f} tps; {rows[phase]['target']}", "",
                  "| domain | weight | tps | share | weight's share | share/weight's | vCPU time share | "
                  "vCPU share/weight's |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for i, (x, s, t, c) in enumerate(zip(tps, share, want, cpu)):
            lines.append(f"| pg-{i + 1} | {w[i]} | {x:.0f} | {fmt(s, 3)} | {t:.3f} | "
                         f"{fmt(s / t if s is not None else None)} | {fmt(c, 3)} | "
                         f"{fmt(c / t if c is not None else None)} |")
    return rows, lines


def vcpu_shares(windows, n):
    """Each of pg-1 to pg-n's share of the n domains' vCPU time, medians
    over the trials that recorded it (None where none did)."""
    per = [[] for _ in range(n)]
    for win in windows:
        doms = (cpu_of(win or {}) or {}).get("domains") or {}
        times = [doms.get(f"pg-{i + 1}", {}).get("vcpu") for i in range(n)]
        if all(t is not None for t in times) and sum(times) > 0:
            for i, t in enumerate(times):
                per[i].append(t / sum(times))
    return [med(x) for x in per]


def plot_fig5(rows, path):
    """Figure 5 as the paper drew it: each domain's throughput, one bar
    group per domain, equal and weighted side by side."""
    plt = pyplot()
    if plt is None:
        return False
    phases = list(rows)
    n = len(rows[phases[0]]["tps"])
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    width = 0.8 / len(phases)
    for j, (phase, colour) in enumerate(zip(phases, ("#9a9a9a", "#2b7bba"))):
        xs = [i + (j - (len(phases) - 1) / 2) * width for i in range(n)]
        ax.bar(xs, rows[phase]["tps"], width, color=colour,
               label=f"{phase_name(phase, rows[phase]['weights'])} ({', '.join(str(w) for w in rows[phase]['weights'])})")
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"pg-{i + 1}" for i in range(n)], fontsize=8)
    ax.set_ylabel("pgbench select-only (tps)")
    ax.legend(fontsize=7)
    return finish(plt, fig, ax, f"Figure 5: {n} domains under pgbench, by CPU weight (bench/paper)", path)


FIG6_UNITS = {"web": "req/s", "pg": "tps"}


def fig6_table(exp):
    """Figure 6 (section 4.4): each good domain's median throughput per
    phase, relative to the phase with the antisocial domains paused."""
    res = exp["runs"]
    alone = {k: med([r[k] for r in res["phases"]["alone"]]) for k in FIG6_UNITS}
    rows, lines = {}, ["| antisocial domains running | web (req/s) | web/alone | PostgreSQL (tps) | "
                       "PostgreSQL/alone | target |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for phase, runs in res["phases"].items():
        m = {k: med([r[k] for r in runs]) for k in FIG6_UNITS}
        rel = {k: m[k] / alone[k] if alone[k] and m[k] is not None else None for k in FIG6_UNITS}
        worst = min((v for v in rel.values() if v is not None), default=None)
        verdict = ("" if phase == "alone" else "met" if worst is not None and worst >= ISOLATION_TARGET
                   else f"missed: {(1 - worst) * 100:.0f}% lost (target 5%)" if worst is not None
                   else "not measured")
        rows[phase] = {"median": m, "vs_alone": rel, "target": verdict}
        lines.append(f"| {'none (alone)' if phase == 'alone' else phase} | {fmt(m['web'], 0)} | "
                     f"{fmt(rel['web'])} | {fmt(m['pg'], 0)} | {fmt(rel['pg'])} | {verdict} |")
    return rows, lines


def plot_fig6(rows, path):
    """The good domains' throughput relative to alone, per antisocial load."""
    plt = pyplot()
    if plt is None:
        return False
    phases = [p for p in rows if p != "alone"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    pair_bars(ax, phases, [(label, colour, [rows[p]["vs_alone"][k] or 0 for p in phases])
                           for k, label, colour in (("web", "web (nginx, wrk)", "#2b7bba"),
                                                    ("pg", "PostgreSQL (pgbench -S)", "#6a9f3a"))], ".2f")
    ax.axhline(ISOLATION_TARGET, color="black", linewidth=0.6, linestyle="--")
    ax.set_xticklabels(phases, fontsize=8)
    ax.set_xlabel("antisocial domains running")
    ax.set_ylabel("throughput relative to alone")
    ax.legend(fontsize=8, loc="lower right")
    return finish(plt, fig, ax, "Figure 6: performance isolation (bench/paper)", path)


def fig6rate_levels(res):
    """A fig6rate record's loads: {label: (offered per trial, {phase:
    [values]})}."""
    return {x: ([o[x] for o in res["offered"]], ph) for x, ph in res["levels"].items()}


def fig6rate_table(exp):
    """Figure 6 at a fixed load (isolation.fig6rate): at each load, each
    good domain's rate and latency per phase, medians over trials, the
    rate relative to the same fixed load alone (the target) and the
    latency's ratio."""
    res = exp["runs"]
    lat = {"web": "web_p50_ms", "pg": "pg_lat_ms"}
    top = {k: med([o[k] for o in res["capacity"]]) for k in FIG6_UNITS}
    rows = {"capacity": top}
    lines = ["| load | antisocial domains running | web (req/s) | web/alone | web latency, median (ms) | "
             "90th and 99th percentile (ms) | web timeouts | PostgreSQL (tps) | PostgreSQL/alone | "
             "PostgreSQL latency, mean (ms) | target |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for share, (offers, phases) in fig6rate_levels(res).items():
        offered = {k: med([o[k] for o in offers]) for k in FIG6_UNITS}
        alone = {k: med([r[k] for r in phases["alone"]]) for k in ("web", "pg", *lat.values())}
        level = rows[share] = {"offered": offered}
        lines.append(f"| {share} of the rate alone as fast as they go ({fmt(top['web'], 0)} req/s, "
                     f"{fmt(top['pg'], 0)} tps) | offered | {fmt(offered['web'], 0)} | | | | | "
                     f"{fmt(offered['pg'], 0)} | | | |")
        for phase, runs in phases.items():
            m = {k: med([r[k] for r in runs if r.get(k) is not None])
                 for k in ("web", "pg", "web_p90_ms", "web_p99_ms", "web_timeouts", *lat.values())}
            rel = {k: m[k] / alone[k] if alone[k] and m[k] is not None else None for k in FIG6_UNITS}
            slower = {k: m[v] / alone[v] if alone[v] and m[v] is not None else None for k, v in lat.items()}
            worst = min((v for v in rel.values() if v is not None), default=None)
            verdict = ("" if phase == "alone" else "met" if worst is not None and worst >= ISOLATION_TARGET
                       else f"missed: {(1 - worst) * 100:.0f}% lost (target 5%)" if worst is not None
                       else "not measured")
            level[phase] = {"median": m, "vs_alone": rel, "latency_vs_alone": slower, "target": verdict}
            lines.append(f"| {share} | {'none (alone)' if phase == 'alone' else phase} | {fmt(m['web'], 0)} | "
                         f"{fmt(rel['web'])} | {fmt(m['web_p50_ms'], 1)} | {fmt(m['web_p90_ms'], 1)}, "
                         f"{fmt(m['web_p99_ms'], 1)} | {fmt(m['web_timeouts'], 0)} | {fmt(m['pg'], 0)} | "
                         f"{fmt(rel['pg'])} | {fmt(m['pg_lat_ms'], 1)} | {verdict} |")
    return rows, lines + fig6rate_sched(res)


def fig6rate_sched(res):
    """How the nested host's scheduler treated the good domains at each
    load and phase (medians, in CPUs): their vCPU time, the time their
    vCPU threads were runnable but waited for a CPU, and KVM's halt
    polling inside their vCPU time; and the hogs' vCPU time."""
    roles = res["clones"]
    lines = ["", "How the nested host's scheduler treated the good domains (CPUs: seconds per second, "
             "medians): each one's vCPU time, the time its vCPU thread was runnable but waiting for a "
             "CPU (/proc/TID/schedstat), and how much of its vCPU time KVM spent polling before a "
             "halt (its debugfs counters; n/a where the run did not record them); and the running "
             "hogs' vCPU time.", "",
             "| load | antisocial domains running | web vCPU | web waiting | web polling | PostgreSQL vCPU "
             "| PostgreSQL waiting | PostgreSQL polling | hogs' vCPU |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for share, (_, phases) in fig6rate_levels(res).items():
        for phase, runs in phases.items():
            uses = [r["cpu"] for r in runs if r.get("cpu")]
            if not uses:
                continue

            def of(role, key):
                return fmt(med_of(uses, lambda u: u["domains"].get(roles[role], {}).get(key)))
            hogs = fmt(med_of(uses, lambda u: sum(u["domains"].get(roles[h], {}).get("vcpu", 0)
                                                    for h in ("disk", "forkmem", "net"))))
            lines.append(f"| {share} | {phase} | " + " | ".join(of(r, k) for r in ("web", "pg")
                                                                for k in ("vcpu", "wait", "poll"))
                         + f" | {hogs} |")
    return lines if len(lines) > 5 else []


def group_bars(ax, xs, series, value_format):
    """As pair_bars, any number of bars at each of `xs`."""
    width = 0.8 / len(series)
    for j, (label, colour, hatch, ys) in enumerate(series):
        bars = ax.bar([i + (j - (len(series) - 1) / 2) * width for i in range(len(xs))], ys, width,
                      label=label, color=colour, hatch=hatch, edgecolor="white")
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y, format(y, value_format), ha="center", va="bottom",
                    fontsize=6, rotation=90 if len(series) > 4 else 0)
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels(xs, fontsize=8)
    ax.set_xlabel("antisocial domains running")


HATCHES = ("", "//")


def plot_fig6rate(rows, path):
    """As Figure 6, at fixed loads: the good domains' rate relative to the
    same load alone (left) and how many times their latency grew (right,
    log scale)."""
    plt = pyplot()
    if plt is None:
        return False
    levels = [x for x in rows if x != "capacity"]
    phases = [p for p in rows[levels[0]] if p not in ("alone", "offered")]
    fig, (ax, lat) = plt.subplots(1, 2, figsize=(12, 4.2))
    series = [(k, x, f"{name} at {x} of its top rate", colour, HATCHES[i % len(HATCHES)])
              for i, x in enumerate(levels)
              for k, name, colour in (("web", "web", "#2b7bba"), ("pg", "PostgreSQL", "#6a9f3a"))]
    for axis, key, value_format in ((ax, "vs_alone", ".2f"), (lat, "latency_vs_alone", ".1f")):
        group_bars(axis, phases, [(label, colour, hatch, [rows[x][p][key][k] or 0 for p in phases])
                                  for k, x, label, colour, hatch in series], value_format)
    ax.axhline(ISOLATION_TARGET, color="black", linewidth=0.6, linestyle="--")
    ax.set_ylabel("rate kept, relative to the same load alone")
    lat.set_yscale("log")
    lat.axhline(1.0, color="black", linewidth=0.6)
    lat.set_ylabel("latency (web median, pg mean), times alone")
    lat.set_title("latency against the same load alone", fontsize=9)
    lat.legend(fontsize=7, loc="upper left")
    return finish(plt, fig, ax, "Figure 6 at fixed loads: the rate kept (bench/paper)", path)


def scal_table(exp, cpus):
    """Section 4.5: the aggregate sysbench rate of N domains against N
    native processes, against N=1's times min(N, CPUs), and the spread
    between domains."""
    res = exp["runs"]
    one = med(totals(res["runs"], "domus", 1))
    rows, lines = {}, ["| domains | native (events/s) | Domus (events/s) | Domus/native | Domus/(N=1 × "
                       "min(N, CPUs)) | one domain's least/most | target |",
                       "| ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for n in res["counts"]:
        nat, dom = med(totals(res["runs"], "native", n)), med(totals(res["runs"], "domus", n))
        ideal = one * min(n, cpus) if one else None
        scale = dom / ideal if ideal and dom is not None else None
        spread = med([min(r["each"]) / max(r["each"]) for r in res["runs"].get("domus", {}).get(str(n), [])
                      if max(r["each"]) > 0])
        verdict = ("met" if scale is not None and scale >= SCALING_TARGET else
                   f"missed: {(1 - scale) * 100:.0f}% below (target 10%)" if scale is not None else "not measured")
        rows[str(n)] = {"native": nat, "domus": dom, "domus_vs_native": dom / nat if nat and dom else None,
                        "domus_vs_ideal": scale, "least_over_most": spread, "target": verdict}
        lines.append(f"| {n} | {fmt(nat, 0)} | {fmt(dom, 0)} | {fmt(rows[str(n)]['domus_vs_native'])} | "
                     f"{fmt(scale)} | {fmt(spread)} | {verdict} |")
    return rows, lines


def plot_scal(rows, path):
    """As the paper's scalability figure: aggregate throughput against the
    number of domains (native: processes), normalised to one."""
    plt = pyplot()
    if plt is None:
        return False
    ns = [int(n) for n in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for env, label, colour in (("native", "native (N processes)", "#4c4c4c"),
                               ("domus", "Domus (N domains)", "#2b7bba")):
        base = rows[str(ns[0])][env]
        if not base:
            continue
        ax.plot(ns, [(rows[str(n)][env] or 0) / base for n in ns], marker="o", label=label, color=colour)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns)
    ax.set_xticklabels([str(n) for n in ns])
    ax.set_xlabel("concurrent domains (native: processes), each running sysbench cpu on one vCPU")
    ax.set_ylabel("aggregate throughput, relative to 1")
    ax.legend(fontsize=8)
    return finish(plt, fig, ax, "Scalability (section 4.5, bench/paper)", path)


def trials_of(name, exp):
    r = exp["runs"]
    if name == "fig5":
        return len(next(iter(r["phases"].values()))["tps"])
    if name == "fig6":
        return len(r["phases"]["alone"])
    if name == "fig6rate":
        return min(len(phases["alone"]) for _, phases in fig6rate_levels(r).values())
    if name == "slice":
        # The fewest any arm has at a count above 1: each nested host that
        # takes part measures one clone again, so the one-clone rows hold
        # more trials than the rest.
        return min((len(v) for per_n in r["runs"].values() for k, v in per_n.items() if k != "1"),
                   default=0)
    return len(r["runs"].get("domus", {}).get(str(r["counts"][0]), []))


def describe(name, exp, cpus):
    """What an experiment ran, in a sentence, above its table."""
    r, n = exp["runs"], trials_of(name, exp)
    clones = (f"clones of a template domain ({r.get('template_mib', 320)} MiB, 1 vCPU) on the nested "
              f"host's {cpus} CPUs")
    return {
        "fig4": lambda: f"{n} trial(s) of {r['seconds']} s: N {clones}, each serving 100 static 16 KiB pages "
                "from an nginx of one worker to its own wrk (1 thread, 4 connections) in the nested host, "
                "all at once; native: N nginx instances of one worker. Medians of the aggregate. Since "
                "2026-11-30 each Domus count is measured right after its clones' resume and again once they "
                "are quiet (each vCPU under 0.1 CPU for 2 s): a clone paused for minutes finds its clock "
                "moved on by them, and systemd restarts the services whose watchdogs that set off; the "
                "Domus column is the second measurement.",
        "fig5": lambda: f"{n} trial(s): {r['domains']} {clones}, each running PostgreSQL under `pgbench -S` "
                f"(2 clients) for {r.get('seconds', '?')} s at once, CPU weights by `sched-credit -w`; "
                "each domain's rate over the seconds when all ran.",
        "fig6": lambda: f"{n} trial(s) of {r['seconds']} s: 5 {clones}, all with the same weight. Two good "
                "ones (nginx under wrk, PostgreSQL under `pgbench -S`) measured at once, while the "
                "antisocial ones are paused (alone) or run their hog: disk (a sustained O_DIRECT `dd` "
                "and small-file creation in a large directory), forkmem (`stress-ng --fork 8 --vm 2 "
                "--vm-bytes 100%`: a bounded fork bomb and a memory hog the guest's OOM killer ends), "
                "net (`iperf3 -P 4` to the nested host).",
        "fig6rate": lambda: f"{n} trial(s) of {r['seconds']} s at each load: fig6's domains and hogs, the good "
                    "ones at fixed loads: in each trial they first run as fast as they go with the hogs "
                    f"paused, then every phase offers them {' and '.join(fig6rate_levels(r))} of those rates "
                    f"in turn: web from {r['web_users']} wrk connections, each waiting a random "
                    "(exponential) think time between requests (SPECweb99's simultaneous users; a slower "
                    "server also lowers their rate), PostgreSQL from `pgbench -S -R` (a Poisson schedule, "
                    "latency from each transaction's scheduled start, so a backlog shows as latency while "
                    "the rate holds). Equal weights give each running domain an equal part of the 2 CPUs "
                    "(two thirds beside one hog, a half beside two). "
                    "The target compares each phase's rate with the same load alone.",
        "scal": lambda: f"{n} trial(s) of {r['seconds']} s plus 1 s per domain: up to {r['most']} {clones} (as many as admission "
                f"took, at most {r.get('bound', 128)}), each running `sysbench cpu --threads=1`, rates over the seconds "
                "when all ran; native: as many sysbench processes. Nested host memory per idle (paused) "
                + (f"clone: {r['idle_mib_per_domain']:.1f} MiB." if "idle_mib_per_domain" in r
                   else "clone: not measured yet (it is measured last)."),
        "slice": lambda: slice_description(r, n, clones),
    }[name]()


def cpu_of(record):
    """A trial's CPU use (cpuuse.between), where the run recorded it."""
    return record.get("cpu") or (record.get("window") or {}).get("cpu")


def med_of(uses, f):
    return med([v for v in (f(u) for u in uses) if v is not None])


def cpu_cells(uses, rate=None):
    """The table cells of CPU use, medians over trials: the nested host's
    guest mode, kernel, user and idle; the domains' vCPU time and their
    I/O threads'; the host's work outside the domains; work per vCPU
    second (if `rate`); vCPU switches and migrations per second."""
    def dsum(key):
        return lambda u: cpuuse.domains_total(u, key)
    cells = [fmt(med_of(uses, lambda u, k=k: u["host"][k])) for k in ("guest", "kernel", "user", "idle")]
    cells += [fmt(med_of(uses, dsum("vcpu"))), fmt(med_of(uses, dsum("io"))),
              fmt(med_of(uses, lambda u: u["outside"]))]
    if rate is not None:
        cells.append(fmt(med_of(uses, lambda u: rate(u) / dsum("vcpu")(u)
                                if u["domains"] and dsum("vcpu")(u) else None), 0))
    cells += [fmt(med_of(uses, dsum("switches")), 0), fmt(med_of(uses, dsum("migrations")), 0),
              fmt(med_of(uses, outer_outside))]
    return cells


def outer_outside(use):
    """The outer machine's CPUs busy outside the nested host (outer.py),
    or None where the run did not record it."""
    return (use.get("outer") or {}).get("outside")


CPU_HEAD = ("nested host's CPUs in guest mode | in its kernel | in user space | idle | domains' vCPU "
            "threads | domains' I/O threads | outside the domains")
CPU_TAIL = "vCPU switches/s | vCPU migrations/s | outer machine, outside the nested host |"


def cpu_table(name, exp):
    """Where the nested host's CPUs went during each measurement (in CPUs:
    seconds per second), for the runs that recorded it (cpuuse.py)."""
    res = exp["runs"]
    lines = []
    if name in ("scal", "fig4"):
        unit = "events" if name == "scal" else "requests"
        for env, per_n in res["runs"].items():
            for n in res["counts"]:
                trials = per_n.get(str(n), [])
                uses = [cpu_of(r) for r in trials if cpu_of(r)]
                if not uses:
                    continue
                total = med([r["total"] for r in trials if cpu_of(r)])
                lines.append(f"| {env} | {n} | " + " | ".join(cpu_cells(uses, lambda u: total)) + " |")
        head = f"| environment | N | {CPU_HEAD} | {unit} per vCPU second | {CPU_TAIL}"
        cols = 13
    elif name in ("fig6", "fig6rate"):
        levels = ({"": res["phases"]} if name == "fig6"
                  else {f"{x} of the top rate, ": ph for x, (_, ph) in fig6rate_levels(res).items()})
        for level, phases in levels.items():
            for phase, runs in phases.items():
                uses = [r["cpu"] for r in runs if r.get("cpu")]
                if uses:
                    lines.append(f"| {level}{phase} | " + " | ".join(cpu_cells(uses)) + " |")
        head = f"| antisocial domains running | {CPU_HEAD} | {CPU_TAIL}"
        cols = 11
    elif name == "fig5":
        for phase, p in res["phases"].items():
            uses = [cpu_of(w) for w in p.get("windows", []) if cpu_of(w)]
            if uses:
                lines.append(f"| {phase_name(phase, p['weights'])} | " + " | ".join(cpu_cells(uses)) + " |")
        head = f"| phase | {CPU_HEAD} | {CPU_TAIL}"
        cols = 11
    else:
        return []
    if not lines:
        return []
    return (["", "Where the nested host's CPUs went during the measurements (CPUs: seconds per second, "
             "medians; cpuuse.py). \"Outside the domains\" is the host's busy time less every domain's "
             "accounted time: its kernel's work not charged to a VMM, the daemon, the bench's own "
             "clients (wrk, iperf3's server). The last column is this machine's CPUs busy outside "
             "the nested host's QEMU (outer.py; n/a where the run did not record it): work that "
             "took CPU time from the nested host unseen.", "", head, "|" + " ---: |" * cols] + lines)


def slice_counts(r):
    """The domain counts a `slice` record measured besides 1 (one number
    before 2026-11-27's evening, a list since)."""
    d = r["domains"]
    return d if isinstance(d, list) else [d]


def slice_description(r, n, clones):
    ns = [str(c) for c in [1] + slice_counts(r)]
    counts = ", ".join(ns[:-1]) + " and " + ns[-1]
    if "sched-credit -t 30" in r["runs"]:
        how = ("with the kernel's default slice and with the daemon's host-wide time slice at 30 ms "
               "(`domus sched-credit -s -t 30`: each vCPU thread asks the nested host's EEVDF "
               "scheduler for a 30 ms slice of its own, `sched_attr.sched_runtime`), Xen's credit "
               "scheduler's default")
    else:
        how = ("with the nested host's EEVDF base slice (`/sys/kernel/debug/sched/base_slice_ns`) at "
               "its default and at 30 ms (Xen's credit scheduler's default time slice)"
               + (", and at its default with each vCPU thread asking for a 30 ms slice of its own "
                  "(`sched_setattr`'s `sched_runtime`, vcpu-threads)" if "vcpu-threads" in r["runs"] else ""))
    ones = sum(len(per_n.get("1", [])) for per_n in r["runs"].values())
    return (f"{n} trial(s) of {r['seconds']} s plus 1 s per domain at each count above 1 ({ones} of "
            f"one clone alone, one per arm in each nested host that took part): {counts} {clones}, "
            f"each running `sysbench cpu --threads=1`, {how}, the order turning each trial "
            "(timeslice.py). Where trials record their nested host, N clones are set against one "
            "clone of the same host only: the median of that host's one-clone rates under either "
            "slice, which cannot matter to a lone vCPU thread on 2 CPUs (3 to 5 switches a second "
            "under both). n/a where no host measured both; hosts differ by up to a quarter.")


def host_alone(arms):
    """Each nested host's one-clone rate: the median of its one-clone
    trials in every arm (a lone vCPU thread on 2 CPUs is never preempted,
    whatever the slice), by host."""
    by_host = {}
    for per_n in arms.values():
        for r in per_n.get("1", []):
            if r.get("host"):
                by_host.setdefault(r["host"], []).append(r["total"])
    return {h: med(v) for h, v in by_host.items()}


def same_host_scale(per_n, n, cpus, one, many, alone):
    """N clones' aggregate against one clone's times min(N, CPUs): trial by
    trial against the same nested host's one-clone rate (`host_alone`)
    where the trials say which host ran them (since 2026-11-27; the median
    of those; None where no host measured both), else the medians' ratio."""
    hosted = [r for r in per_n.get(str(n), []) if r.get("host")]
    if not hosted:
        return many / (one * min(n, cpus)) if one and many is not None else None
    return med([r["total"] / (alone[r["host"]] * min(n, cpus)) for r in hosted if alone.get(r["host"])])


def slice_table(exp, cpus):
    """The `slice` experiment (timeslice.py): 1 and N clones under
    sysbench cpu at each scheduler slice; N's aggregate against N=1's
    times min(N, CPUs), the vCPU threads' switches and the work per vCPU
    second."""
    res = exp["runs"]
    rows, lines = {}, ["| slice | domains | events/s | against 1 × min(N, CPUs) | vCPU switches/s | "
                       "events per vCPU second | outer machine, outside the nested host |",
                       "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    alone = host_alone(res["runs"])
    for label, per_n in res["runs"].items():
        one = med(totals(res["runs"], label, 1))
        for n in [1] + slice_counts(res):
            many = med(totals(res["runs"], label, n))
            uses = [cpu_of(r) for r in per_n.get(str(n), []) if cpu_of(r)]
            vcpus = med_of(uses, lambda u: cpuuse.domains_total(u, "vcpu") or None)
            switches = med_of(uses, lambda u: cpuuse.domains_total(u, "switches"))
            ns = med([r["slice_ns"] for r in per_n.get(str(n), [])])
            scale = same_host_scale(per_n, n, cpus, one, many, alone)
            rows.setdefault(label, {})[str(n)] = {
                "slice_ns": ns, "events_per_s": many, "vs_ideal": scale, "switches_per_s": switches,
                "per_vcpu_s": many / vcpus if many and vcpus else None,
                "outer_outside": med_of(uses, outer_outside)}
            row = rows[label][str(n)]
            lines.append(f"| {label} ({fmt(ns / 1e6 if ns else None)} ms) | {n} | {fmt(many, 0)} | "
                         f"{fmt(scale)} | {fmt(switches, 0)} | {fmt(row['per_vcpu_s'], 0)} | "
                         f"{fmt(row['outer_outside'])} |")
    return rows, lines


def no_plot(rows, path):
    """The experiments whose table says all."""
    return False
