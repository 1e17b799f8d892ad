#!/usr/bin/env python3
"""bench/io/qcow2_pairs.py: Domus's block rows on a qcow2 overlay against
raw, in groups run back to back in one nested host, for issue 15's target
(qcow2 within 10% of raw on every block row).

bench/io's full rounds put each variant once in each nested host, in an
order that turns by round; the 4 KiB random rows then spread two-fold
between hosts, and with a few rounds which variant ran first in a fresh
host weighs as much as the disk. Here every group runs the variants one
after another in the same host (the first of them turning by group), and
the ratios are taken within each group.

Each run is bench/io's guest A with the block tests alone (`ioload
/dev/vdb SECONDS first-write`: a timed first write of a data disk of its
own, made fresh for it, then the timed rows on written space), the images
on the nested host's ext4 scratch disk (STORE=disk): `domus` a fallocated
raw data disk, `domus-sparse` a sparse one (truncate), `domus-qcow2` a
fresh qcow2 overlay on the never-written raw base (its root disk an
overlay too).

    tools/bench-io builds what this needs (or: tools/setup; the builds
    at its top), then
    HOSTS=3 GROUPS_PER_HOST=4 SECONDS_PER_TEST=6 python3 bench/io/qcow2_pairs.py

runs HOSTS nested hosts in turn (`qcow2_pairs.py host OUT.jsonl` in each,
through tools/watched: a host silent for STALL_S seconds, default 240, is
stopped and counted), in each a warm-up run that is not counted and then
GROUPS_PER_HOST groups, appending one JSON line per run to
target/qcow2-pairs/runs.jsonl (RESUME=1 keeps the lines already
there), then writes bench/io/qcow2-pairs.{json,md} (`qcow2_pairs.py
report`, which can be run again on the lines).
"""
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys

os.environ["FIRST_WRITE"] = "1"
os.environ["BLOCK_ONLY"] = "1"
os.environ.setdefault("STORE", "disk")
os.environ.setdefault("SECONDS_PER_TEST", "6")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402
from run import benchlib  # noqa: E402

VARIANTS = ["domus", "domus-sparse", "domus-qcow2"]
# (not GROUPS: bash keeps that name for the user's groups and drops an assignment to it)
GROUPS_PER_HOST = int(os.environ.get("GROUPS_PER_HOST", "4"))
HOSTS = int(os.environ.get("HOSTS", "3"))
STALL_S = os.environ.get("STALL_S", "240")
OUT_DIR = os.path.join(R.REPO, "target", "qcow2-pairs")
# Ratios the report shows: (numerator, denominator).
PAIRS = [("domus-qcow2", "domus"), ("domus-qcow2", "domus-sparse"), ("domus-sparse", "domus")]


def host(out_path):
    """GROUPS_PER_HOST groups of VARIANTS in this (nested) host; one line per run."""
    k = R.kit()
    boot = benchlib.boot_id()
    work, root, data, helper_img, helper_size = R.workspace(k, "domus-qcow2-pairs-")
    R.bridge(True)
    seq = 0
    # Where this host's first group starts in VARIANTS (the driver counts
    # hosts), so the variant that leads a group turns across hosts too.
    start = int(os.environ.get("QCOW2_PAIRS_HOST", "0"))
    try:
        # The first run in a fresh host is not counted: on 2026-12-02 it
        # wrote its first pass at twice the speed of the same host's later
        # runs, whatever its disk (NOTES.md).
        R.say("domus: a warm-up run (not counted)")
        R.one_round("domus", k, root, data, helper_img, helper_size)
        R.remove_made(root, data, "domus")
        for g in range(GROUPS_PER_HOST):
            turn = (start + g) % len(VARIANTS)
            for vmm in VARIANTS[turn:] + VARIANTS[:turn]:
                res = R.one_round(vmm, k, root, data, helper_img, helper_size)
                R.remove_made(root, data, vmm)
                line = {"host": boot, "group": g, "seq": seq, "vmm": vmm, "store": R.STORE,
                        "seconds": float(R.SECONDS),
                        **{key: res[key] for key in R.BLOCK_KEYS}}
                with open(out_path, "a") as f:
                    f.write(json.dumps(line) + "\n")
                seq += 1
    finally:
        R.bridge(False)
        shutil.rmtree(work, ignore_errors=True)


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def groups(lines):
    """{(host, group): {vmm: line}}: the runs of each group (a host that
    died may have left its last group part-done)."""
    g = {}
    for line in lines:
        g.setdefault((line["host"], line["group"]), {})[line["vmm"]] = line
    return g


