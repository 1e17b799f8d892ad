#!/usr/bin/env python3
"""bench/jail: what the jail adds to a VMM's start, measured directly.

bench/boot compares whole boots with and without the jail, where the
guest's own boot time varies by seconds in the nested host; this measures
the jail's pieces on their own (no guest: the jail needs no KVM), with
crates/jail/examples/startup.rs, ROUNDS times, natively on the development
machine and inside the nested host bench/boot runs in:

  * spawn: starting a process with domus_jail::spawn and waiting for it,
    in new mount, PID, IPC and UTS namespaces and without, for /bin/true
    and for a Rust binary of the jail crate's (which, like `domus`, is
    dynamically linked and starts the Rust runtime);
  * enter: domus_jail::enter (private mounts, a tmpfs root, pivot_root,
    new ids, no capabilities, rlimits, Landlock), timed inside the child;
  * spawn+enter: both, from the parent.

The daemon's jailed VMM pays the namespaces on its spawn plus enter; a
standalone `domus run --jail` pays a whole second start of itself (in new
namespaces) plus enter. Both are compared with the Domus boot time that
bench/boot last measured in the same place. Needs root. Run with
tools/bench-jail (`run.py measure` in each place, then `run.py report`);
writes results.json and results.md here.
"""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "target/release/examples/startup")
ROUNDS = int(os.environ.get("ROUNDS", "50"))


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def measure(dest, where):
    """Runs the example here and writes its medians and samples to DEST."""
    if os.geteuid() != 0:
        sys.exit("bench/jail: needs root (namespaces, pivot_root, setuid)")
    out = subprocess.run([EXAMPLE, str(ROUNDS)], check=True, capture_output=True,
                         text=True).stdout
    samples = {}
    for line in out.splitlines():
        m = json.loads(line)
        key = m["what"] if m["what"] == "enter" else \
            f"{m['what']} {m['program']}{' ns' if m['namespaces'] else ''}"
        samples.setdefault(key, []).append(m["us"])
    med = {k: statistics.median(v) for k, v in samples.items()}
    p90 = {k: sorted(v)[int(0.9 * (len(v) - 1))] for k, v in samples.items()}
    doc = {
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release(),
                    "where": where},
        "median_us": med,
        "p90_us": p90,
        "jail_cost_us": {
            # The namespaces on the VMM's own start, and enter().
            "daemon_vmm": med["spawn self ns"] - med["spawn self"] + med["enter"],
            # A second start of itself in new namespaces, and enter().
            "domus_run_jail": med["spawn self ns"] + med["enter"],
        },
        "raw_us": samples,
    }
    with open(dest, "w") as f:
        json.dump(doc, f)


ROWS = [
    ("spawn true", "start /bin/true, host's namespaces"),
    ("spawn true ns", "start /bin/true, new namespaces"),
    ("spawn self", "start a Rust binary, host's namespaces"),
    ("spawn self ns", "start a Rust binary, new namespaces"),
    ("enter", "enter() in the child"),
    ("spawn+enter self ns", "start a Rust binary in new namespaces that enters the jail"),
]


def report(paths):
    """Writes results.json and results.md from the measurements in PATHS."""
    places = []
    for p in paths:
        with open(p) as f:
            places.append(json.load(f))
    boot = {}
    try:
        with open(os.path.join(REPO, "bench/boot/results.json")) as f:
            b = json.load(f)
        boot = {"boot_ms": b["medians"]["domus"]["boot_ms"], "date": b["date"],
                "where": b["machine"]["where"]}
    except (OSError, KeyError, ValueError):
        pass
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc = {"benchmark": "bench/jail", "date": date, "command": "tools/bench-jail",
           "rounds": ROUNDS, "places": places, "domus_boot": boot}
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = ["# bench/jail results", "",
             f"{date}, command `tools/bench-jail`, {ROUNDS} rounds in each place, medians (p90) in ms.",
             "", "| what | " + " | ".join(p["machine"]["where"] for p in places) + " |",
             "| --- |" + " ---: |" * len(places)]
    for key, label in ROWS:
        cells = [f"{p['median_us'][key] / 1000:.3f} ({p['p90_us'][key] / 1000:.3f})"
                 for p in places]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for name, label in [("daemon_vmm", "a daemon's jailed VMM starts later by"),
                        ("domus_run_jail", "`domus run --jail` starts later by")]:
        lines.append(f"| **{label}** | " + " | ".join(
            f"**{p['jail_cost_us'][name] / 1000:.2f}**" for p in places) + " |")
    lines += ["", "Machines: " + "; ".join(
        f"{p['machine']['where']}: {p['machine']['cpu']}, {p['machine']['cpus']} CPUs, "
        f"kernel {p['machine']['kernel']}" for p in places) + "."]
    if boot:
        same = [p for p in places if p["machine"]["where"] == boot["where"]]
        for p in same:
            c = p["jail_cost_us"]
            lines += ["", f"Against Domus's boot to init in the same place, as bench/boot last "
                      f"measured it ({boot['boot_ms']:.0f} ms, {boot['date']}): "
                      f"{100 * c['daemon_vmm'] / 1000 / boot['boot_ms']:.2f}% for a daemon's VMM, "
                      f"{100 * c['domus_run_jail'] / 1000 / boot['boot_ms']:.2f}% for "
                      "`domus run --jail`. So bench/boot's jailed/unjailed ratio, which "
                      "differs from 1 by more than that, shows the guests' own variation."]
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "measure":
        measure(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2:])
    else:
        sys.exit("usage: run.py measure OUT WHERE | run.py report MEASUREMENT...")
