#!/bin/sh
# Container entrypoint: the node's kernel is unknown at build time, so link
# the image's Debian headers for it now (BCC compiles against them; the
# probes never read kernel structs by header layout, so a version mismatch
# is harmless), mount tracefs if needed, then run otelbpf.
set -e
kdir="/lib/modules/$(uname -r)"
if [ ! -e "$kdir/build" ]; then
    mkdir -p "$kdir"
    ln -sfn "$(ls -d /usr/src/linux-headers-*-"$(dpkg --print-architecture)" | tail -n 1)" "$kdir/build"
    ln -sfn "$(ls -d /usr/src/linux-headers-*-common | tail -n 1)" "$kdir/source"
fi
mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing || true
exec otelbpf "$@"
