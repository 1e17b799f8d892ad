"""bench/paper's `xzpair` experiment (run.py; a diagnostic, run only when
--only names it): Figure 3's xz row again, to settle whether Domus is
behind QEMU on it, taking each ratio inside one nested host.

Figure 3's record has Domus at 0.90 of QEMU on xz -9, every one of QEMU's
five trials ahead of each of Domus's; the `xzmem` run that followed had
Domus 8% ahead, and nothing measured in between tied the gap to Domus
(DIAGNOSES.md). Nested hosts differ in speed by up to a quarter, and
Figure 3's trials did not keep which host ran them, so a resumed record
can set one VMM's trials from a fast host against the other's from a slow
one. Here every trial records its nested host (run.trials's
`nested_host`), the environments take turns in each host as Figure 3's
do, and the table gives, besides the pooled medians, each host's ratio
of the medians of the trials it ran and the median of those ratios.

The command and its input are Figure 3's own (workloads.fig3_commands):
nothing is watched beside it.
"""
import statistics

import workloads

KEY = "xz"


def experiment(environments, run, running):
    """Figure 3's xz command, run.trials(quick) times in each environment,
    the order turning each trial."""
    prep, cmd = workloads.fig3_commands(2, run.quick)[KEY]
    for e in environments:
        with running(e):
            e.sh(prep, 600)

    def one(e):
        return {KEY: workloads.value(e.sh(cmd, 1800), f"{e.name}: xz")}

    return run.trials("xzpair", environments, one)


def by_host(runs, env):
    """{nested host: the median xz time of `env`'s trials in it}; trials
    without a host (none here) are left out."""
    hosts = {}
    for r in runs.get(env, []):
        if r.get("nested_host") and KEY in r:
            hosts.setdefault(r["nested_host"], []).append(r[KEY])
    return {h: statistics.median(v) for h, v in hosts.items()}


def host_ratios(runs, a, b):
    """`a`'s performance relative to `b`'s (b's time over a's: more is
    better for a) in each nested host that ran both, in host order."""
    ta, tb = by_host(runs, a), by_host(runs, b)
    return [tb[h] / ta[h] for h in ta if h in tb and ta[h] > 0]


def table(exp, envs_order, short, median):
    """results.md's lines for an xzpair record and its rows: each
    environment's pooled median, and Domus against each other environment
    pooled and within hosts."""
    runs = exp["runs"]
    names = [e for e in envs_order if runs.get(e)]
    n = min(len(runs[e]) for e in names) if names else 0
    hosts = {r.get("nested_host") for e in names for r in runs[e] if r.get("nested_host")}
    lines = ["## Diagnostic: Figure 3's xz row, ratios within each nested host (`xzpair`)", "",
             f"Figure 3's xz -9 command alone ({n} trial(s) per environment, in {len(hosts)} nested "
             "host(s), the order turning each trial as in Figure 3), each trial recording the "
             "nested host it ran in. A host's ratio compares the medians of the trials that "
             "host ran; the last column is the median of those ratios, with their range "
             "(bench/paper/xzpair.py; RUNS.md reads it). Domus's performance relative to the "
             "other: more than 1 is Domus faster.", "",
             "| environment | xz -9 (s), median | Domus relative, pooled | hosts with both "
             "| Domus relative, median of hosts (range) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    rows = {}
    for e in names:
        med = median(runs[e], KEY)
        row = {"median_s": med}
        cells = [f"{med:.2f}", "", "", ""]
        if e != "domus" and runs.get("domus"):
            dom = median(runs["domus"], KEY)
            per = host_ratios(runs, "domus", e)
            row.update({"domus_rel_pooled": med / dom if dom else None, "hosts": len(per),
                        "domus_rel_hosts": statistics.median(per) if per else None,
                        "per_host": per})
            cells[1] = f"{med / dom:.2f}" if dom else "n/a"
            cells[2] = str(len(per))
            cells[3] = (f"{statistics.median(per):.2f} ({min(per):.2f} to {max(per):.2f})"
                        if per else "n/a")
        rows[e] = row
        lines.append(f"| {short[e]} | " + " | ".join(cells) + " |")
    return rows, lines + [""]


def _test():
    """Ratios within hosts: a slow host's pair and a fast one's each give
    Domus level, where pooling the same trials would not."""
    runs = {"domus": [{"xz": 10.0, "nested_host": "a"}, {"xz": 20.0, "nested_host": "b"},
                      {"xz": 21.0, "nested_host": "b"}],
            "qemu": [{"xz": 10.0, "nested_host": "a"}, {"xz": 10.5, "nested_host": "a"},
                     {"xz": 20.5, "nested_host": "b"}, {"xz": 5.0}]}
    assert by_host(runs, "qemu") == {"a": 10.25, "b": 20.5}
    r = host_ratios(runs, "domus", "qemu")
    assert [round(x, 3) for x in r] == [1.025, 1.0], r
    rows, lines = table({"runs": runs}, ["native", "domus", "qemu"], {"domus": "Domus", "qemu": "QEMU"},
                        lambda rs, k: statistics.median([x[k] for x in rs]))
    assert rows["qemu"]["hosts"] == 2 and round(rows["qemu"]["domus_rel_hosts"], 4) == 1.0125
    assert "2 nested host(s)" in lines[2] and lines[-2].startswith("| QEMU | 10.25 | 0.51 | 2 |")


if __name__ == "__main__":
    _test()
    print("xzpair: ok")
