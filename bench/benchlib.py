"""What the bench scripts share: medians of rounds, the results files with
the run's date and command, and the `measure OUT` / `report OUT [COMMAND]`
entry point (measure runs in the nested host, report here)."""
import datetime
import json
import os
import statistics
import sys


def med(rows, key):
    """The median of `key` over the rounds that have it (None if none)."""
    v = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(v) if v else None


def stamp(src, here, command, rounds):
    """Reads the measurements in `src`, adds the date, command and round
    count, writes them to `here`/results.json and returns them."""
    with open(src) as f:
        m = json.load(f)
    m["date"] = datetime.date.today().isoformat()
    m["command"] = command
    m["rounds"] = rounds
    with open(os.path.join(here, "results.json"), "w") as f:
        json.dump(m, f, indent=1)
    return m


def write_markdown(here, lines):
    """Writes `here`/results.md and prints it."""
    with open(os.path.join(here, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(measure, report, default_command):
    """`run.py measure OUT` or `run.py report OUT [COMMAND...]`."""
    if sys.argv[1] == "measure":
        measure(sys.argv[2])
    else:
        report(sys.argv[2], " ".join(sys.argv[3:]) or default_command)
