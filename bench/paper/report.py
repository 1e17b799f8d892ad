"""bench/paper's report: results.json, results.md and the plots (PNG, with
matplotlib) from what `run.py measure` wrote."""
import datetime
import json
import os
import re
import statistics
import sys
import textwrap

import kvmstat
import workloads

HERE = os.path.dirname(os.path.abspath(__file__))
GUESTS = ["domus", "qemu", "ch"]
NAMES = {"native": "native", "domus": "Domus", "qemu": "QEMU", "ch": "Cloud Hypervisor"}
# Table headers: the peers' short names (the text says what CH is).
SHORT = dict(NAMES, ch="CH")
COLOURS = {"native": "#4c4c4c", "domus": "#2b7bba", "qemu": "#d9822b", "ch": "#5aa02c"}
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


def present(*runs):
    """The guests with a trial in any of `runs` (each {env: trials}), in
    GUESTS' order: a peer left out of the run (ENVS) gets no columns."""
    return [g for g in GUESTS if any(r.get(g) for r in runs)]


def peers(guests):
    """The guests Domus is compared with: each other than Domus, when
    Domus is among them."""
    return [p for p in guests if p != "domus"] if "domus" in guests else []


def medians(runs, key, guests):
    return {e: median(runs.get(e, []), key) for e in ["native"] + guests}


def compare(med, higher, guests):
    """Each guest's score against native, and Domus's against each peer."""
    out = {f"{g}_vs_native": score(med[g], med["native"], higher) for g in guests}
    out.update({f"domus_vs_{p}": score(med["domus"], med[p], higher) for p in peers(guests)})
    return out