def report(lines, lost, command):
    if not lines:
        sys.exit(f"qcow2_pairs: no run finished ({lost} host(s) lost); nothing to report")
    by_group = groups(lines)
    keys = R.BLOCK_KEYS
    # Each ratio over the groups that ran both of its variants.
    ratios = {f"{a}/{b}": {key: [v[a][key] / v[b][key] for v in by_group.values()
                                 if a in v and b in v] for key in keys}
              for a, b in PAIRS}
    medians = {n: {key: statistics.median(x[key] for x in lines if x["vmm"] == n) for key in keys}
               for n in VARIANTS}
    summary = {p: {key: statistics.median(xs) if xs else None for key, xs in r.items()}
               for p, r in ratios.items()}
    counts = {p: len(r[keys[0]]) for p, r in ratios.items()}
    full = {k: v for k, v in by_group.items() if all(n in v for n in VARIANTS)}
    # In the order they ran (the lines are appended as runs end).
    hosts = list(dict.fromkeys(line["host"] for line in lines))
    doc = {
        "benchmark": "bench/io qcow2_pairs",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "machine": benchlib.machine(),
        "config": {"variants": VARIANTS, "seconds_per_block_test": lines[0]["seconds"],
                   "store": lines[0]["store"], "data_mib": R.DATA_MIB, "memory_mib": R.MEMORY_MIB,
                   "vcpus": 1, "hosts": len(hosts), "hosts_lost": lost,
                   "groups_complete": len(full), "groups_per_ratio": counts},
        "runs": lines,
        "median": medians,
        "ratios_per_group": ratios,
        "median_ratio": summary,
    }
    with open(os.path.join(R.HERE, "qcow2-pairs.json"), "w") as f:
        json.dump(doc, f, indent=1)
    names = {"domus": "raw", "domus-sparse": "sparse raw", "domus-qcow2": "qcow2"}
    label = {p: "/".join(names[n] for n in p.split("/")) for p in ratios}
    out = [
        "# bench/io: Domus's block rows, qcow2 overlay against raw, in groups",
        "",
        f"{doc['date']} on `{doc['machine']['host']}` ({doc['machine']['cpus']} CPUs, kernel "
        f"{doc['machine']['kernel']}), in nested KVM hosts; command `{command}`. "
        f"{len(lines)} runs in {len(hosts)} nested hosts, {len(full)} groups complete "
        f"({lost} host(s) lost: silent, or a guest reset; the runs they finished are kept). "
        f"Each group runs Domus on a fallocated raw data "
        f"disk, a sparse raw one and a fresh qcow2 overlay one after another in the same host "
        f"(the first of them turning by group and host); each run a first write of its own fresh "
        f"256 MiB data disk, then each timed row for {lines[0]['seconds']:g} s, O_DIRECT in a "
        f"guest of 1 vCPU and {R.MEMORY_MIB} MiB; the images on the nested host's ext4 "
        f"scratch disk. Each ratio is taken within a group, over every group that ran both "
        f"of its variants; the first run in each host is a warm-up, not counted.",
        "",
        "Medians of the per-group ratios (and the range):",
        "",
        "| test | " + " | ".join(f"{label[p]} ({counts[p]} groups)" for p in ratios) + " |",
        "| --- |" + " ---: |" * len(ratios),
    ]
    for key in keys:
        out.append(f"| {R.LABELS[key]} | " + " | ".join(
            f"{summary[p][key]:.2f} ({min(ratios[p][key]):.2f} to {max(ratios[p][key]):.2f})"
            if ratios[p][key] else "-" for p in ratios) + " |")
    out += ["", "Medians of the runs (over every host: runs of different hosts differ more "
            "than the disks do, so these are not the comparison):", "",
            "| test | " + " | ".join(names[n] for n in VARIANTS) + " |",
            "| --- |" + " ---: |" * len(VARIANTS)]
    for key in keys:
        out.append(f"| {R.LABELS[key]} | "
                   + " | ".join(f"{medians[n][key]:.0f}" for n in VARIANTS) + " |")
    out += ["", "Every run, in the order each host ran them (host, group, variant: "
            + ", ".join(R.LABELS[key] for key in keys) + "):", ""]
    for line in sorted(lines, key=lambda x: (hosts.index(x["host"]), x["seq"])):
        out.append(f"- {line['host'][:8]} {line['group']} {names[line['vmm']]}: "
                   + ", ".join(f"{line[key]:g}" for key in keys))
    with open(os.path.join(R.HERE, "qcow2-pairs.md"), "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


def drive():
    for path in (R.DOMUS, R.HELPER):
        if not os.path.exists(path):
            sys.exit(f"{path} missing: run tools/bench-io first (it builds Domus, the kit "
                     "and the guest helper)")
    if os.environ.get("RESUME", "0") != "1":
        shutil.rmtree(OUT_DIR, ignore_errors=True)
    os.makedirs(OUT_DIR, exist_ok=True)
    runs = os.path.join(OUT_DIR, "runs.jsonl")
    lost_path = os.path.join(OUT_DIR, "lost")
    for h in range(HOSTS):
        n = sum(1 for name in os.listdir(OUT_DIR) if name.startswith("host-"))
        log = os.path.join(OUT_DIR, f"host-{n + 1}.log")
        env = dict(os.environ, KVM_HOST_DISK=os.environ.get("KVM_HOST_DISK", "4096"),
                   QCOW2_PAIRS_HOST=str(n))
        print(f"qcow2_pairs: nested host {h + 1}/{HOSTS} (log: {log})", file=sys.stderr,
              flush=True)
        rc = subprocess.run([os.path.join(R.REPO, "tools/watched"), log, STALL_S,
                             os.path.join(R.REPO, "tools/kvm-host"), "python3",
                             os.path.abspath(__file__), "host", runs], env=env).returncode
        if rc != 0:
            with open(lost_path, "a") as f:
                f.write(f"{log}: exit status {rc}\n")
            print(f"qcow2_pairs: host {h + 1} failed or went silent (status {rc}); its "
                  "finished groups are kept", file=sys.stderr, flush=True)
    lost = 0
    if os.path.exists(lost_path):
        with open(lost_path) as f:
            lost = len(f.readlines())
    command = (f"HOSTS={HOSTS} GROUPS_PER_HOST={GROUPS_PER_HOST} SECONDS_PER_TEST={R.SECONDS} "
               "python3 bench/io/qcow2_pairs.py")
    report(load(runs) if os.path.exists(runs) else [], lost, command)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "host":
        return host(sys.argv[2])
    if len(sys.argv) >= 5 and sys.argv[1] == "report":
        return report(load(sys.argv[3]), int(sys.argv[2]), " ".join(sys.argv[4:]))
    if len(sys.argv) == 1:
        return drive()
    sys.exit("usage: qcow2_pairs.py | qcow2_pairs.py host OUT.jsonl | "
             "qcow2_pairs.py report LOST RUNS.jsonl COMMAND...")


if __name__ == "__main__":
    main()
