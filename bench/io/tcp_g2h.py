#!/usr/bin/env python3
"""bench/io/tcp_g2h.py: TCP guest -> host only, Domus and QEMU in turn, PAIRS
pairs (default 5) of 256 MiB transfers in one nested host, for a closer look
at the one bench/io row below QEMU. Run inside the nested host:

    tools/kvm-host python3 bench/io/tcp_g2h.py

Writes bench/io/tcp_g2h.{json,md}. Same guests, tap, bridge and helper as
run.py (guest A's disk and network set-up), nothing else running.
"""
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402

PAIRS = int(os.environ.get("PAIRS", "5"))
MIB = 256


def main():
    k = R.kit()
    work = tempfile.mkdtemp(prefix="domus-g2h-")
    root = os.path.join(work, "root.img")
    shutil.copy(k["rootfs"], root)
    R.sh("debugfs", "-w", "-R", f"write {R.HELPER} /h", root)
    R.bridge(True)
    res = {"domus": [], "qemu": []}
    try:
        for i in range(PAIRS):
            order = ["domus", "qemu"] if i % 2 == 0 else ["qemu", "domus"]
            for vmm in order:
                rx = R.receiver("tcp", 5001)
                time.sleep(0.2)
                cmd = R.net_up(R.A_IP) + f"/h send tcp {R.HOST_IP} 5001 {MIB} >/dev/null"
                c = R.vmm_cmd(vmm, k, [(root, False)], R.TAP_A, "52:54:00:00:00:0a", None,
                              R.cmdline(cmd, True))
                subprocess.run(c, capture_output=True, timeout=300)
                out, _ = rx.communicate(timeout=30)
                mbs = R.fields(out).get("recv_mbs")
                print(f"pair {i + 1}: {vmm} {mbs} MB/s", file=sys.stderr, flush=True)
                res[vmm].append(mbs)
    finally:
        R.bridge(False)
        shutil.rmtree(work, ignore_errors=True)
    med = {v: statistics.median(x) for v, x in res.items()}
    ratios = [d / q for d, q in zip(res["domus"], res["qemu"])]
    doc = {
        "benchmark": "bench/io tcp_g2h",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"PAIRS={PAIRS} tools/kvm-host python3 bench/io/tcp_g2h.py",
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "config": {"pairs": PAIRS, "mib": MIB},
        "runs": res,
        "median": med,
        "domus_vs_qemu_median": med["domus"] / med["qemu"],
        "per_pair_ratios": ratios,
    }
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "tcp_g2h.json"), "w") as f:
        json.dump(doc, f, indent=1)
    lines = [
        "# bench/io: TCP guest to host, closer look",
        "",
        f"{doc['date']} on `{platform.node()}` (inside the nested KVM host: kernel "
        f"{platform.release()}, {os.cpu_count()} CPUs); command `{doc['command']}`; "
        f"{PAIRS} pairs of {MIB} MiB transfers, the VMM that goes first alternating.",
        "",
        "| pair | Domus (MB/s) | QEMU (MB/s) | Domus/QEMU |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for i, (d, q) in enumerate(zip(res["domus"], res["qemu"])):
        lines.append(f"| {i + 1} | {d:.1f} | {q:.1f} | {d / q:.2f} |")
    lines.append(f"| median | {med['domus']:.1f} | {med['qemu']:.1f} | "
                 f"{med['domus'] / med['qemu']:.2f} |")
    with open(os.path.join(here, "tcp_g2h.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
