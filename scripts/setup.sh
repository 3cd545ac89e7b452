#!/usr/bin/env bash
# Everything the VM needs, built once and cached: the sysroot, the guest
# kernel and the initramfs. Safe to run any number of times.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Host tools the scripts and builds use, with the Debian package of each.
# The machine image normally has them all; a missing one is installed
# (this is the only change the project makes outside the repo and cache).
HOST_TOOLS="cargo: gcc:gcc make:make pkg-config:pkg-config unshare:util-linux flock:util-linux
chroot:coreutils timeout:coreutils sha256sum:coreutils awk:mawk gzip:gzip
dpkg:dpkg apt-get:apt"

ensure_host_tools() {
    local missing=() pair cmd pkg
    for pair in $HOST_TOOLS; do
        cmd=${pair%%:*}; pkg=${pair#*:}
        command -v "$cmd" >/dev/null && continue
        [[ -n $pkg ]] || die "$cmd is missing and cannot be installed by these scripts (install the Rust toolchain)"
        missing+=("$pkg")
    done
    ((${#missing[@]} == 0)) && return
    log "installing missing host tools: ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

ensure_host_tools
"$RBLN_ROOT/scripts/setup-sysroot.sh"
"$RBLN_ROOT/scripts/build-kernel.sh" >/dev/null
"$RBLN_ROOT/scripts/build-initramfs.sh" >/dev/null
# onnx/onnxruntime for the compiler tests (tests/models).
"$RBLN_ROOT/scripts/setup-python.sh" >/dev/null
