#!/usr/bin/env python3
"""bench/paper: the Xen paper's evaluation (SOSP 2003, section 4) repeated
on Domus, native Linux, QEMU and Cloud Hypervisor, in one nested host
(tools/kvm-host).

  run.py measure OUT.json [--only A,B] [--quick]
  run.py report OUT.json [COMMAND]
  run.py seed RESULTS.json OUT.json [AGAIN]
  run.py retried OUT.json
  run.py progress OUT.json
  run.py selftest

`report` writes results.json, results.md and the plots from OUT.json,
adding COMMAND (the invocation that measured) to the commands it quotes.
`seed` remakes OUT.json from a committed results.json (every trial is kept
there), so a resumed run on a fresh clone keeps what was measured; the
experiments in AGAIN (A,B) are left out, to be measured afresh.
`retried` counts one nested host that failed. `progress` prints how many
trials OUT.json holds, which tools/bench-paper compares before
and after a nested host that failed: a trial is retried in a fresh host at
most twice, however many trials before it did. `selftest` checks which
recorded machines count as this one (run.on_this_machine).

`measure` boots one Domus domain, one QEMU guest and one Cloud Hypervisor
guest (ENVS picks: ENVS=native,domus has neither peer) of the same Debian
image (tools/bench-paper builds it with the benchmark packages; the nested
host has no network), same vCPUs and memory, and runs each experiment's
trials natively and in each guest, one environment at a time
(the others paused), the order turning each trial. It adds each finished
trial and experiment to OUT.json, and skips those already there, so
tools/bench-paper can run the rest in a fresh nested host when one dies.

Experiments (names for --only):
  fig3     Figure 3's rows that exist so far: sysbench cpu, xz -9, make -jN
           of a fixed C tree, dbench (see workloads.py for what each stands
           for);
  pg       Figure 3's PostgreSQL rows: pgbench select-only and TPC-B-like;
  web      Figure 3's web row: nginx serving static pages to wrk;
  osbench  Tables 3-5: `domus-guest osbench`, lmbench-style latencies and
           bandwidths (crates/guest/src/osbench.rs);
  net      Table 6: TCP throughput with iperf3 between the nested host and
           the environment (native: loopback), both ways, MTU 1500 and 500;
  fig4     Figure 4: 1 to 16 clones (8 with --quick) serving the web
           workload at once, against as many native nginx instances;
  fig5     Figure 5: 8 clones (4 with --quick) under pgbench at once,
           equal CPU weights, then weights 1 to N (Domus only);
  fig6     Figure 6 (section 4.4): two good clones (web, PostgreSQL) alone
           and beside antisocial ones (disk, fork and memory, network
           hogs; Domus only);
  fig6rate Figure 6 at fixed loads, as the paper's: the good clones
           first as fast as they go alone, then at a quarter and a half of
           that (wrk connections with think times, pgbench -R), alone and
           beside each hog; the rate they keep, their latency and their
           vCPUs' wait for a CPU (isolation.py; Domus only);
  scal     section 4.5: up to 128 clones (as many as the nested host
           admits; 8 with --quick; SCAL_MOST=N sets another bound) running
           sysbench cpu at once, against as many native processes; memory
           per idle clone.
  slice    why scal loses above one domain per CPU: 1 and 4 clones under
           sysbench cpu with the nested host's scheduler slice at its
           default and at 30 ms, alternated (timeslice.py; Domus only; run
           only when --only names it).
  xzmem    what could make Figure 3's xz row slower under Domus than QEMU: the
           xz command with its memory (RSS, THPs, faults) and the nested
           host's CPU time watched (xzmem.py; run only when --only names it).
  xzpair   Figure 3's xz row alone, with each ratio also taken within the
           nested hosts that ran both environments (xzpair.py; run only
           when --only names it).
  pgcost   where pgbench's time goes in each environment: Figure 3's pg
           commands with the environment's CPU time, switches, IPIs and
           disk flushes, the nested host's CPU time and KVM's counters
           (pgcost.py; run only when --only names it).
  webcost  what a request of Figure 3's web row costs in each environment:
           the web row's wrk run with the same counters per request, the
           VMM process's own CPU time by thread and wrk's (webcost.py; run
           only when --only names it).
  webgroup webcost with QEMU's and CH's VMM processes each in a cgroup of
           its own, as Domus's daemon keeps its domain's (webcost.py; run
           only when --only names it).
  webllc   webcost with a second Domus domain, domus-nollc, whose CPUID
           shows its vCPUs no shared last-level cache, as CH's guest sees
           here (webcost.py; run only when --only names it).
  netcost  what a gigabit of Table 6's iperf3 streams costs in each
           environment: its commands with the same counters per Gbit, the
           VMM process's own CPU time by thread (netcost.py; run only when
           --only names it).
  netmrg   netcost with a second Domus domain, domus-nomrg, whose
           interface offers no mergeable receive buffers (mrg_rxbuf=0),
           and each guest's memory in use (netcost.py; run only when
           --only names it).
  netind   netcost with a second Domus domain, domus-noind, whose
           interface offers no indirect descriptors (indirect_desc=0), as
           Cloud Hypervisor's (netcost.py; run only when --only names it).
fig4, fig5, fig6, fig6rate, scal and slice clone one small template domain (multi.py).
"""
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import benchlib  # noqa: E402
import envs  # noqa: E402
import figs45  # noqa: E402
import isolation  # noqa: E402
import kvmstat  # noqa: E402
import multi  # noqa: E402
import netcost  # noqa: E402
import pgcost  # noqa: E402
import report  # noqa: E402
import scaling  # noqa: E402
import timeslice  # noqa: E402
import webcost  # noqa: E402
import workloads  # noqa: E402
import xzmem  # noqa: E402
import xzpair  # noqa: E402
from envs import say  # noqa: E402