def head(lead, guests, tail=()):
    """A table's two header lines: `lead` columns (left-aligned), each
    environment's value, each guest against native, Domus against each
    peer, then `tail` (left-aligned)."""
    num = ([SHORT[e] for e in ["native"] + guests] + [f"{SHORT[g]}/native" for g in guests]
           + [f"Domus/{SHORT[p]}" for p in peers(guests)])
    cols = list(lead) + num + list(tail)
    align = ["---"] * len(lead) + ["---:"] * len(num) + ["---"] * len(tail)
    return ["| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]


def cells(med, cmp, guests, p=2):
    """A row's value and ratio cells, in head()'s order."""
    vals = [fmt(med[e], p) for e in ["native"] + guests] + [fmt(cmp[f"{g}_vs_native"]) for g in guests]
    vals += [fmt(cmp[f"domus_vs_{p}"]) for p in peers(guests)]
    return " | ".join(vals)


def fig3_table(exps):
    """Figure 3's rows from the experiments that measure them (fig3, pg,
    web), in the paper's order."""
    meta = [(k, m, exps["fig3"]["runs"]) for k, m in workloads.FIG3_ROWS.items() if "fig3" in exps]
    meta += [(k, m, exps["pg"]["runs"]) for k, m in workloads.PG_ROWS.items() if "pg" in exps]
    meta += [(k, m, exps["web"]["runs"]) for k, m in workloads.WEB_ROWS.items() if "web" in exps]
    guests = present(*(runs for _, _, runs in meta))
    rows, lines = {}, head(["workload (stands for)", "unit"], guests, ["target"])
    for key, (label, unit, higher, stands), runs in meta:
        med = medians(runs, key, guests)
        if med["native"] is None:
            continue
        cmp = compare(med, higher, guests)
        d, q = cmp.get("domus_vs_native"), cmp.get("qemu_vs_native")
        within = 0.95 if key in CPU_BOUND else 0.90
        misses = []
        if d is None or d < within:
            misses.append("no Domus value" if d is None else
                          f"{(1 - d) * 100:.1f}% below native (target {(1 - within) * 100:.0f}%)")
        if d is not None and q is not None and d < q * 0.995:
            misses.append(f"{(1 - d / q) * 100:.1f}% below QEMU (target: at least QEMU)")
        verdict = "missed: " + "; ".join(misses) if misses else "met"
        rows[key] = {"median": med, **cmp, "target": verdict}
        lines.append(f"| {label} ({stands}) | {unit} | {cells(med, cmp, guests)} | {verdict} |")
    return rows, lines


# What kvmstat recorded per Figure 3 row: (header, counter names summed,
# per second of the row or the value at its end).
KVM_COLS = [("exits/s", ("exits",), True), ("IRQ exits/s", ("irq_exits",), True),
            ("HLT exits/s", ("halt_exits",), True), ("I/O+MMIO exits/s", ("io_exits", "mmio_exits"), True),
            ("TDP faults/s", ("pf_fixed",), True), ("TLB flushes/s", ("tlb_flush",), True),
            ("2 MiB pages", ("pages_2m",), False), ("4 KiB pages", ("pages_4k",), False)]


def kvm_table(runs, guests):
    """What KVM counted for each guest's VM during each Figure 3 row
    (kvmstat): medians over the trials that recorded it of the exits per
    second of the row and of how the nested host's two-dimensional page
    tables mapped the guest's memory at its end. [] when none did."""
    lines = []
    for key, (label, *_) in workloads.FIG3_ROWS.items():
        for g in guests:
            wall = kvmstat.key(key, "wall_s")
            ts = [r for r in runs.get(g, []) if r.get(wall)]
            if not ts:
                continue
            vals = []
            for _, names, per_s in KVM_COLS:
                xs = [sum(r.get(kvmstat.key(key, n), 0) for n in names) / (r[wall] if per_s else 1)
                      for r in ts]
                vals.append(f"{statistics.median(xs):.0f}")
            wall_s = statistics.median(r[wall] for r in ts)
            lines.append(f"| {label} | {SHORT[g]} | {len(ts)} | {wall_s:.1f} | " + " | ".join(vals) + " |")
    if not lines:
        return []
    cols = ["row", "VMM", "trials", "row s"] + [h for h, _, _ in KVM_COLS]
    return (["| " + " | ".join(cols) + " |",
             "| " + " | ".join(["---"] * 2 + ["---:"] * (len(cols) - 2)) + " |"] + lines)


def osbench_tables(exp):
    runs = exp["runs"]
    guests = present(runs)
    rows, lines = {}, []
    titles = {3: "Table 3: processes (µs)", 4: "Table 4: context switches (µs)",
              5: "Table 5: file and memory (µs; bandwidth in MB/s)"}
    for table, title in titles.items():
        lines += ["", f"### {title}", ""] + head(["benchmark"], guests)
        for key, (label, t) in workloads.OSBENCH_ROWS.items():
            if t != table:
                continue
            med = medians(runs, key, guests)
            higher = key.endswith("_mbs")
            cmp = compare(med, higher, guests)
            rows[key] = {"median": med, **cmp}
            lines.append(f"| {label} | {cells(med, cmp, guests, 0 if higher else 2)} |")
    return rows, lines


_TOLD = []


def pyplot():
    """matplotlib's pyplot, without a display; None where it is missing,
    said once, since results.md then loses its plots' links."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if not _TOLD:
            _TOLD.append(True)
            print(f"bench/paper: no matplotlib for {sys.executable} (Debian's python3-matplotlib is for "
                  "/usr/bin/python3): results.md is written without its plots", file=sys.stderr)
        return None
    return plt


def finish(plt, fig, ax, title, path):
    """Titles a plot, writes it to `path` (PNG) and closes it; True."""
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return True


def plot_fig3(rows, path):
    """Figure 3 as the paper drew it: one group of bars per workload, the
    score relative to native, one bar per environment."""
    plt = pyplot()
    if plt is None:
        return False
    keys = list(rows)
    top = 1.0
    envs = ["native"] + [g for g in GUESTS if any(rows[k].get(f"{g}_vs_native") is not None for k in keys)]
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(keys), 3.6))
    width = 0.8 / len(envs)
    for i, env in enumerate(envs):
        # A row the environment has no value for gets no bar (not a 0).
        xs, ys = zip(*[(x, 1.0 if env == "native" else rows[k].get(f"{env}_vs_native"))
                       for x, k in enumerate(keys)
                       if env == "native" or rows[k].get(f"{env}_vs_native") is not None])
        top = max(top, *ys)
        bars = ax.bar([x + (i - (len(envs) - 1) / 2) * width for x in xs], ys, width,
                      label=NAMES[env], color=COLOURS[env])
        for b, y in zip(bars, ys):
            ax.text(b.get_x() + b.get_width() / 2, y + 0.01, f"{y:.2f}", ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(range(len(keys)))
    labels = {**workloads.FIG3_ROWS, **workloads.PG_ROWS, **workloads.WEB_ROWS}
    # The workload and, below it, what it stands for (two rows stand for
    # SPEC INT2000).
    ax.set_xticklabels([textwrap.fill(labels[k][0], 26) + f"\n({labels[k][3]})" for k in keys],
                       fontsize=7)
    ax.set_ylabel("score relative to native")
    ax.set_ylim(0, 1.3 * top)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.legend(fontsize=8, loc="upper center", ncol=len(envs))
    return finish(plt, fig, ax, "Figure 3: relative performance (bench/paper)", path)


def multi_sections(exps, doc):
    """Figures 4-6 and the scalability experiment (report_multi.py): their
    sections of results.md, their rows in doc, their plots."""
    import report_multi as rm
    lines = []
    cpus = doc["machine"].get("cpus") or 1
    for name, title, table, plot in (
            ("fig4", "Figure 4: concurrent web servers", rm.fig4_table, rm.plot_fig4),
            ("fig5", "Figure 5: differentiated service", rm.fig5_table, rm.plot_fig5),
            ("fig6", "Figure 6: performance isolation (section 4.4)", rm.fig6_table, rm.plot_fig6),
            ("fig6rate", "Figure 6 at fixed loads", rm.fig6rate_table, rm.plot_fig6rate),
            ("scal", "Scalability (section 4.5)", lambda e: rm.scal_table(e, cpus), rm.plot_scal),
            ("slice", "Why scalability falls above one domain per CPU: the scheduler's slice",
             lambda e: rm.slice_table(e, cpus), rm.no_plot)):
        if name not in exps:
            continue
        exp = exps[name]
        rows, tbl = table(exp)
        doc["experiments"][name] = {"rows": rows, **kept(exp)}
        lines += ([f"## {title}", ""] + partial_note(exp) + [rm.describe(name, exp, cpus)]
                  + (tbl if tbl[0] == "" else [""] + tbl))
        lines += rm.cpu_table(name, exp)
        if plot(rows, os.path.join(HERE, f"{name}.png")):
            lines += ["", f"![{title}]({name}.png)"]
        lines.append("")
    return lines


def has_data(record):
    """Whether a partial record holds any measurement: some non-empty list
    of trials, at any depth."""
    if isinstance(record, list):
        return bool(record)
    if isinstance(record, dict):
        return any(has_data(v) for v in record.values())
    return False


def partial_note(exp):
    """The line that marks an unfinished experiment's section."""
    if not exp.get("partial"):
        return []
    return ["**Partial:** no run has finished this experiment yet; these are the trials nested "
            "hosts finished before they died (bench/paper/RUNS.md).", ""]


def add_command(raw, command):
    """Adds `command` to the record's commands, unless it is there last
    already or the run measured nothing (run.py's measure left
    `measured_nothing`, which this clears); whether the record changed."""
    commands = raw.setdefault("commands", [])
    if raw.pop("measured_nothing", False):
        return True
    if command and command not in commands[-1:]:
        commands.append(command)
        return True
    return False


def split_commands(text):
    """The commands of an older results.json's one `command` string (each
    joined by "; then ", an annotation in parentheses never split)."""
    out, depth, cur, i = [], 0, "", 0
    while i < len(text):
        if text.startswith("; then ", i) and depth == 0:
            out.append(cur)
            cur, i = "", i + len("; then ")
            continue
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        cur += text[i]
        i += 1
    out.append(cur)
    return [c.removeprefix("then ") for c in out if c]


def runs_section(commands):
    """results.md's last section: every invocation that measured, in order
    (each with what it measured and what went wrong, where noted)."""
    return (["## Runs that measured", "", "Each `tools/bench-paper` invocation whose trials these results "
             "keep, oldest first, with how many nested hosts it took where noted (RUNS.md has more):", ""]
            + [f"{i}. {c}" for i, c in enumerate(commands, 1)] + [""])


def report(src, command=None):
    """Writes results.json, results.md and the plots from `src` (run.py's
    record). `command`, when given, is the invocation that measured: added
    to the record's list of commands (once), which results.md quotes, so a
    run resumed from an earlier one's record names both."""
    with open(src) as f:
        raw = json.load(f)
    if add_command(raw, command):
        save_json(src, raw, 1)
    commands = raw["commands"] or ["tools/bench-paper"]
    exps = dict(raw.get("experiments", {}))
    # What nested hosts measured of an experiment no run has finished yet
    # (Run's `partial`): shown, and marked, rather than left out.
    for name, mine in raw.get("partial", {}).items():
        if name not in exps and has_data(mine.get("runs")):
            exps[name] = dict(mine, partial=True)
    m = raw.get("machine", {})
    doc = {"benchmark": "bench/paper",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commands": commands, "machine": m, "config": raw.get("config", {}),
           "retried": raw.get("retried", 0),
           "boots_retried": raw.get("boots_retried", []),
           "clones_replaced": raw.get("clones_replaced", []),
           "measured_on": raw.get("measured_on", {}), "experiments": {}}
    lines = ["# bench/paper results", "",
             f"{doc['date']} on `{m.get('host')}` ({m.get('cpus')} CPUs, kernel {m.get('kernel')}), "
             f"in the nested KVM host, by the {len(commands)} run(s) of `tools/bench-paper` listed at the "
             f"end (the last: `{re.split(r' [(]|, ', commands[-1])[0]}`). Guests: {doc['config'].get('vcpus')} "
             f"vCPUs, {doc['config'].get('memory_mib')} MiB, image `{doc['config'].get('image')}`; "
             "native runs in the nested host on as many CPUs (taskset). The guests run under "
             "Domus and, where the run has them, QEMU (`-accel kvm`) and Cloud Hypervisor v53 "
             "(CH, the peers' build). Medians of each "
             "environment's trials; scores relative to native, more is better. Nested-host attempts "
             f"that failed (most because the host died) and were run again in a fresh host: "
             f"{doc['retried']}; guest boots run again after a reset: "
             f"{len(doc['boots_retried'])}; clones made again after a reset (before they were up or while measured): "
             f"{len(doc['clones_replaced'])}.", ""]
    # A partial experiment's machines are in its partial record.
    where = dict(doc["measured_on"], **{x: e.get("measured_on") or [] for x, e in exps.items()
                                        if e.get("partial")})
    if any(where.values()):
        lines += [measured_on(where, sorted(exps)), ""]
    if any(x in exps for x in ("fig3", "pg", "web")):
        rows, table = fig3_table(exps)
        counts = {x: len(exps[x]["runs"].get("domus", [])) for x in ("fig3", "pg", "web") if x in exps}
        n = min(counts.values())
        # An environment with other than Domus's count of trials (a resumed
        # run that has not yet reached it) is named.
        odd = {x: ", ".join(f"{SHORT[e]} {len(t)}" for e, t in exps[x]["runs"].items()
                            if t and len(t) != counts[x]) for x in counts}
        trials = (f"{n} trial(s)" if len(set(counts.values())) == 1 and not any(odd.values()) else
                  "trials: " + ", ".join(f"{x} {c}" + (f" ({odd[x]})" if odd[x] else "")
                                         for x, c in counts.items()))
        parts = [x for x in ("fig3", "pg", "web") if x in exps]
        doc["experiments"]["fig3"] = {"rows": rows, "trials": n,
                                      "runs": {x: exps[x]["runs"] for x in parts},
                                      "quick": {x: exps[x].get("quick") for x in parts},
                                      "partial": {x: bool(exps[x].get("partial")) for x in parts}}
        lines += [f"## Figure 3: relative performance ({trials})", ""] + table
        if plot_fig3(rows, os.path.join(HERE, "fig3.png")):
            lines += ["", "![Figure 3](fig3.png)"]
        costs = kvm_table(exps["fig3"]["runs"], present(exps["fig3"]["runs"])) if "fig3" in exps else []
        if costs:
            lines += ["", "What KVM in the nested host counted for each guest's VM during the CPU, "
                      "build and dbench rows (its debugfs, `bench/paper/kvmstat.py`; medians of the "
                      "trials that recorded it). Every exit is emulated by the outer QEMU, so exits "
                      "per second and the page size the guest's memory is mapped at are what a "
                      "guest's speed in this nested host depends on beside its own code.", ""] + costs
        lines.append("")
    if "osbench" in exps:
        rows, tables = osbench_tables(exps["osbench"])
        n = len(exps["osbench"]["runs"].get("domus", []))
        doc["experiments"]["osbench"] = {"rows": rows, "trials": n, **kept(exps["osbench"])}
        lines += [f"## Tables 3-5: OS microbenchmarks ({n} trial(s); `domus-guest osbench`)"] + tables
        fs = doc["config"].get("native_fs")
        if fs == "chroot":
            lines += ["", "Native runs the image's own userspace in a chroot: a copy of its root file "
                      "system, ext4 on a loop device on the nested host's scratch disk; the guests' "
                      "is their ext4 root (virtio disk, a qcow2 overlay on the same scratch disk)."]
        elif fs == "ext4":
            lines += ["", "Native's files are on ext4 on a loop device in the nested host's tmpfs "
                      "(its programs this machine's, read over the nested host's 9p root); the "
                      "guests' on their ext4 root (virtio disk, qcow2 overlay in the same tmpfs)."]
        else:
            lines += ["", "Native's files are on the nested host's tmpfs (no loop device there); the "
                      "guests' on their ext4 root: the file rows compare different file systems."]
        lines.append("")
    if "net" in exps:
        runs = exps["net"]["runs"]
        n = len(runs.get("domus", []))
        guests = present(runs)
        rows = {}
        lines += [f"## Table 6: TCP throughput ({n} trial(s); iperf3 to the nested host, native "
                  "over loopback)", ""] + partial_note(exps["net"]) + head([""], guests)
        for key, (label, _, _) in workloads.NET_ROWS.items():
            med = medians(runs, key, guests)
            cmp = compare(med, True, guests)
            rows[key] = {"median": med, **cmp}
            lines.append(f"| {label} | {cells(med, cmp, guests, 0)} |")
        doc["experiments"]["net"] = {"rows": rows, "trials": n, **kept(exps["net"])}
        lines.append("")
    if "xzmem" in exps:
        import xzmem
        rows, tbl = xzmem.table(exps["xzmem"], ["native"] + GUESTS, SHORT, median)
        doc["experiments"]["xzmem"] = {"rows": rows, **kept(exps["xzmem"])}
        lines += tbl[:2] + partial_note(exps["xzmem"]) + tbl[2:]
    if "xzpair" in exps:
        import xzpair
        rows, tbl = xzpair.table(exps["xzpair"], ["native"] + GUESTS, SHORT, median)
        doc["experiments"]["xzpair"] = {"rows": rows, **kept(exps["xzpair"])}
        lines += tbl[:2] + partial_note(exps["xzpair"]) + tbl[2:]
    if "pgcost" in exps:
        import pgcost
        rows, tbl = pgcost.table(exps["pgcost"], ["native"] + GUESTS, SHORT)
        doc["experiments"]["pgcost"] = {"rows": rows, **kept(exps["pgcost"])}
        lines += tbl[:2] + partial_note(exps["pgcost"]) + tbl[2:]
    import netcost
    if "netcost" in exps:
        rows, tbl = netcost.table(exps["netcost"], ["native"] + GUESTS, SHORT)
        doc["experiments"]["netcost"] = {"rows": rows, **kept(exps["netcost"])}
        lines += tbl[:2] + partial_note(exps["netcost"]) + tbl[2:]
    for name in netcost.VARIANTS:
        if name in exps:
            env, label, *_ = netcost.VARIANTS[name]
            rows, tbl = netcost.table(exps[name], ["native", "domus", env] + GUESTS[1:],
                                      dict(SHORT, **{env: label}), name)
            doc["experiments"][name] = {"rows": rows, **kept(exps[name])}
            lines += tbl[:2] + partial_note(exps[name]) + tbl[2:]
    for name in ("webcost", "webgroup", "webllc"):
        if name in exps:
            import webcost
            rows, tbl = webcost.table(exps[name], ["native", "domus", webcost.VARIANT] + GUESTS[1:],
                                      dict(SHORT, **{webcost.VARIANT: "Domus, no LLC"}), name)
            doc["experiments"][name] = {"rows": rows, **kept(exps[name])}
            lines += tbl[:2] + partial_note(exps[name]) + tbl[2:]
    lines += multi_sections(exps, doc)
    missing = [x for x in ("fig3", "pg", "web", "osbench", "net", "fig4", "fig5", "fig6", "fig6rate", "scal")
               if x not in exps or exps[x].get("partial")]
    if missing:
        lines += ["## Not finished in this run", "", f"{', '.join(missing)} (see `run.py`'s experiments).", ""]
    # Trials toward an environment a finished experiment still lacks
    # (run.py's missing_envs), not shown until that run ends: kept, so a
    # fresh clone's resumed run goes on from them.
    pending = {k: v for k, v in raw.get("partial", {}).items() if k in raw.get("experiments", {})}
    if pending:
        doc["pending"] = pending
    # Records an experiment's later run replaced (put aside in the record
    # by hand, with why): kept in results.json, named here.
    if raw.get("superseded"):
        doc["superseded"] = raw["superseded"]
        lines += ["## Superseded records", "", "Kept in `results.json`'s `superseded` (bench/paper/RUNS.md "
                  "says what replaced them):", ""] + [f"- {k}" for k in raw["superseded"]] + [""]
    lines += runs_section(commands)
    save_json(os.path.join(HERE, "results.json"), doc, 2)
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def measured_on(where, names):
    """Which outer machines measured which experiments (run.py's
    note_machine), the experiments of none recorded named too."""
    by = {}
    for name in names:
        by.setdefault(" and ".join(where.get(name, [])) or None, []).append(name)
    parts = [f"{', '.join(xs)} on {m}" for m, xs in by.items() if m]
    if None in by:
        parts.append(f"{', '.join(by[None])} before machines were recorded (2026-11-28)")
    return ("Outer machines (CPU, memory, and the nested host's speed: tools/kvm-host's probe, "
            "ns per loop iteration; ratios compare only within one machine): " + "; ".join(parts) + ".")


def kept(exp):
    """What results.json keeps of an experiment's record, for `seed` to
    make it again: its trials, its size and whether it finished, and an
    unfinished one's machines (a finished one's are in `measured_on`)."""
    out = {"runs": exp["runs"], "quick": exp.get("quick"), "partial": bool(exp.get("partial"))}
    if exp.get("partial") and exp.get("measured_on"):
        out["measured_on"] = exp["measured_on"]
    return out


def save_json(path, value, indent):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=indent)
        f.write("\n")
    os.replace(tmp, path)


