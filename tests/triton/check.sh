#!/usr/bin/env bash
# Triton kernels (tests/triton/kernels.py: vector add, softmax, matmul,
# layer norm, flash-attention prefill, a tl.range loop) printed as TTIR by
# triton 3.9 on this CPU-only machine, in the venv of
# tests/triton/requirements.txt, into target/triton; then rbln's TTIR
# parser reads every one of them (compiler/tests/ttir.rs, its ignored
# tests) and refuses the tl.range loop naming its line.
#
# The TTIR is cached in $RBLN_CACHE/ttir-HASH (HASH: kernels.py and the
# requirements file): only the first run installs triton (about 30 s).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$RBLN_ROOT/tests/compiler/lib.sh"

OUT=$RBLN_ROOT/target/triton
CACHE=$(EXPORT_DEPS=$RBLN_ROOT/python/rbln/_ttir.py cached_exports ttir "$RBLN_ROOT/tests/triton/requirements.txt" "$RBLN_ROOT/tests/triton/kernels.py") || exit 1
rm -rf "$OUT"
mkdir -p "$OUT"
cp "$CACHE"/*.ttir "$OUT"/
RBLN_TTIR_DIR=$OUT cargo test --release --quiet -p rbln-compile --test ttir -- --ignored \
    || fail "the TTIR parser refused what triton printed (target/triton)"
log "parsed the TTIR of $(ls "$OUT" | wc -l) triton kernels in $OUT"
