#!/usr/bin/env bash
# Pack the guest initramfs: static busybox from the sysroot, scripts/guest-init.sh
# as /init, and the host's glibc runtime so that binaries built by the host's
# cargo and gcc run unchanged in the guest. Cached by content; prints its path.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The shared libraries host-built Rust binaries and C programs need.
HOST_LIBS="/lib64/ld-linux-x86-64.so.2
/lib/x86_64-linux-gnu/libc.so.6
/lib/x86_64-linux-gnu/libm.so.6
/lib/x86_64-linux-gnu/libgcc_s.so.1
/lib/x86_64-linux-gnu/libpthread.so.0
/lib/x86_64-linux-gnu/libdl.so.2
/lib/x86_64-linux-gnu/librt.so.1"

main() {
    local root key out stage
    root=$(sysroot_dir)
    key=$(hash_of "$RBLN_ROOT/scripts/guest-init.sh" "$0" "$(sha256sum $HOST_LIBS "$root/bin/busybox")")
    out=$RBLN_CACHE/initramfs-$key.cpio.gz
    if [[ -f $out ]]; then
        log "initramfs ready: $out"
        echo "$out"
        return
    fi
    log "packing the guest initramfs"
    stage=$(mktemp -d "$RBLN_CACHE/initramfs-stage.XXXXXX")
    mkdir -p "$stage"/{bin,dev,proc,sys,tmp,root,rbln,run/rbln,etc,lib64,lib/x86_64-linux-gnu}
    cp "$root/bin/busybox" "$stage/bin/busybox"
    install -m 0755 "$RBLN_ROOT/scripts/guest-init.sh" "$stage/init"
    local lib
    for lib in $HOST_LIBS; do
        [[ -e $lib ]] || die "host library $lib is missing"
        cp -L "$lib" "$stage$lib"
    done
    # cpio is only in the sysroot (the host does not have it).
    SYSROOT_BINDS="$stage:/stage" in_sysroot sh -c \
        'cd /stage && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0' | gzip -9 >"$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$stage"
    log "initramfs packed: $out ($(du -h "$out" | cut -f1))"
    echo "$out"
}

main "$@"
