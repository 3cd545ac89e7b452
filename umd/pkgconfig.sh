#!/usr/bin/env bash
# pkgconfig.sh [LIBDIR [OUTDIR]]: write rbln_umd.pc for the librbln_umd that
# cargo built in this repo (default LIBDIR: target/release, where
# `cargo build --release` puts librbln_umd.so and .a), with the header
# directory umd/include, into OUTDIR (default LIBDIR/pkgconfig), and print
# OUTDIR. Then:
#   PKG_CONFIG_PATH=$(umd/pkgconfig.sh) pkg-config --cflags --libs rbln_umd
set -euo pipefail
umd=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$umd")
libdir=${1:-$root/target/release}
out=${2:-$libdir/pkgconfig}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
mkdir -p "$out"
sed -e "s|@PREFIX@|$root|" -e "s|@LIBDIR@|$libdir|" -e "s|@INCLUDEDIR@|$umd/include|" -e "s|@VERSION@|${version:-0.0.0}|" \
    "$umd/rbln_umd.pc.in" >"$out/rbln_umd.pc.tmp"
mv "$out/rbln_umd.pc.tmp" "$out/rbln_umd.pc"
echo "$out"
