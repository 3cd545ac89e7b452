#!/usr/bin/env bash
# Build kmd/rbln.ko out of tree against the guest kernel, inside the sysroot
# (whose rustc is the one the kernel was built with). Kbuild's by-products
# next to the sources are covered by .gitignore.
#
# KERNEL_FLAVOR=debug or bench builds it against that kernel instead
# (debug: LLVM=1, like that kernel), in a copy of the sources under
# target/kmd-FLAVOR (the module's #[path] includes of hw/ and uapi/ keep
# their relative layout), so that the normal build is left alone:
# target/kmd-FLAVOR/kmd/rbln.ko. A module runs only on the kernel it was
# built against (lockdep alone changes the layout of every lock).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

main() {
    local kdir log src=kmd llvm=
    kdir=$("$RBLN_ROOT/scripts/build-kernel.sh")
    local flavor=${KERNEL_FLAVOR:-}
    if [[ -n $flavor ]]; then
        local out=$RBLN_ROOT/target/kmd-$flavor
        mkdir -p "$out/kmd" "$out/hw/src" "$out/uapi/src"
        cp "$RBLN_ROOT"/kmd/*.rs "$RBLN_ROOT/kmd/Kbuild" "$out/kmd/"
        cp -r "$RBLN_ROOT"/hw/src/. "$out/hw/src/"
        cp -r "$RBLN_ROOT"/uapi/src/. "$out/uapi/src/"
        src=target/kmd-$flavor/kmd
        [[ $flavor != debug ]] || llvm=LLVM=1
    fi
    log "building $src/rbln.ko"
    log=$RBLN_CACHE/kmd-build${flavor:+-$flavor}.log
    SYSROOT_BINDS="$kdir:/build" in_sysroot \
        make -s -C /build/src M="/rbln/$src" ARCH=x86_64 $llvm modules >"$log" 2>&1 \
        || { grep -v 'Failed to run rustfmt' "$log" >&2; die "kmd build failed"; }
    grep -v 'Failed to run rustfmt' "$log" >&2 || true
    log "built $src/rbln.ko"
}

main "$@"
