#!/usr/bin/env bash
# chroot-run.sh ROOT CMD...: bind-mount the pseudo file systems, the repo and
# $SYSROOT_BINDS into ROOT and run CMD there. Meant to be called by
# in_sysroot (scripts/lib.sh) inside a private mount namespace: the mounts
# are never visible outside that namespace and vanish when it ends.
set -euo pipefail
root=$1; shift

bind() { # bind HOSTPATH PATH-IN-ROOT
    mkdir -p "$root$2"
    mount --rbind "$1" "$root$2"
}

bind /proc /proc
bind /sys /sys
bind /dev /dev
mount -t tmpfs tmpfs "$root/tmp"
bind "$RBLN_ROOT" /rbln
for pair in ${SYSROOT_BINDS:-}; do
    bind "${pair%%:*}" "${pair#*:}"
done
# Name resolution for apt inside the sysroot.
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

exec chroot "$root" /usr/bin/env -i \
    HOME=/root TERM="${TERM:-dumb}" LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive \
    "$@"
