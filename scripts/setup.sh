#!/usr/bin/env bash
# Everything the VM needs, built once and cached: the sysroot, the guest
# kernel and the initramfs. Safe to run any number of times.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$RBLN_ROOT/scripts/setup-sysroot.sh"
"$RBLN_ROOT/scripts/build-kernel.sh" >/dev/null
"$RBLN_ROOT/scripts/build-initramfs.sh" >/dev/null
