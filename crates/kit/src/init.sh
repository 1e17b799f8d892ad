#!/bin/sh
# /init of the Domus guest kit. Runs every argument the kernel passes to init
# (everything after " -- " on the kernel command line) as one shell command,
# prints its exit status and powers off; with no arguments, gives a shell.
echo "domus-init: start"
export PATH=/sbin:/bin:/usr/sbin:/usr/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
for m in $(cat /etc/domus/modules); do
    insmod "/lib/modules/$m" 2>/dev/null || echo "domus-init: cannot load $m"
done
hostname domus
ip link set lo up 2>/dev/null
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
