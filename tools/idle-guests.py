#!/usr/bin/env python3
"""tools/idle-guests.py: N (default 8) idle Domus guests and N idle QEMU
guests side by side for SECS (default 540) seconds, with the kernel's
kvm_exit (reason shutdown) and kvm_inj_exception tracepoints on; says which
guests ended early. Logs, consoles and the trace go to OUT (default
target/idle-guests). A diagnostic for the triple faults in the README's known
issues; run it inside the nested host, from the repository root, after
tools/bench-io or tools/test have built Domus and the kit:

    N=8 SECS=420 tools/kvm-host python3 tools/idle-guests.py
"""
import os, subprocess, sys, time
N = int(os.environ.get("N", "8"))
SECS = int(os.environ.get("SECS", "540"))
REPO = os.getcwd()
DOMUS = REPO + "/target/release/domus"
k = dict(l.split("=", 1) for l in subprocess.run([DOMUS, "kit", "--print"], capture_output=True, text=True).stdout.split())
out = os.environ.get("OUT", REPO + "/target/idle-guests")
os.makedirs(out, exist_ok=True)
cl = "console=ttyS0 quiet panic=-1 -- while :; do sleep 1; done"
def ip(*a): subprocess.run(["ip", *a], capture_output=True)
ip("link", "add", "tfbr", "type", "bridge"); ip("link", "set", "tfbr", "up")
tr = "/sys/kernel/tracing"
if not os.path.exists(tr + "/events"):
    subprocess.run(["mount", "-t", "tracefs", "none", tr])
for ev, flt in [("kvm/kvm_exit", "exit_reason == 127"), ("kvm/kvm_inj_exception", None)]:
    try:
        if flt:
            open(f"{tr}/events/{ev}/filter", "w").write(flt)
        open(f"{tr}/events/{ev}/enable", "w").write("1")
    except OSError as e:
        print("trace:", ev, e, file=sys.stderr)
open(f"{tr}/trace", "w").write("")
procs = []
for i in range(N):
    for vmm in ("domus", "qemu"):
        tap = f"tf{vmm[0]}{i}"
        ip("tuntap", "add", "dev", tap, "mode", "tap"); ip("link", "set", tap, "master", "tfbr"); ip("link", "set", tap, "up")
        con = f"{out}/{vmm}{i}.console"
        if vmm == "domus":
            c = [DOMUS, "run", "--kernel", k["kernel"], "--initrd", k["initrd"], "--memory", "256M",
                 "--vcpus", "1", "--balloon", "--net", f"tap={tap}", "--console", f"file:{con}",
                 "--cmdline", cl, "--name", f"d{i}"]
        else:
            c = [os.environ.get("KVM_HOST_QEMU", "qemu-system-x86_64"), "-accel", "kvm", "-cpu", "host", "-M", "q35", "-m", "256",
                 "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                 "-serial", f"file:{con}", "-kernel", k["kernel"], "-initrd", k["initrd"], "-append", cl,
                 "-netdev", f"tap,id=n0,ifname={tap},script=no,downscript=no,vhost=off",
                 "-device", "virtio-net-pci,netdev=n0", "-device", "virtio-balloon-pci",
                 "-device", "virtio-rng-pci"]
        log = open(f"{out}/{vmm}{i}.log", "w")
        procs.append((f"{vmm}{i}", time.time(), subprocess.Popen(c, stdout=log, stderr=log, stdin=subprocess.DEVNULL)))
        time.sleep(2)
print(f"idle-guests: {len(procs)} guests started", file=sys.stderr, flush=True)
end = time.time() + SECS
ended = {}
while time.time() < end and len(ended) < len(procs):
    for name, t0, p in procs:
        if name not in ended and p.poll() is not None:
            ended[name] = (p.returncode, time.time() - t0)
            print(f"idle-guests: {name} ended, status {p.returncode}, after {time.time()-t0:.0f} s", file=sys.stderr, flush=True)
    time.sleep(2)
for name, t0, p in procs:
    if p.poll() is None:
        p.kill()
    p.wait()
subprocess.run(f"cp {tr}/trace {out}/trace.txt", shell=True)
for i in range(N):
    for vmm in ("domus", "qemu"):
        ip("link", "del", f"tf{vmm[0]}{i}")
ip("link", "del", "tfbr")
for n in ("domus", "qemu"):
    e = [x for x in ended if x.startswith(n)]
    print(f"idle-guests: {n}: {len(e)} of {N} ended early in {SECS} s: {sorted(e)}", flush=True)
