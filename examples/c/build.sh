#!/usr/bin/env bash
# examples/c/build.sh: build the C examples against librbln_umd through
# pkg-config. Builds the library first (cargo build --release -p rbln-umd;
# skip with RBLN_SKIP_CARGO=1 when the workspace was just built), writes
# target/release/pkgconfig/rbln_umd.pc (umd/pkgconfig.sh) and puts the
# binaries in target/c-examples/ (gemm: dynamic, rpath to target/release;
# gemm-static: librbln_umd.a linked in). Host-built; they run in the guest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
if [[ ${RBLN_SKIP_CARGO:-0} != 1 ]]; then
    cargo build --release -p rbln-umd --quiet
fi
pcdir=$("$root/umd/pkgconfig.sh")
export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
make -s -C "$root/examples/c" OUT="$root/target/c-examples"
echo "built: target/c-examples/gemm target/c-examples/gemm-static" >&2
