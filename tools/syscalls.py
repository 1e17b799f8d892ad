#!/usr/bin/env python3
"""tools/syscalls.py TRACE...: the system calls `domus run` processes made, by
thread kind, from `strace -f -Y` output (each line `PID<COMM> call(...`).

A VMM is a process from its execve of `... run ...` on; its threads are the
clones it (or one of its threads) made after that. Thread names are folded
into kinds (vcpu0 -> vcpu, blk-io3 -> blk-io). Prints a JSON object
{kind: [syscall, ...]} plus "all", for crates/vmm/src/seccomp.rs's lists.

How the traces were made (tools/NOTES.md, "seccomp"):
  tools/kvm-host bash -c 'strace -f -Y -qq -o /tmp/t GUEST_TEST_BINARY ...; cp /tmp/t target/'
"""

import collections
import json
import re
import sys

LINE = re.compile(r"^(\d+)<([^>]*)> (?:<\.\.\. )?([a-z_0-9]+)")
EXECVE = re.compile(r'^(\d+)<[^>]*> execve\("[^"]*", \["[^"]*", "run"')
CLONE = re.compile(r"^(\d+)<[^>]*> (?:<\.\.\. )?(?:clone3?|vfork|fork)(?: resumed>)?.*= (\d+)(?:<[^>]*>)?$")


def kind(comm):
    return re.sub(r"\d+$", "", comm) or comm


def main(paths):
    # Two passes: first which processes are VMMs (an execve of `... run`,
    # or a process one of whose threads is a vCPU: a trace filtered before
    # it got here may lack the execve), then their calls.
    vmm, parent, comm_of = set(), {}, {}
    lines = []
    for path in paths:
        with open(path, errors="replace") as f:
            lines.extend(f)
    for line in lines:
        m = EXECVE.match(line)
        if m:
            vmm.add(m.group(1))
        m = CLONE.match(line)
        if m:
            parent[m.group(2)] = m.group(1)
        m = LINE.match(line)
        if m:
            comm_of.setdefault(m.group(1), set()).add(m.group(2))
    for tid, comms in comm_of.items():
        if any(re.fullmatch(r"vcpu\d+", c) for c in comms) and tid in parent:
            vmm.add(parent[tid])
    # Threads of VMMs, and theirs.
    changed = True
    while changed:
        changed = False
        for child, par in parent.items():
            if par in vmm and child not in vmm:
                vmm.add(child)
                changed = True
    calls = collections.defaultdict(set)
    for line in lines:
        m = LINE.match(line)
        if m and m.group(1) in vmm:
            calls[kind(m.group(2))].add(m.group(3))
    out = {k: sorted(v) for k, v in sorted(calls.items())}
    out["all"] = sorted(set().union(*calls.values())) if calls else []
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
