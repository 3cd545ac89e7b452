#!/usr/bin/env bash
# Build the guest kernel from the sysroot's linux-source package with the
# repo's config fragment. Cached by source version + fragments; prints the
# kernel build directory on stdout.
#
# KERNEL_FLAVOR=debug builds the debug kernel of `make test-debug` instead:
# guest-kernel-debug.config merged on top (KASAN, kmemleak, debug objects,
# allocation-failure injection), built with LLVM=1 (the kernel allows KASAN
# together with Rust only when compiled by clang). KERNEL_FLAVOR=bench
# builds the kernel of `make bench`: guest-kernel-bench.config merged on
# top (no lockdep, optimised for speed).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KERNEL_FLAVOR=${KERNEL_FLAVOR:-}
FRAGMENTS=$RBLN_ROOT/scripts/guest-kernel.config
MAKE_LLVM=
case $KERNEL_FLAVOR in
    "") ;;
    debug)
        FRAGMENTS="$FRAGMENTS $RBLN_ROOT/scripts/guest-kernel-debug.config"
        MAKE_LLVM=LLVM=1
        ;;
    bench) FRAGMENTS="$FRAGMENTS $RBLN_ROOT/scripts/guest-kernel-bench.config" ;;
    *) die "unknown KERNEL_FLAVOR '$KERNEL_FLAVOR' (empty, debug or bench)" ;;
esac

kernel_dir() {
    local root pkgver
    root=$(sysroot_dir)
    pkgver=$(grep "^linux-source-$KERNEL_LINE=" "$root/.pins" | cut -d= -f2)
    [[ -n $pkgver ]] || die "linux-source-$KERNEL_LINE is not in the sysroot"
    # shellcheck disable=SC2086 # the fragment list
    echo "$RBLN_CACHE/kernel-${pkgver//[:~+]/_}${KERNEL_FLAVOR:+-$KERNEL_FLAVOR}-$(hash_of $FRAGMENTS)"
}

# Runs inside the sysroot with the build directory at /build.
build_inside() {
    cd /build
    if [[ ! -f src/Makefile ]]; then
        rm -rf src
        mkdir src
        tar -xf /usr/src/linux-source-"$KERNEL_LINE".tar.xz -C src --strip-components=1
    fi
    cd src
    # shellcheck disable=SC2086 # MAKE_LLVM is empty or LLVM=1
    make -s ARCH=x86_64 $MAKE_LLVM tinyconfig
    # shellcheck disable=SC2086
    scripts/kconfig/merge_config.sh -m .config kernel/configs/kvm_guest.config $FRAGMENTS >/dev/null
    # shellcheck disable=SC2086
    make -s ARCH=x86_64 $MAKE_LLVM olddefconfig
    # shellcheck disable=SC2086
    make -s ARCH=x86_64 $MAKE_LLVM rustavailable
    # merge_config only warns about options Kconfig refused; refuse to build
    # a kernel that silently lacks one of them (or has one a fragment turns
    # off). A later fragment overrides an earlier one: each option is
    # checked as the last fragment that names it sets it.
    local missing
    # shellcheck disable=SC2086
    missing=$(cat $FRAGMENTS | grep -E '^CONFIG_|^# CONFIG_.* is not set' \
        | awk '{ name = ($1 == "#") ? $2 : substr($0, 1, index($0, "=") - 1); last[name] = $0; order[name] = NR }
               END { for (n in last) print order[n], last[n] }' | sort -n | cut -d' ' -f2- | while read -r opt; do
        case $opt in
            "# "*)
                local name=${opt#"# "}
                name=${name%" is not set"}
                ! grep -q "^$name=" .config || echo "$opt"
                ;;
            *) grep -qx "$opt" .config || echo "$opt" ;;
        esac
    done)
    [[ -z $missing ]] || { echo "config options not applied: $missing" >&2; exit 1; }
    # shellcheck disable=SC2086
    make -s ARCH=x86_64 $MAKE_LLVM -j"$(nproc)" bzImage modules
}

main() {
    local dir
    dir=$(kernel_dir)
    if [[ -f $dir/.complete ]]; then
        log "kernel ready: $dir"
        echo "$dir"
        return
    fi
    mkdir -p "$dir"
    log "building the guest kernel in $dir (about 10-15 min on 2 cores)"
    local inside=${FRAGMENTS//$RBLN_ROOT//rbln}
    SYSROOT_BINDS="$dir:/build" in_sysroot bash -c "KERNEL_LINE=$KERNEL_LINE; FRAGMENTS='$inside'; MAKE_LLVM='$MAKE_LLVM'; $(declare -f build_inside); build_inside" \
        >"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log" >&2; die "kernel build failed (log: $dir/build.log)"; }
    cp "$dir/src/arch/x86/boot/bzImage" "$dir/bzImage"
    touch "$dir/.complete"
    log "kernel built: $(grep -m1 'Linux/x86' "$dir/src/.config" | sed 's/^# //')"
    echo "$dir"
}

main "$@"
