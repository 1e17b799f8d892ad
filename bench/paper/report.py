"""bench/paper's report: results.json, results.md and the plots (PNG, with
matplotlib) from what `run.py measure` wrote."""
import datetime
import json
import os
import statistics

import workloads

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS = ["native", "domus", "qemu"]
NAMES = {"native": "native", "domus": "Domus", "qemu": "QEMU"}
# Figure 3's targets (issue 16): Domus within 5% of native on the CPU-bound
# rows, within 10% on the others, and at least QEMU on every row.
CPU_BOUND = {"sysbench_cpu", "xz"}


def median(runs, key):
    xs = [r[key] for r in runs if key in r]
    return statistics.median(xs) if xs else None


def score(value, native, higher):
    """Relative to native, more is better."""
    if value is None or native is None or value == 0 or native == 0:
        return None
    return value / native if higher else native / value


def fmt(x, p=2):
    return "n/a" if x is None else f"{x:.{p}f}"


def fig3_table(exps):
    """Figure 3's rows from the experiments that measure them (fig3, pg,
    web), in the paper's order."""
    meta = [(k, m, exps["fig3"]["runs"]) for k, m in workloads.FIG3_ROWS.items() if "fig3" in exps]
    meta += [(k, m, exps["pg"]["runs"]) for k, m in workloads.PG_ROWS.items() if "pg" in exps]
    meta += [(k, m, exps["web"]["runs"]) for k, m in workloads.WEB_ROWS.items() if "web" in exps]
    rows, lines, verdicts = {}, [], []
    lines += ["| workload (stands for) | unit | native | Domus | QEMU | Domus/native | QEMU/native | "
              "Domus/QEMU | target |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for key, (label, unit, higher, stands), runs in meta:
        med = {e: median(runs.get(e, []), key) for e in ENVS}
        if med["native"] is None:
            continue
        d, q = score(med["domus"], med["native"], higher), score(med["qemu"], med["native"], higher)
        within = 0.95 if key in CPU_BOUND else 0.90
        ok = d is not None and d >= within and (q is None or d >= q * 0.995)
        verdict = "met" if ok else (
            f"missed: {(1 - d) * 100:.1f}% below native (target {(1 - within) * 100:.0f}%)"
            if d is not None and d < within else "missed: below QEMU")
        rows[key] = {"median": med, "domus_vs_native": d, "qemu_vs_native": q,
                     "domus_vs_qemu": d / q if d and q else None, "target": verdict}
        verdicts.append(ok)
        lines.append(f"| {label} ({stands}) | {unit} | {fmt(med['native'])} | {fmt(med['domus'])} | "
                     f"{fmt(med['qemu'])} | {fmt(d)} | {fmt(q)} | {fmt(rows[key]['domus_vs_qemu'])} | "
                     f"{verdict} |")
    return rows, lines


def osbench_tables(exp):
    runs = exp["runs"]
    rows, lines = {}, []
    titles = {3: "Table 3: processes (µs)", 4: "Table 4: context switches (µs)",
              5: "Table 5: file and memory (µs; bandwidth in MB/s)"}
    for table, title in titles.items():
        lines += ["", f"### {title}", "",
                  "| benchmark | native | Domus | QEMU | Domus/native | QEMU/native |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for key, (label, t) in workloads.OSBENCH_ROWS.items():
            if t != table:
                continue
            med = {e: median(runs.get(e, []), key) for e in ENVS}
            higher = key.endswith("_mbs")
            d = score(med["domus"], med["native"], higher)
            q = score(med["qemu"], med["native"], higher)
            rows[key] = {"median": med, "domus_vs_native": d, "qemu_vs_native": q}
            p = 0 if higher else 2
            lines.append(f"| {label} | {fmt(med['native'], p)} | {fmt(med['domus'], p)} | "
                         f"{fmt(med['qemu'], p)} | {fmt(d)} | {fmt(q)} |")
    return rows, lines


def plot_fig3(rows, path):
    """Figure 3 as the paper drew it: one group of bars per workload, the
    score relative to native, one bar per environment."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    keys = list(rows)
    top = 1.0
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(keys), 3.6))
    width = 0.26
    for i, (env, colour) in enumerate((("native", "#4c4c4c"), ("domus", "#2b7bba"),
                                       ("qemu", "#d9822b"))):
        if env != "native" and all(rows[k][f"{env}_vs_native"] is None for k in keys):
            continue  # not in this run (ENVS)
        ys = [1.0 if env == "native" else (rows[k][f"{env}_vs_native"] or 0) for k in keys]
        top = max(top, *ys)
        bars = ax.bar([x + (i - 1) * width for x in range(len(keys))], ys, width, label=NAMES[env],
                      color=colour)
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y + 0.01, f"{y:.2f}", ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(range(len(keys)))
    labels = {**workloads.FIG3_ROWS, **workloads.PG_ROWS, **workloads.WEB_ROWS}
    # The workload and, below it, what it stands for (two rows stand for
    # SPEC INT2000).
    ax.set_xticklabels([f"{labels[k][0]}\n({labels[k][3]})" for k in keys], fontsize=7)
    ax.set_ylabel("score relative to native")
    ax.set_ylim(0, 1.15 * top)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Figure 3: relative performance (bench/paper)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


PHASE_NAMES = {"equal": "equal weights", "weighted": "weights 1 to 8"}


def fig5_table(exp):
    """Figure 5: each domain's median transactions per second and its share
    of the total against its weight's share, per phase. Target (issue 16):
    each share within 10% of its weight's share."""
    res = exp["runs"]
    rows, lines = {}, []
    for phase, p in res["phases"].items():
        w = p["weights"]
        tps = [statistics.median(r[i] for r in p["tps"]) for i in range(len(w))]
        total, wsum = sum(tps), sum(w)
        share = [x / total if total else None for x in tps]
        want = [x / wsum for x in w]
        off = [abs(s / t - 1) if s is not None else None for s, t in zip(share, want)]
        worst = max((x for x in off if x is not None), default=None)
        ok = worst is not None and worst <= 0.10
        rows[phase] = {"weights": w, "tps": tps, "share": share, "weight_share": want,
                       "worst_off": worst, "aggregate_tps": total,
                       "target": "met" if ok else f"missed: a share {worst * 100:.0f}% off its "
                       "weight's (target 10%)" if worst is not None else "missed"}
        lines += ["", f"### {PHASE_NAMES.get(phase, phase)}: aggregate {total:.0f} tps; {rows[phase]['target']}", "",
                  "| domain | weight | tps | share | weight's share | share/weight's |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for i, (x, s, t) in enumerate(zip(tps, share, want)):
            lines.append(f"| pg-{i + 1} | {w[i]} | {x:.0f} | {fmt(s, 3)} | {t:.3f} | "
                         f"{fmt(s / t if s is not None else None)} |")
    return rows, lines


def plot_fig5(rows, path):
    """Figure 5 as the paper drew it: each domain's throughput, one bar
    group per domain, equal and weighted side by side."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    phases = list(rows)
    n = len(rows[phases[0]]["tps"])
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    width = 0.8 / len(phases)
    for j, (phase, colour) in enumerate(zip(phases, ("#9a9a9a", "#2b7bba"))):
        xs = [i + (j - (len(phases) - 1) / 2) * width for i in range(n)]
        ax.bar(xs, rows[phase]["tps"], width, color=colour,
               label=f"{PHASE_NAMES.get(phase, phase)} ({', '.join(str(w) for w in rows[phase]['weights'])})")
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"pg-{i + 1}" for i in range(n)], fontsize=8)
    ax.set_ylabel("pgbench select-only (tps)")
    ax.legend(fontsize=7)
    ax.set_title(f"Figure 5: {n} domains under pgbench, by CPU weight (bench/paper)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def report(src, command):
    with open(src) as f:
        raw = json.load(f)
    exps = raw.get("experiments", {})
    m = raw.get("machine", {})
    doc = {"benchmark": "bench/paper",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": command, "machine": m, "config": raw.get("config", {}),
           "retried": int(os.environ.get("RETRIED", "0")),
           "boots_retried": raw.get("boots_retried", []), "experiments": {}}
    lines = ["# bench/paper results", "",
             f"{doc['date']} on `{m.get('host')}` ({m.get('cpus')} CPUs, kernel {m.get('kernel')}), "
             f"in the nested KVM host; command `{command}`. Guests: {doc['config'].get('vcpus')} "
             f"vCPUs, {doc['config'].get('memory_mib')} MiB, image `{doc['config'].get('image')}`; "
             "native runs in the nested host on as many CPUs (taskset). Medians of each "
             "environment's trials; scores relative to native, more is better. Nested hosts that "
             f"died and were replaced: {doc['retried']}; guest boots run again after a reset: "
             f"{len(doc['boots_retried'])}.", ""]
    if any(x in exps for x in ("fig3", "pg", "web")):
        rows, table = fig3_table(exps)
        n = min(len(exps[x]["runs"].get("domus", [])) for x in ("fig3", "pg", "web") if x in exps)
        doc["experiments"]["fig3"] = {"rows": rows, "trials": n,
                                      "runs": {x: exps[x]["runs"] for x in ("fig3", "pg", "web")
                                               if x in exps}}
        lines += [f"## Figure 3: relative performance ({n} trial(s))", ""] + table
        if plot_fig3(rows, os.path.join(HERE, "fig3.png")):
            lines += ["", "![Figure 3](fig3.png)"]
        lines.append("")
    if "osbench" in exps:
        rows, tables = osbench_tables(exps["osbench"])
        n = len(exps["osbench"]["runs"].get("domus", []))
        doc["experiments"]["osbench"] = {"rows": rows, "trials": n, "runs": exps["osbench"]["runs"]}
        lines += [f"## Tables 3-5: OS microbenchmarks ({n} trial(s); `domus-guest osbench`)"] + tables
        if doc["config"].get("native_fs") == "ext4":
            lines += ["", "Native's files are on ext4 on a loop device in the nested host's tmpfs; "
                      "the guests' on their ext4 root (virtio disk, qcow2 overlay in the same tmpfs)."]
        else:
            lines += ["", "Native's files are on the nested host's tmpfs (no loop device there); the "
                      "guests' on their ext4 root: the file rows compare different file systems."]
        lines.append("")
    if "net" in exps:
        runs = exps["net"]["runs"]
        n = len(runs.get("domus", []))
        rows = {}
        lines += [f"## Table 6: TCP throughput ({n} trial(s); iperf3 to the nested host, native "
                  "over loopback)", "",
                  "| | native | Domus | QEMU | Domus/native | QEMU/native | Domus/QEMU |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for key, (label, _, _) in workloads.NET_ROWS.items():
            med = {e: median(runs.get(e, []), key) for e in ENVS}
            d, q = score(med["domus"], med["native"], True), score(med["qemu"], med["native"], True)
            dq = score(med["domus"], med["qemu"], True)
            rows[key] = {"median": med, "domus_vs_native": d, "qemu_vs_native": q, "domus_vs_qemu": dq}
            lines.append(f"| {label} | {fmt(med['native'], 0)} | {fmt(med['domus'], 0)} | "
                         f"{fmt(med['qemu'], 0)} | {fmt(d)} | {fmt(q)} | {fmt(dq)} |")
        doc["experiments"]["net"] = {"rows": rows, "trials": n, "runs": runs}
        lines.append("")
    if "fig5" in exps:
        rows, table = fig5_table(exps["fig5"])
        n = len(next(iter(exps["fig5"]["runs"]["phases"].values()))["tps"])
        doc["experiments"]["fig5"] = {"rows": rows, "trials": n, "runs": exps["fig5"]["runs"]}
        lines += [f"## Figure 5: differentiated service ({n} trial(s); "
                  f"{exps['fig5']['runs']['domains']} clones of the domain, each running "
                  "PostgreSQL under `pgbench -S` at once, CPU weights by `sched-credit -w`)"] + table
        if plot_fig5(rows, os.path.join(HERE, "fig5.png")):
            lines += ["", "![Figure 5](fig5.png)"]
        lines.append("")
    missing = [x for x in ("fig3", "pg", "web", "osbench", "net", "fig5") if x not in exps]
    lines += ["## Not measured yet", "",
              "Figures 4 and 6, the scalability experiment and the web row's dynamic pages are not "
              "written yet (issue 16)."
              + (f" Not in this run: {', '.join(missing)}." if missing else ""), ""]
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
