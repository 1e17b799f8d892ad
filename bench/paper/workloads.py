"""bench/paper's workloads: the open stand-ins for the Xen paper's suites,
as shell commands that print `key=value` lines, with what each row means.

Each row has a unit, and says whether more is better; the report turns
every row into a score relative to native (more is better) either way.
"""
import random
import re
import subprocess

# Figure 3's rows (the paper's application benchmarks).
#   key: (label, unit, higher_is_better, stands for)
FIG3_ROWS = {
    "sysbench_cpu": ("sysbench cpu", "events/s", True, "SPEC INT2000 (CPU-bound)"),
    "xz": ("xz -9 of a fixed text", "s", False, "SPEC INT2000 (CPU-bound)"),
    "build": ("make -jN of a fixed C tree", "s", False, "Linux 2.4 build"),
    "dbench": ("dbench, 1 client", "MB/s", True, "dbench"),
}

# Figure 3's PostgreSQL rows (pgbench; the `pg` experiment) and its web row
# (nginx under wrk from the nested host; the `web` experiment).
PG_ROWS = {
    "pg_ro": ("pgbench select-only", "tps", True, "OSDB-IR"),
    "pg_tpcb": ("pgbench TPC-B-like", "tps", True, "OSDB-OLTP"),
}
WEB_ROWS = {
    "web": ("nginx, 70% static 16 KiB pages, 30% dynamic, wrk", "req/s", True, "SPECweb99"),
}
WEB_PORT = 8080

# How a command reaches PostgreSQL: natively the private cluster that
# pg_prepare started in the scratch directory (the nested host has no
# systemd), in a guest the image's own (systemd started it at boot).
PG_ENV = ("pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1); "
          "if [ -d pg/data ]; then export PGHOST=$PWD/pg; as_pg='runuser -u postgres --'; "
          "else as_pg='sudo -n -u postgres'; fi; ")


def pg_prepare(native, quick):
    scale = 1 if quick else 4
    start = ""
    if native:
        start = ("pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1); "
                 "mkdir -p pg && chown postgres pg && "
                 "runuser -u postgres -- $pgbin/initdb -D pg/data >/dev/null 2>&1 && "
                 "runuser -u postgres -- $pgbin/pg_ctl -D pg/data -l pg/log -w "
                 "-o \"-k $PWD/pg -c listen_addresses=''\" start >/dev/null && ")
    # A guest's PostgreSQL may still be starting (systemd, after SSH).
    wait = "for i in $(seq 300); do $as_pg $pgbin/pg_isready -q && break; sleep 1; done; "
    return (start + PG_ENV + wait + "($as_pg $pgbin/createdb bench 2>/dev/null || true) && "
            f"$as_pg $pgbin/pgbench -i -q -s {scale} bench 2>&1 | tail -n 1")


def pg_command(key, vcpus, quick, secs=None):
    secs = secs or (5 if quick else 20)
    mode = "-S" if key == "pg_ro" else ""
    return (PG_ENV + f"$as_pg $pgbin/pgbench {mode} -T {secs} -c {2 * vcpus} -j {vcpus} bench "
            "2>/dev/null | awk '/^tps/ {print \"value=\" $3}'")


PG_STOP = "pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -n 1); " \
    "[ ! -d pg/data ] || runuser -u postgres -- $pgbin/pg_ctl -D pg/data -m fast stop"


def dyn_port(port):
    """Where the dynamic backend of the nginx on `port` listens."""
    return port + 1000


def web_prepare(helper, port=WEB_PORT, workers="auto"):
    """A static site and an nginx of our own on `port` with `workers`
    worker processes, the same configuration everywhere (the image's own
    nginx stays as it is; the temporary directories in the current
    directory: the nested host's root is read-only). `/dyn` goes to
    `helper webdyn` (SPECweb99's dynamic GETs and POSTs: a page made per
    request, posts logged) over kept-alive connections."""
    dyn = dyn_port(port)
    probe = ("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d && printf \"GET /dyn HTTP/1.0\\r\\n\\r\\n\" >&3 "
             "&& head -n 1 <&3 | grep -q \" 200 \"' 2>/dev/null" % port)
    return ("s=; [ \"$(id -u)\" = 0 ] || s='sudo -n'; mkdir -p www && "
            "for i in $(seq 0 99); do head -c 12288 /dev/urandom | base64 -w 76 > www/p$i.html; done; "
            "chmod -R a+rX www; chmod a+x .; mkdir -p ngt; d=$PWD; "
            f"setsid {helper} webdyn {dyn} \"$d\" </dev/null >webdyn.log 2>&1 & echo $! > webdyn.pid; "
            f"printf 'worker_processes {workers}; pid %s/nginx.pid; error_log %s/nginx.err;\\n"
            "events { worker_connections 1024; }\\n"
            "http { access_log off; sendfile on; client_body_temp_path %s/ngt/body; "
            "proxy_temp_path %s/ngt/proxy; fastcgi_temp_path %s/ngt/fastcgi; "
            "uwsgi_temp_path %s/ngt/uwsgi; scgi_temp_path %s/ngt/scgi; "
            f"upstream dyn {{ server 127.0.0.1:{dyn}; keepalive 16; }} "
            "server { listen %s; root %s/www; location /dyn { proxy_pass http://dyn; "
            "proxy_http_version 1.1; proxy_set_header Connection \\\"\\\"; } } }\\n' "
            f"\"$d\" \"$d\" \"$d\" \"$d\" \"$d\" \"$d\" \"$d\" {port} \"$d\" > nginx.conf && "
            "$s /usr/sbin/nginx -c $d/nginx.conf -e $d/nginx.err && "
            # The backend answers through nginx before the run starts
            # (wrk would count nginx's 502s).
            f"for i in $(seq 50); do {probe} && break; sleep 0.2; done; {probe}")


