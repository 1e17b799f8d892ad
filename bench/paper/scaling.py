"""bench/paper's section 4.5, scalability: up to SCAL_MAX clones (multi.py's)
running the CPU benchmark at once, against as many native processes."""
import os
import time

import cpuuse
from envs import say
from multi import (TEMPLATE_MIB, Steps, concurrent_rates, cpu_note, domus_of, lacking_cells, most_clones,
                   resume_quiet, resumed, sysbench_script, template)


SCAL_MAX = 128


def scal_most(quick):
    """The most clones scal runs, admission's limit aside: SCAL_MOST, or
    SCAL_MAX (8 with --quick)."""
    v = os.environ.get("SCAL_MOST") or str(8 if quick else SCAL_MAX)
    if not v.isdigit() or int(v) < 1:
        raise SystemExit(f"bench/paper: SCAL_MOST must be a whole number of clones, 1 or more, not {v!r}")
    return int(v)


def scal(environments, run):
    """Section 4.5, scalability: up to SCAL_MAX clones (as many as
    admission takes in the nested host; the results say how many) each
    running sysbench cpu on its vCPU at once, against as many sysbench
    processes natively; the aggregate events per second, the spread
    between domains, and the nested host's memory per idle clone."""
    dom = domus_of(environments)
    native = next((e for e in environments if e.name == "native"), None)
    # The template first (restored or made), so that admission's count and
    # the memory read below are the same in every nested host.
    template(dom, run)
    most = min(scal_most(run.quick), most_clones(dom))
    counts = sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= most} | {most})
    secs = 20 if run.quick else 30
    res = resumed(run, "scal", {"template_mib": TEMPLATE_MIB, "most": most, "counts": counts,
                                "seconds": secs})
    # The bound admission's count was cut to (SCAL_MOST, --quick), for the
    # report; not a setting a resumed record must match, since `most` is.
    res["bound"] = scal_most(run.quick)
    before = mem_available_mib()
    steps = Steps(dom, run, "cpu")
    try:
        for t, name, n, got in lacking_cells(res, run, native, counts):
            if name == "native":
                each, use = cpuuse.during(dom, lambda: native_sysbench(native, n, secs + n))
                window = {"cpu": use}
            else:
                def measure(clones):
                    settle = resume_quiet(dom, clones)
                    # N SSH logins take longer to start them all.
                    return settle, *concurrent_rates(clones, sysbench_script(secs + n), secs + n, "sysbench")

                settle, each, window = steps.measure(n, measure)
            say(f"scal: trial {t + 1}: {name}, {n}: {sum(each):.0f} events/s "
                f"(each {min(each):.0f} to {max(each):.0f})" + cpu_note(window["cpu"]))
            got.append({"total": sum(each), "each": each, "window": window,
                        **({"settle_s": settle} if name != "native" else {})})
            run.save()
        if "idle_mib_per_domain" not in res:
            steps.first(most)
            time.sleep(5)
            res["idle_mib_per_domain"] = (before - mem_available_mib()) / most
            say(f"scal: {most} clones hold {res['idle_mib_per_domain']:.1f} MiB each of the nested "
                "host's memory, paused")
            run.save()
        return res
    finally:
        steps.destroy()


def native_sysbench(native, n, secs):
    """n single-threaded sysbench processes at once in the native
    environment; each one's events per second."""
    out = native.sh(f"for i in $(seq {n}); do sysbench cpu --threads=1 --time={secs} run "
                    "| awk '/events per second/ {print \"value=\" $4}' > sb$i.out & done; wait; "
                    f"cat $(seq -f 'sb%g.out' 1 {n})", secs * 4 + 120)
    vals = [float(w.split("=", 1)[1]) for w in out.split() if w.startswith("value=")]
    if len(vals) != n:
        raise RuntimeError(f"native: {n} sysbench processes printed {len(vals)} values")
    return vals


def mem_available_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")