VCPUS, MEMORY_MIB = 2, 1024
IMAGES = os.environ.get("BENCH_IMAGES", "")
IMAGE = os.environ.get("BENCH_IMAGE", "paper")
EXPERIMENTS = ["fig3", "pg", "web", "osbench", "net", "fig4", "fig5", "fig6", "fig6rate", "scal", "slice",
               "xzmem", "xzpair", "pgcost", "webcost", "webgroup", "webllc", "netcost", "netmrg", "netind"]
MULTI = {"fig4", "fig5", "fig6", "fig6rate", "scal", "slice"}
# Measurements of why, run only when --only names them.
DIAGNOSTICS = {"slice", "xzmem", "xzpair", "pgcost", "webcost", "webgroup", "webllc", "netcost", "netmrg", "netind"}
# ENVS=native,domus leaves the peers out (a nested host that dies when a
# QEMU guest boots in it: README, known issues). `ch` runs where the peers'
# Cloud Hypervisor build is (envs.ch_binary).
ENVS = os.environ.get("ENVS", "native,domus,qemu,ch").split(",")


def nested_host():
    """Which nested host this is (its kernel's boot id, shortened): every
    trial keeps it as `nested_host`, so that a ratio can be taken between
    trials one host ran (xzpair.py)."""
    try:
        return benchlib.boot_id()[:8]
    except OSError:
        return "unknown"


def trials(quick):
    return 1 if quick else int(os.environ.get("TRIALS", "5"))


@contextlib.contextmanager
def running(e):
    """`e` running for the block, paused again after it. When the block
    fails, its own error is the one reported: a guest that reset cannot be
    paused either."""
    e.resume()
    try:
        yield e
    except Exception:
        try:
            e.pause()
        except Exception:
            pass
        raise
    e.pause()


def add_this_machine(seen):
    """Adds this outer machine (tools/bench-paper's BENCH_OUTER), where
    known, to the list `seen` of those that measured a record."""
    outer = os.environ.get("BENCH_OUTER")
    if outer and outer not in seen:
        seen.append(outer)