def web_stop():
    return ("s=; [ \"$(id -u)\" = 0 ] || s='sudo -n'; "
            "[ ! -f nginx.pid ] || $s kill $(cat nginx.pid); "
            "[ ! -f webdyn.pid ] || kill $(cat webdyn.pid) 2>/dev/null; rm -f webdyn.pid")


# wrk's Lua script, SPECweb99's mix: 70% static GETs of the 100 pages,
# 25% dynamic GETs (a page id, a user's cookie), 5% dynamic POSTs.
WRK_SCRIPT = """request = function()
  local r = math.random(100)
  if r <= 70 then
    return wrk.format(nil, '/p' .. math.random(0, 99) .. '.html')
  elseif r <= 95 then
    return wrk.format('GET', '/dyn?id=' .. math.random(0, 9999), {Cookie = 'user=' .. math.random(0, 999)})
  end
  return wrk.format('POST', '/dyn', {['Content-Type'] = 'application/x-www-form-urlencoded'},
                    'user=' .. math.random(0, 999) .. '&item=' .. math.random(0, 99))
end
"""


def wrk_output(ip, port, threads, connections, secs, script, timeout, extra=()):
    """wrk (with `extra` options) and `script` against the nginx at
    ip:port; its output, once it printed a rate and no error answer."""
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{secs}s", *extra, "-s", script,
           f"http://{ip}:{port}/"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    # An error answer is fast: counted as served, it would flatter a
    # broken server (nginx's 502 when its backend is gone).
    if r.returncode != 0 or WRK_RATE.search(r.stdout) is None or "Non-2xx" in r.stdout:
        raise RuntimeError(f"wrk against {ip}:{port} failed ({r.returncode}): "
                           f"{r.stdout[-500:]}{r.stderr[-500:]}")
    return r.stdout


WRK_RATE = re.compile(r"Requests/sec:\s*([0-9.]+)")


def wrk(ip, port, threads, connections, secs, script, timeout):
    """wrk with `script` against the nginx at ip:port; its requests per
    second."""
    return float(WRK_RATE.search(wrk_output(ip, port, threads, connections, secs, script, timeout)).group(1))


# Tables 3-5 (lmbench-style, from `domus-guest osbench`).
#   key: (label, table)
OSBENCH_ROWS = {
    "null_call_us": ("null call (getppid)", 3),
    "null_read_us": ("null I/O: read 1 byte", 3),
    "null_write_us": ("null I/O: write 1 byte", 3),
    "stat_us": ("stat", 3),
    "open_close_us": ("open/close", 3),
    "select_100_us": ("select on 100 fds", 3),
    "sig_install_us": ("signal install", 3),
    "sig_handle_us": ("signal handle", 3),
    "fork_exit_us": ("fork + exit", 3),
    "fork_exec_us": ("fork + exec", 3),
    "fork_sh_us": ("fork + sh -c", 3),
    "ctx_2p_0k_us": ("2 processes, 0 KiB", 4),
    "ctx_2p_16k_us": ("2 processes, 16 KiB", 4),
    "ctx_2p_64k_us": ("2 processes, 64 KiB", 4),
    "ctx_8p_16k_us": ("8 processes, 16 KiB", 4),
    "ctx_8p_64k_us": ("8 processes, 64 KiB", 4),
    "ctx_16p_16k_us": ("16 processes, 16 KiB", 4),
    "ctx_16p_64k_us": ("16 processes, 64 KiB", 4),
    "file_create_0k_us": ("0 KiB file create", 5),
    "file_delete_0k_us": ("0 KiB file delete", 5),
    "file_create_10k_us": ("10 KiB file create", 5),
    "file_delete_10k_us": ("10 KiB file delete", 5),
    "mmap_us": ("mmap 4 MiB, touch, unmap", 5),
    "prot_fault_us": ("protection fault", 5),
    "page_fault_us": ("page fault", 5),
    "pipe_mbs": ("pipe bandwidth (MB/s)", 5),
    "unix_mbs": ("AF_UNIX bandwidth (MB/s)", 5),
}


