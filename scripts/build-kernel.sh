#!/usr/bin/env bash
# Build the guest kernel from the sysroot's linux-source package with the
# repo's config fragment. Cached by source version + fragment + script hash;
# prints the kernel build directory on stdout.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FRAGMENT=$RBLN_ROOT/scripts/guest-kernel.config

kernel_dir() {
    local root pkgver
    root=$(sysroot_dir)
    pkgver=$(grep "^linux-source-$KERNEL_LINE=" "$root/.pins" | cut -d= -f2)
    [[ -n $pkgver ]] || die "linux-source-$KERNEL_LINE is not in the sysroot"
    echo "$RBLN_CACHE/kernel-${pkgver//[:~+]/_}-$(hash_of "$FRAGMENT")"
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
    make -s ARCH=x86_64 tinyconfig
    scripts/kconfig/merge_config.sh -m .config kernel/configs/kvm_guest.config /rbln/scripts/guest-kernel.config >/dev/null
    make -s ARCH=x86_64 olddefconfig
    make -s ARCH=x86_64 rustavailable
    # merge_config only warns about options Kconfig refused; refuse to build
    # a kernel that silently lacks one of them.
    local missing
    missing=$(grep '^CONFIG_' /rbln/scripts/guest-kernel.config | while read -r opt; do
        grep -qx "$opt" .config || echo "$opt"
    done)
    [[ -z $missing ]] || { echo "config options not applied: $missing" >&2; exit 1; }
    make -s ARCH=x86_64 -j"$(nproc)" bzImage modules
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
    SYSROOT_BINDS="$dir:/build" in_sysroot bash -c "KERNEL_LINE=$KERNEL_LINE; $(declare -f build_inside); build_inside" \
        >"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log" >&2; die "kernel build failed (log: $dir/build.log)"; }
    cp "$dir/src/arch/x86/boot/bzImage" "$dir/bzImage"
    touch "$dir/.complete"
    log "kernel built: $(grep -m1 'Linux/x86' "$dir/src/.config" | sed 's/^# //')"
    echo "$dir"
}

main "$@"
