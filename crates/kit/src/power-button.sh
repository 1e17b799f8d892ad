#!/bin/sh
# /etc/acpi/PWRF/00000080 of the Domus guest kit: busybox acpid runs it when
# the domain's ACPI power button is pressed (domus shutdown, domus reboot).
# A clean stop: every process gets SIGTERM, then SIGKILL, the file systems
# are written out and the root remounted read-only, and the domain powers off.
echo "domus-init: power button pressed; shutting down" >/dev/console
kill -TERM -1 2>/dev/null
sleep 1
kill -KILL -1 2>/dev/null
sync
mount -o remount,ro / 2>/dev/null
echo "domus-init: powering off" >/dev/console
poweroff -f