def c_tree(path, files, funcs):
    """Writes a fixed C source tree (a seeded generator: the same tree
    every run) with a Makefile, as a tar file at `path`: the build
    workload's input, the same for every environment."""
    import io
    import tarfile
    rng = random.Random(2003)
    members = {}
    objs = []
    for i in range(files):
        body = [f"/* file {i} of the bench/paper build tree */", "#include <stdint.h>",
                "#include <string.h>", ""]
        for j in range(funcs):
            a, b, c = rng.randrange(3, 97), rng.randrange(1, 31), rng.randrange(2, 13)
            body += [
                f"uint64_t f{i}_{j}(const uint8_t *p, size_t n, uint64_t s) {{",
                "    uint64_t h = s ^ 0x9e3779b97f4a7c15ull;",
                "    for (size_t k = 0; k < n; k++) {",
                f"        h = (h ^ p[k]) * {a}u + (h >> {b});",
                f"        if ((h & {c}) == 0) h += k * {a + c}u; else h ^= h << {b % 7 + 1};",
                "    }",
                "    struct { uint64_t v[8]; } t;",
                "    memset(&t, 0, sizeof t);",
                f"    for (int r = 0; r < 8; r++) t.v[r] = h * (uint64_t)(r + {c});",
                "    return t.v[(h >> 3) & 7] + t.v[0];",
                "}",
                "",
            ]
        members[f"tree/f{i}.c"] = "\n".join(body)
        objs.append(f"f{i}.o")
    members["tree/main.c"] = ("#include <stdio.h>\nint main(void) { puts(\"built\"); return 0; }\n")
    objs.append("main.o")
    members["tree/Makefile"] = (
        "CFLAGS = -O2 -g -Wall\n"
        f"OBJS = {' '.join(objs)}\n"
        "prog: $(OBJS)\n\t$(CC) -o $@ $(OBJS)\n"
        "%.o: %.c\n\t$(CC) $(CFLAGS) -c -o $@ $<\n"
        "clean:\n\trm -f prog $(OBJS)\n")
    with tarfile.open(path, "w") as tar:
        for name, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))


def fig3_commands(vcpus, quick):
    """The Figure 3 rows' commands: key -> (prepare, run). `prepare` runs
    once per environment before the first trial; `run` prints the row's
    value as `value=X`."""
    secs = 3 if quick else 10
    # Sized for the nested host, whose CPU is emulated (tens of times
    # slower than this machine's): each row takes seconds to a minute there.
    lines = 100_000 if quick else 500_000
    return {
        "sysbench_cpu": (
            "true",
            f"sysbench cpu --threads={vcpus} --time={secs} run "
            "| awk '/events per second/ {print \"value=\" $4}'"),
        "xz": (
            f"seq 1 {lines} > xz.in",
            "bash -c 'TIMEFORMAT=%R; { time xz -9 -T1 -c xz.in > /dev/null; } 2>&1' "
            "| tail -n 1 | sed 's/^/value=/'"),
        "dbench": (
            "true",
            f"dbench -t {secs} -D . 1 2>&1 | awk '/^Throughput/ {{print \"value=\" $2}}'"),
        "build": (
            "rm -rf tree && tar xf tree.tar",
            f"make -s -C tree clean && bash -c 'TIMEFORMAT=%R; {{ time make -s -j{vcpus} -C tree "
            "> /dev/null; } 2>&1' | tail -n 1 | sed 's/^/value=/'"),
    }


# Table 6 (the paper's ttcp): TCP throughput with iperf3, both directions,
# at two MTUs. key: (label, mtu, reverse)
NET_ROWS = {
    "tx_1500": ("TCP transmit, MTU 1500 (Mbit/s)", 1500, False),
    "rx_1500": ("TCP receive, MTU 1500 (Mbit/s)", 1500, True),
    "tx_500": ("TCP transmit, MTU 500 (Mbit/s)", 500, False),
    "rx_500": ("TCP receive, MTU 500 (Mbit/s)", 500, True),
}


def net_command(server, mtu, reverse, quick):
    """iperf3 from the environment to `server` (the nested host; native:
    over loopback) with the environment's interface towards it at `mtu`
    (set back to what it was after); prints `value=Mbit/s` (receiver)."""
    secs = 3 if quick else 10
    return ("s=; [ \"$(id -u)\" = 0 ] || s='sudo -n'; "
            f"dev=$(ip -o route get {server} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'); "
            "old=$(cat /sys/class/net/$dev/mtu); "
            f"$s ip link set dev $dev mtu {mtu} && "
            f"iperf3 -f m -c {server} -t {secs} {'-R' if reverse else ''} "
            "| awk '/receiver/ {print \"value=\" $7}'; "
            "$s ip link set dev $dev mtu $old")


def tree_size(quick):
    return (4, 8) if quick else (12, 16)


def osbench_command(helper, quick):
    return f"{helper} osbench {1 if quick else 3}"


def parse(out):
    vals = {}
    for word in out.split():
        if "=" in word:
            k, v = word.split("=", 1)
            try:
                vals[k] = float(v)
            except ValueError:
                pass
    return vals


def value(out, what):
    """The `value=` a workload's command printed (parse's), or a
    RuntimeError naming `what` printed none, with the output's end."""
    v = parse(out).get("value")
    if v is None:
        raise RuntimeError(f"{what} printed no value: {out[-300:]!r}")
    return v
