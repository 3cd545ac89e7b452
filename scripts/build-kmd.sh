#!/usr/bin/env bash
# Build kmd/rbln.ko out of tree against the guest kernel, inside the sysroot
# (whose rustc is the one the kernel was built with). Kbuild's by-products
# next to the sources are covered by .gitignore.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

main() {
    local kdir log
    kdir=$("$RBLN_ROOT/scripts/build-kernel.sh")
    log "building kmd/rbln.ko"
    log=$RBLN_CACHE/kmd-build.log
    SYSROOT_BINDS="$kdir:/build" in_sysroot \
        make -s -C /build/src M=/rbln/kmd ARCH=x86_64 modules >"$log" 2>&1 \
        || { grep -v 'Failed to run rustfmt' "$log" >&2; die "kmd build failed"; }
    grep -v 'Failed to run rustfmt' "$log" >&2 || true
    log "built kmd/rbln.ko"
}

main "$@"
