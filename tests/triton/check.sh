#!/usr/bin/env bash
# Triton kernels (tests/triton/kernels.py: vector add, softmax, matmul,
# layer norm, flash-attention prefill, a tl.range loop) printed as TTIR by
# triton 3.9 on this CPU-only machine, in the venv of
# tests/triton/requirements.txt, into target/triton; then
# - rbln's TTIR parser reads every one of them and refuses the tl.range
#   loop naming its line, the lowering turns them into tile programs that
#   compute right on the host's tile engine, and a launch compiles to a
#   .rbln (compiler/tests/ttir.rs, its ignored tests);
# - the attention kernel becomes a custom operator (rbln.triton domain)
#   inside an ONNX model with built-in ops around it
#   (tests/triton/custom_op.py, in the onnxruntime venv, which also writes
#   onnxruntime's output of the same model with attention as built-in
#   ops); rbln-compile compiles it and refuses the broken variants.
#   tests/vm/triton.sh runs it on the NPU.
#
# The TTIR is cached in $RBLN_CACHE/ttir-HASH (HASH: kernels.py, the
# requirements file and python/rbln/_ttir.py): only the first run installs
# triton (about 30 s).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
source "$RBLN_ROOT/tests/compiler/lib.sh"

OUT=$RBLN_ROOT/target/triton
COMPILE=$RBLN_ROOT/target/release/rbln-compile
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"
CACHE=$(EXPORT_DEPS=$RBLN_ROOT/python/rbln/_ttir.py cached_exports ttir "$RBLN_ROOT/tests/triton/requirements.txt" "$RBLN_ROOT/tests/triton/kernels.py") || exit 1
rm -rf "$OUT"
mkdir -p "$OUT"
cp "$CACHE"/*.ttir "$OUT"/
RBLN_TTIR_DIR=$OUT cargo test --release --quiet -p rbln-compile --test ttir -- --ignored \
    || fail "the TTIR front end failed on what triton printed (target/triton)"
log "parsed, lowered and ran the TTIR of $(ls "$OUT" | wc -l) triton kernels in $OUT"

PY=$("$RBLN_ROOT/scripts/setup-python.sh" | tail -n 1)
"$PY" "$RBLN_ROOT/tests/triton/custom_op.py" "$OUT" "$OUT" || fail "custom_op.py failed"
"$COMPILE" "$OUT/attention-op.onnx" -o "$OUT/attention-op.rbln" --json | tee "$OUT/attention-op.report.json" >&2 \
    || fail "the ONNX model with the attention kernel did not compile"
grep -q '"TritonKernel":1' "$OUT/attention-op.report.json" || fail "attention-op.rbln has no TritonKernel op"
expect_error 1 "node 'attn' (attention): a rbln.triton node needs the attribute 'ttir'" "$OUT/attention-bad-no-ttir.onnx" -o "$OUT/bad.rbln"
expect_error 1 "node 'attn' (attention): needs the attribute 'grid'" "$OUT/attention-bad-no-grid.onnx" -o "$OUT/bad.rbln"
expect_error 1 "kernel argument scale (fp32): float_args has only 0 values" "$OUT/attention-bad-no-scale.onnx" -o "$OUT/bad.rbln"
expect_error 1 "op tt.dott is not supported by the NPU's tile engine" "$OUT/attention-bad-bad-ttir.onnx" -o "$OUT/bad.rbln"
[[ ! -e $OUT/bad.rbln ]] || fail "a refused compile left an output file"
log "compiled the attention custom operator model: $OUT/attention-op.rbln"