class Run:
    """One `measure`: its settings, its scratch directory, and the results
    file it adds to, trial by trial (`partial`), so a nested host that dies
    loses only the trial it was in."""

    def __init__(self, out, done, quick, work):
        self.out, self.done, self.quick, self.work = out, done, quick, work
        self.count = trials(quick)
        self.snap = None  # multi.py's template snapshot, made on first use

    def save(self):
        report.save_json(self.out, self.done, 1)

    def note_retry(self, key, record):
        """Adds `record` to the retry list `key` (boots_retried,
        clones_replaced) and saves at once: a nested host that resets a
        guest often dies soon after (RUNS.md, 2026-12-03), and a count
        kept until the next trial's save would die with it."""
        self.done.setdefault(key, []).append(record)
        self.save()

    def note_machine(self, name):
        """Records in `name`'s partial record which outer machine
        (tools/bench-paper's BENCH_OUTER) measured trials of it: a row's
        ratios compare only within one machine, and a resumed record may
        span several. The finished record takes the list (`finish`)."""
        mine = self.done.get("partial", {}).get(name)
        if mine is not None:
            add_this_machine(mine.setdefault("measured_on", []))

    def finish(self, name, res):
        """Makes `name`'s trials `res` its finished record, with the
        machines that measured them, and drops its partial one."""
        mine = self.done.get("partial", {}).pop(name, None) or {}
        self.done.setdefault("experiments", {})[name] = {
            "runs": res, "quick": self.quick,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        # This host too (the many-domain experiments keep no trials()).
        seen = mine.get("measured_on", [])
        add_this_machine(seen)
        where = self.done.setdefault("measured_on", {})
        where.pop(name, None)
        if seen:
            where[name] = seen
        self.save()

    def lacking(self, name, environments):
        """Those of `environments` with fewer than trials(quick) trials of
        `name` kept from earlier nested hosts (at this size): the ones an
        experiment needs set up and run. An environment already measured
        is left alone (not booted, not prepared). `environments`: guests,
        or their names."""
        mine = self.done.get("partial", {}).get(name)
        if mine is None or mine.get("quick") != self.quick:
            return list(environments)
        runs = mine["runs"]
        return [e for e in environments if len(runs.get(getattr(e, "name", e), [])) < self.count]

    def trials(self, name, environments, one):
        """Runs `one(env)` (a dict of values) trials(quick) times in each
        environment, the order turning each trial, only `env` running, and
        returns {env: [values, ...]}, with the environments an earlier
        nested host measured and this run left out (Run.lacking). Trials an
        earlier nested host finished (at the same size) count and are not
        run again."""
        n = self.count
        partial = self.done.setdefault("partial", {})
        mine = partial.get(name)
        if mine is None or mine.get("quick") != self.quick:
            mine = partial[name] = {"quick": self.quick, "runs": {}}
        got = mine["runs"]
        for e in environments:
            got.setdefault(e.name, [])
        if any(got.values()):
            say(f"{name}: keeping {', '.join(f'{len(v)} {k}' for k, v in got.items())} "
                "trial(s) an earlier nested host finished")
        for t in range(n):
            for e in envs.rotate(environments, t):
                if len(got[e.name]) > t:
                    continue
                with running(e):
                    t0 = time.monotonic()
                    vals = one(e)
                    vals.setdefault("nested_host", nested_host())
                    shown = [(k, v) for k, v in vals.items()
                             if not k.startswith(kvmstat.PREFIX) and isinstance(v, (int, float))]
                    say(f"{name}: trial {t + 1}/{n}: {e.name}: "
                        + ", ".join(f"{k}={v:g}" for k, v in shown[:6])
                        + (" ..." if len(shown) > 6 else "") + f" ({time.monotonic() - t0:.0f} s)")
                    got[e.name].append(vals)
                    self.note_machine(name)
                    self.save()
        names = {e.name for e in environments}
        return {k: v[:n] for k, v in got.items() if v or k in names}


def fig3(environments, run):
    cmds = workloads.fig3_commands(VCPUS, run.quick)
    tree = os.path.join(run.work, "tree.tar")
    workloads.c_tree(tree, *workloads.tree_size(run.quick))
    for e in environments:
        with running(e):
            e.put(tree, "tree.tar")
            for key, (prep, _) in cmds.items():
                e.sh(prep, 600)

    # What each row cost the guest's VM in KVM (kvmstat: exits, the nested
    # host's page tables), kept beside the values as `kvm.ROW.NAME`.
    watch = kvmstat.available()

    def one(e):
        vals, costs = {}, {}
        for key, (_, cmd) in cmds.items():
            before = kvmstat.snapshot() if watch else {}
            t0 = time.monotonic()
            out = e.sh(cmd, 1800)
            secs = time.monotonic() - t0
            vals[key] = workloads.value(out, f"{e.name}: {key}")
            if watch:
                costs.update(kvmstat.flat(key, kvmstat.moved(before, kvmstat.snapshot()), secs))
        vals.update(costs)
        return vals

    return run.trials("fig3", environments, one)


def osbench(environments, run):
    def one(e):
        vals = workloads.parse(e.sh(workloads.osbench_command(e.helper, run.quick), 1800))
        missing = [k for k in workloads.OSBENCH_ROWS if k not in vals]
        if missing:
            raise RuntimeError(f"{e.name}: osbench printed no {', '.join(missing)}")
        return vals

    return run.trials("osbench", environments, one)


def pg(environments, run):
    """Figure 3's PostgreSQL rows: pgbench select-only and TPC-B-like on a
    database initialised once per environment."""
    for e in environments:
        with running(e):
            e.sh(workloads.pg_prepare(e.name == "native", run.quick), 1800)

    def one(e):
        vals = {}
        for key in workloads.PG_ROWS:
            vals[key] = workloads.value(e.sh(workloads.pg_command(key, VCPUS, run.quick), 900),
                                        f"{e.name}: pgbench ({key})")
        return vals

    try:
        return run.trials("pg", environments, one)
    finally:
        for e in environments:
            if e.name == "native":  # the guests' servers end with them
                e.sh(workloads.PG_STOP, 300)


def web(environments, run):
    """Figure 3's web row: the same nginx configuration and 100 static
    pages in each environment, wrk in the nested host (native: over
    loopback)."""
    script = os.path.join(run.work, "pages.lua")
    with open(script, "w") as f:
        f.write(workloads.WRK_SCRIPT)
    for e in environments:
        with running(e):
            e.sh(workloads.web_prepare(e.helper), 600)

    def one(e):
        ip = "127.0.0.1" if e.name == "native" else e.ip
        secs = 5 if run.quick else 20
        return {"web": workloads.wrk(ip, workloads.WEB_PORT, VCPUS, 8 * VCPUS, secs, script, 600)}

    try:
        return run.trials("web", environments, one)
    finally:
        for e in environments:
            with running(e):
                e.sh(workloads.web_stop(), 60)


def net_server(e):
    """Where environment `e` reaches an iperf3 server in the nested host."""
    return "127.0.0.1" if e.name == "native" else envs.GATEWAY


def net(environments, run):
    """Table 6: iperf3 against a server in the nested host (native: over
    loopback), both directions, MTU 1500 and 500."""
    server = subprocess.Popen(["iperf3", "-s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    try:
        def one(e):
            to = net_server(e)
            vals = {}
            for key, (_, mtu, reverse) in workloads.NET_ROWS.items():
                vals[key] = workloads.value(e.sh(workloads.net_command(to, mtu, reverse, run.quick), 600),
                                            f"{e.name}: iperf3 ({key})")
            return vals

        return run.trials("net", environments, one)
    finally:
        server.kill()
        server.wait()


def heartbeat(dom, what, every=120):
    """Prints, every `every` seconds, which experiment runs and each
    domain's vCPU time so far: a slow step shows progress (tools/watched
    stops a host that prints nothing for STALL_S), a frozen host shows
    nothing, and a guest whose vCPU time stops moving shows it has
    stalled."""
    t0 = time.monotonic()

    def loop():
        while True:
            time.sleep(every)
            try:
                doms = json.loads(dom.domus("list", "--json", check=False) or "[]")
                cpu = ", ".join(f"{d['name']} {d.get('vcpu_time_s', 0):.0f} s" for d in doms)
            except (ValueError, OSError, KeyError) as e:
                cpu = f"no list ({e})"
            say(f"{what[0]}: still running after {time.monotonic() - t0:.0f} s; vCPU time: {cpu}")

    threading.Thread(target=loop, daemon=True).start()


# How far apart two probes (BENCH_OUTER's ring-0 loop time) may lie and still
# be one machine: between nested hosts of one machine they ranged from 454
# to 526 ns; on the machine of 2026-11-28's late night, with the same CPU
# name, from 1262 to 1731 ns (its pgbench ran 11% slower natively and 16%
# under Domus).
SAME_SPEED = 2.0


def outer_speed(outer):
    """A BENCH_OUTER string's CPU part and its probe in ns (None where
    unknown)."""
    cpu, _, rest = outer.partition(", probe ")
    try:
        return cpu, float(rest.split(" ")[0])
    except ValueError:
        return cpu, None


def on_this_machine(outers):
    """Whether every machine in `outers` (BENCH_OUTER strings) is this
    one: the same CPU, memory and CPU count, and a probe within SAME_SPEED
    times this one's (it differs a little between nested hosts of one
    machine, and much between machines of one CPU name); False when none
    is known."""
    here = os.environ.get("BENCH_OUTER")
    if not here or not outers:
        return False
    cpu, speed = outer_speed(here)
    for o in outers:
        other, s = outer_speed(o)
        if other != cpu:
            return False
        if speed and s and max(speed, s) / min(speed, s) > SAME_SPEED:
            return False
    return True


def missing_envs(name, exp, count):
    """{env: trials kept} for the environments asked for (ENVS) that a
    finished single-guest experiment has fewer than `count` trials of
    (none at all, or a run with a smaller TRIALS); QEMU and CH only where
    the run can have them. The many-domain experiments run under Domus
    (and native) alone."""
    if name in MULTI:
        return {}
    want = [e for e in ENVS if e != "ch" or envs.ch_binary()]
    have = {e: len(exp.get("runs", {}).get(e, [])) for e in want}
    return {e: n for e, n in have.items() if n < count}


def lacks(missing, count):
    """missing_envs() in words: `not in qemu`, `2 of 5 trials in native`."""
    none = [e for e, n in missing.items() if n == 0]
    some = [f"{n} of {count} trials in {e}" for e, n in missing.items() if n]
    return ", ".join(([f"not in {', '.join(none)}"] if none else []) + some)


def measure(out, only, quick):
    envs.CAPTURES = os.path.join(os.path.dirname(os.path.abspath(out)), "captures")
    done = record(out)
    # Measured already at this size (an earlier --quick run's are measured
    # again at full size, and the reverse; each kept until its new run ends).
    had = done.get("experiments", {})
    asked = only or [e for e in EXPERIMENTS if e not in DIAGNOSTICS]
    todo = []
    for x in asked:
        if had.get(x, {}).get("quick") != quick:
            # Trials of it an earlier run left unfinished on another
            # machine could not be set against this one's: dropped.
            seen = done.get("partial", {}).get(x, {}).get("measured_on")
            if seen and not on_this_machine(seen):
                say(f"{x}: dropping the unfinished trials of it measured on another machine "
                    f"({'; '.join(seen)}): a row's ratios compare only within one machine")
                done["partial"].pop(x)
            todo.append(x)
        elif ((missing := missing_envs(x, had[x], trials(quick)))
              and not on_this_machine(done.get("measured_on", {}).get(x))):
            # A column (or trials) measured here could not be set against
            # the others: all again, the record kept until that ends; an
            # earlier host's trials of it from here count.
            say(f"{x}: measured already, but {lacks(missing, trials(quick))}, and not (or not known to "
                "be) on this machine: measuring every environment again")
            partial = done.setdefault("partial", {})
            if not on_this_machine(partial.get(x, {}).get("measured_on")):
                partial.pop(x, None)
            todo.append(x)
        elif missing:
            # Finished without an environment asked for (a peer's host
            # died, or ENVS left it out), or with fewer trials than asked
            # for: its trials go back to `partial`, so only what is missing
            # runs (Run.lacking). A copy: the trials added go to `partial`
            # alone until the experiment ends, so a host that dies
            # meanwhile leaves the finished record as it was.
            say(f"{x}: measured already, but {lacks(missing, trials(quick))}: running that, keeping the rest")
            partial = done.setdefault("partial", {})
            runs = copy.deepcopy(had[x]["runs"])
            mine = partial.get(x)
            if mine is not None and mine.get("quick") == quick:
                # An earlier host's trials of the missing environment(s),
                # kept: the host died before it finished them.
                for env, got in mine["runs"].items():
                    if len(got) > len(runs.get(env, [])):
                        runs[env] = got
            partial[x] = {"quick": quick, "runs": runs,
                          "measured_on": list(done.get("measured_on", {}).get(x, []))}
            todo.append(x)
    if not todo:
        say("every experiment asked for is measured already at this size")
        if os.path.exists(out):
            # So that the report does not quote this run's command as one
            # that measured (report.add_command).
            done["measured_nothing"] = True
            report.save_json(out, done, 1)
        return
    done.pop("measured_nothing", None)
    record = envs.benchlib.image_record(IMAGES, IMAGE)
    # BENCH_WORK_DIR: tools/bench-paper's scratch disk in the nested host.
    # The domains' disks live here, and on a tmpfs the pages a VMM writes
    # into them are charged to its memory cgroup (maxmem + 64 MiB) and
    # cannot be reclaimed: a domain that writes its disk is killed.
    cache = multi.cache_dir()
    if cache:
        # The same path in every nested host: the cached template's
        # snapshot names its disks in it (multi.py's template cache).
        work = os.path.join(os.environ.get("BENCH_WORK_DIR") or tempfile.gettempdir(), "domus-bench-paper")
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
    else:
        work = tempfile.mkdtemp(prefix="domus-bench-paper-", dir=os.environ.get("BENCH_WORK_DIR") or None)
    os.chmod(work, 0o755)  # native's workloads run as postgres and nginx's user too
    key = os.path.join(work, "id")
    if cache and os.path.exists(os.path.join(cache, "id")):
        # The key the cached template's guest lets in.
        for f in ("id", "id.pub"):
            shutil.copy(os.path.join(cache, f), os.path.join(work, f))
        os.chmod(key, 0o600)
    else:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        if cache:
            os.makedirs(cache, exist_ok=True)
            for f in ("id", "id.pub"):
                shutil.copy(os.path.join(work, f), os.path.join(cache, f))
    environments = []
    try:
        native = envs.Native(work, VCPUS, record["disk"])
        dom = envs.Domus(work, key, IMAGE, IMAGES, VCPUS, MEMORY_MIB)
        environments = [native, dom]
        run = Run(out, done, quick, work)
        # The many-domain experiments clone a template of their own
        # (multi.py): the `paper` domain and QEMU are for the others.
        singles = [x for x in todo if x not in MULTI]
        peers = [envs.Qemu] if "qemu" in ENVS else []
        if "ch" in ENVS:
            if envs.ch_binary():
                peers.append(envs.CloudHypervisor)
            else:
                say("no Cloud Hypervisor here (CH_BIN, ../shared/peers/cloud-hypervisor): its column is left out")
        # Only the guests that the single-guest experiments still lack
        # trials in boot: each guest more is one more chance for the nested
        # host to die (issue 17) before the missing column is measured.
        need = {n for x in singles for n in run.lacking(x, ["native", "domus"] + [p.name for p in peers])}
        peers = [p for p in peers if p.name in need]
        if "domus" in need:
            envs.boot(dom, run)
            dom.pause()
        elif peers:
            # The peers boot with a copy of the cloud-init seed the daemon
            # makes at `domus create`; the domain itself is not wanted.
            say("domus: measured already; its domain is created for the peers' seed and destroyed")
            dom.domus("create", dom.cfg)
        for peer in peers:
            environments.append(peer(work, key, record, dom.seed(), dom.state, VCPUS, MEMORY_MIB))
        if peers and "domus" not in need:
            dom.domus("destroy", "paper")
        for g in environments[2:]:
            envs.boot(g, run)
            g.pause()
        done["machine"] = benchlib.machine()
        done["config"] = {"vcpus": VCPUS, "memory_mib": MEMORY_MIB, "image": IMAGE,
                          "native_fs": native.fs}
        what = ["starting"]
        heartbeat(dom, what)
        for name in todo:
            what[0] = name
            these = environments if name in MULTI else run.lacking(name, environments)
            say(f"{name}: {trials(quick)} trial(s) in {', '.join(e.name for e in these)}")
            res = {"fig3": fig3, "pg": pg, "web": web, "osbench": osbench, "net": net,
                   "fig4": figs45.fig4, "fig5": figs45.fig5, "fig6": isolation.fig6,
                   "fig6rate": isolation.fig6rate,
                   "scal": scaling.scal, "slice": timeslice.slice_experiment,
                   "xzmem": lambda these, run: xzmem.experiment(these, run, running),
                   "xzpair": lambda these, run: xzpair.experiment(these, run, running),
                   "pgcost": lambda these, run: pgcost.experiment(these, run, running, VCPUS),
                   "webcost": lambda these, run: webcost.experiment(these, run, running, VCPUS),
                   "webgroup": lambda these, run: webcost.experiment(these, run, running, VCPUS,
                                                                     "webgroup"),
                   "webllc": lambda these, run: webcost.experiment(these, run, running, VCPUS,
                                                                   "webllc", dom),
                   "netcost": lambda these, run: netcost.experiment(these, run, running, net_server),
                   # netmrg, netind: netcost with a second Domus domain.
                   **{v: lambda these, run, v=v: netcost.experiment(these, run, running, net_server,
                                                                    v, dom)
                      for v in netcost.VARIANTS}}[name](
                       these, run)
            run.finish(name, res)
    finally:
        for e in reversed(environments):
            try:
                e.resume()
            except Exception:
                pass
            e.close()
        shutil.rmtree(work, ignore_errors=True)


def record(path):
    """run.py's record at `path`, or an empty one where no run saved one."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def progress(done):
    """How many trials `done` (run.py's record) holds, finished or partial:
    every list of records (each a dict or a list: a trial's values, a
    phase's tps of one trial) in its experiments, counted by length. Lists
    of numbers or strings are settings (counts, weights) or machine names,
    and do not count. Grows by at least one with each trial any experiment
    saves; a retry's count (boots_retried, clones_replaced, retried) lies
    outside the experiments and never moves it."""
    def count(v):
        if isinstance(v, dict):
            return sum(count(x) for x in v.values())
        if isinstance(v, list):
            trials = len(v) if v and all(isinstance(x, (dict, list)) for x in v) else 0
            return trials + sum(count(x) for x in v)
        return 0

    return count(done.get("experiments", {})) + count(done.get("partial", {}))


def main():
    a = sys.argv[1:]
    if len(a) >= 2 and a[0] == "measure":
        only = None
        if "--only" in a:
            only = a[a.index("--only") + 1].split(",")
            bad = [x for x in only if x not in EXPERIMENTS]
            if bad:
                sys.exit(f"bench/paper: no experiment {', '.join(bad)} (there are: {', '.join(EXPERIMENTS)})")
        return measure(a[1], only, "--quick" in a)
    if len(a) >= 2 and a[0] == "report":
        return report.report(a[1], " ".join(a[2:]) or None)
    if len(a) in (3, 4) and a[0] == "seed":
        return report.seed(a[1], a[2], a[3].split(",") if len(a) == 4 else ())
    if len(a) == 2 and a[0] == "retried":
        # tools/bench-paper, after a nested host failed: counted in the
        # record, so a resumed run's results still count every retry.
        done = record(a[1])
        done["retried"] = done.get("retried", 0) + 1
        return report.save_json(a[1], done, 1)
    if len(a) == 2 and a[0] == "progress":
        return print(progress(record(a[1])))
    if a == ["selftest"]:
        _test()
        return print("run: ok")
    sys.exit(__doc__)


def _test():
    """`run.py selftest`: which records count as this machine's."""
    assert benchlib.machine()["cpus"] == os.cpu_count()
    cpu = "Intel(R) Xeon(R) Processor, 2 CPUs, 23 GiB"
    was = os.environ.get("BENCH_OUTER")
    try:
        os.environ["BENCH_OUTER"] = f"{cpu}, probe 1319 ns"
        assert on_this_machine([f"{cpu}, probe 1262 ns", f"{cpu}, probe 1731 ns"])
        assert not on_this_machine([f"{cpu}, probe 1500 ns", f"{cpu}, probe 477 ns"])
        assert not on_this_machine(["AMD EPYC, 2 CPUs, 23 GiB, probe 1319 ns"])
        assert not on_this_machine([])
        # An unknown probe leaves the CPU to decide.
        assert on_this_machine([f"{cpu}, probe ? ns"])
        os.environ["BENCH_OUTER"] = f"{cpu}, probe 460 ns"
        assert on_this_machine([f"{cpu}, probe 526 ns", f"{cpu}, probe 454 ns"])
        del os.environ["BENCH_OUTER"]
        assert not on_this_machine([f"{cpu}, probe 460 ns"])
    finally:
        if was is not None:
            os.environ["BENCH_OUTER"] = was
    # A partial record whose trials earlier nested hosts all finished (a
    # run stopped before it wrote the finished record, or TRIALS lowered):
    # nothing is run and the kept trials are its result.
    with tempfile.TemporaryDirectory() as d:
        kept = [{"v": 1.0}] * 7
        r = Run(os.path.join(d, "raw.json"),
                {"partial": {"x": {"quick": False, "runs": {"a": kept}}}}, False, d)
        assert r.lacking("x", ["a"]) == []
        assert r.trials("x", r.lacking("x", []), None) == {"a": kept[:r.count]}
        # A boot run again after a reset is counted in the file at once,
        # before the next boot: the host may die before the trial's save.
        class Resets:
            name, starts = "g", 0

            def start(self):
                self.starts += 1
                if self.starts == 1:
                    raise envs.Restarted("g: the guest reset")

        assert envs.boot(Resets(), r) == 1
        with open(os.path.join(d, "raw.json")) as f:
            assert [b["env"] for b in json.load(f)["boots_retried"]] == ["g"]
    # Progress: each trial saved moves it, whatever the experiment's shape;
    # settings, machines and retry counts do not.
    rec = {"retried": 3, "boots_retried": [{"env": "g"}],
           "experiments": {"fig3": {"runs": {"domus": [{"v": 1}, {"v": 2}]}, "quick": True}},
           "partial": {"fig5": {"quick": True, "measured_on": ["m"],
                                "runs": {"domains": 4, "phases": {"equal": {"weights": [256] * 4,
                                                                            "tps": [], "windows": []}}}}}}
    assert progress({}) == 0 and progress(rec) == 2
    rec["partial"]["fig5"]["runs"]["phases"]["equal"]["tps"].append([80.0, 70.0, 85.0, 63.0])
    assert progress(rec) == 3
    rec["partial"]["scal"] = {"runs": {"counts": [1, 2], "runs": {"domus": {"1": [{"total": 486}]}}}}
    assert progress(rec) == 4
    rec["boots_retried"].append({"env": "qemu"})
    rec["partial"]["scal"]["measured_on"] = ["m", "n"]
    assert progress(rec) == 4
    # `--only x` without RESUME=1: the record seeded from results.json
    # without x, so the report keeps every other experiment's.
    with tempfile.TemporaryDirectory() as d:
        doc = {"experiments": {"x": {"runs": {"a": [{"v": 1}]}, "quick": True},
                               "y": {"runs": {"a": [{"v": 2}]}, "quick": False}},
               "measured_on": {"x": ["m"], "y": ["m"]}, "retried": 4}
        report.save_json(os.path.join(d, "results.json"), doc, 1)
        report.seed(os.path.join(d, "results.json"), os.path.join(d, "raw.json"), ["x"])
        with open(os.path.join(d, "raw.json")) as f:
            raw = json.load(f)
        assert list(raw["experiments"]) == ["y"] and list(raw["measured_on"]) == ["y"]
        assert raw["retried"] == 4
    # A run that measured nothing is not quoted as one that measured; the
    # next one is, once.
    raw = {"commands": ["a"], "measured_nothing": True}
    assert report.add_command(raw, "b") and raw == {"commands": ["a"]}
    assert report.add_command(raw, "b") and raw["commands"] == ["a", "b"]
    assert not report.add_command(raw, "b") and not report.add_command(raw, None)
    # An older results.json's one command string, split back into runs;
    # an annotation's own "; then " is not a boundary.
    assert report.split_commands("A (x; then y); then then B, twice; then C") == ["A (x; then y)", "B, twice", "C"]
    assert report.split_commands("") == []


if __name__ == "__main__":
    main()
