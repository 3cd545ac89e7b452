#!/usr/bin/env bash
# Build the TCG profiling plugin (tbprof.c) into target/guest-profile/ with
# the host's C compiler; prints its path as QEMU sees it (the repo is /rbln
# where scripts/vm.sh runs QEMU). See README.md, "Debugging".
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
out=$RBLN_ROOT/target/guest-profile
mkdir -p "$out"
cc -O2 -shared -fPIC -fvisibility=hidden -pthread -o "$out/tbprof.so" "$RBLN_ROOT/scripts/guest-profile/tbprof.c" \
    || die "cannot build the plugin"
echo "/rbln/target/guest-profile/tbprof.so"