def seed(results, out, again=()):
    """Makes run.py's record `out` from a committed results.json, so that
    RESUME=1 on a fresh clone (no target/bench-paper/raw.json) keeps what
    was measured and the next report still shows it: each experiment's
    trials, at its size, finished or partial; the retry counts; the
    commands that measured them. The experiments named in `again` are
    left out, to be measured afresh (`tools/bench-paper --only` without
    RESUME=1: the others' records stay)."""
    with open(results) as f:
        doc = json.load(f)
    raw = {"machine": doc.get("machine", {}), "config": doc.get("config", {}),
           "retried": doc.get("retried", 0), "boots_retried": doc.get("boots_retried", []),
           "clones_replaced": doc.get("clones_replaced", []),
           "commands": doc.get("commands") or split_commands(doc.get("command", "")),
           "measured_on": doc.get("measured_on", {}),
           "experiments": {}, "partial": {}, "superseded": doc.get("superseded", {})}
    for name, exp in doc.get("experiments", {}).items():
        if name == "fig3":
            # Figure 3 joins three experiments' records.
            items = [(x, runs, exp.get("quick", {}).get(x), exp.get("partial", {}).get(x))
                     for x, runs in exp["runs"].items()]
        else:
            items = [(name, exp["runs"], exp.get("quick"), exp.get("partial"))]
        for x, runs, quick, partial in items:
            if quick is None:
                sys.exit(f"bench/paper: {results} does not say at which size {x} was measured "
                         "(--quick or not); run without RESUME=1")
            raw["partial" if partial else "experiments"][x] = {"runs": runs, "quick": quick}
            if partial and exp.get("measured_on") and name != "fig3":
                raw["partial"][x]["measured_on"] = exp["measured_on"]
    raw["partial"].update(doc.get("pending", {}))
    for x in again:
        raw["experiments"].pop(x, None)
        raw["partial"].pop(x, None)
        raw["measured_on"].pop(x, None)
    save_json(out, raw, 1)
