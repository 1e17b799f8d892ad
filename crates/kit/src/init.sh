#!/bin/sh
# /init of the Domus guest kit. Runs every argument the kernel passes to init
# (everything after " -- " on the kernel command line) as one shell command,
# prints its exit status and powers off; with no arguments, gives a shell.
# With root=DEV on the kernel command line, the initramfs loads the modules,
# mounts DEV (read-write unless "ro" is given) and switches to it; the same
# script then runs there (marked by /etc/domus/on-root).
# domus.cmd=BASE64 on the kernel command line is a command too long for
# init's arguments (Linux passes at most 32): it replaces them.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin HOME=/root
mounted() { grep -q "^[^ ]* $1 " /proc/mounts 2>/dev/null; }
mounted /proc || mount -t proc proc /proc
if [ ! -e /etc/domus/on-root ]; then
    echo "domus-init: start"
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev 2>/dev/null
    for m in $(cat /etc/domus/modules); do
        insmod "/lib/modules/$m" 2>/dev/null || echo "domus-init: cannot load $m"
    done
    root=
    mode=rw
    for w in $(cat /proc/cmdline); do
        case "$w" in
            root=*) root=${w#root=} ;;
            ro) mode=ro ;;
            --) break ;;
        esac
    done
    if [ -n "$root" ]; then
        i=0
        while [ ! -b "$root" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        if mount -t ext4 -o "$mode" "$root" /newroot; then
            for d in proc sys dev; do mount --move /$d /newroot/$d; done
            exec switch_root /newroot /init "$@"
        fi
        echo "domus-init: cannot mount $root; staying on the initramfs"
    fi
else
    echo "domus-init: on $(sed -n 's|^\([^ ]*\) / .*|\1|p' /proc/mounts | tail -1)"
fi
cmd64=$(sed -n 's/.*domus\.cmd=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ -n "$cmd64" ]; then
    set -- "$(echo "$cmd64" | base64 -d)"
fi
mounted /sys || mount -t sysfs sysfs /sys
mounted /dev || mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
hostname domus
ip link set lo up 2>/dev/null
# The ACPI power button (domus shutdown/reboot) runs /etc/acpi/PWRF/00000080.
acpid -c /etc/acpi -l /run/acpid.log -p /run/acpid.pid 2>/dev/null
if [ $# -gt 0 ]; then
    sh -c "$*"
    status=$?
    echo "domus-init: exit status $status"
else
    echo "domus-init: no command given; starting a shell (poweroff -f ends the domain)"
    setsid cttyhack sh -l
fi
sync
poweroff -f
