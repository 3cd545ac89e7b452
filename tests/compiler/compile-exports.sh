#!/usr/bin/env bash
# Real exports: public PyTorch architectures built with random weights by
# their own libraries (torchvision, transformers, ultralytics) and exported
# by their own exporters (tests/models/exports/export_torch.py, in the venv
# of tests/models/exports/torch.txt), with onnxruntime references; each is
# compiled with rbln-compile into target/exports. tests/vm/exports.sh then
# runs them on the NPU.
#
# The exports are cached: target/exports is rebuilt only when the exporter
# or the venv's pins change (a stamp holds their hash).
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

OUT=$RBLN_ROOT/target/exports
COMPILE=$RBLN_ROOT/target/release/rbln-compile
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"
REQ=$RBLN_ROOT/tests/models/exports/torch.txt
EXPORTER=$RBLN_ROOT/tests/models/exports/export_torch.py
MODELS=(resnet50 mobilenet_v3_small efficientnet_b0 swin_v2_t maxvit_t deeplabv3 unet bert gpt2 llama roberta yolov8n)

fail() { log "FAIL: $*"; exit 1; }

stamp=$(hash_of "$REQ" "$EXPORTER")
if [[ $(cat "$OUT/.stamp" 2>/dev/null) != "$stamp" ]]; then
    PY=$("$RBLN_ROOT/scripts/setup-python.sh" "$REQ" | tail -n 1)
    rm -rf "$OUT"
    mkdir -p "$OUT"
    log "exporting ${#MODELS[@]} models with PyTorch"
    "$PY" "$EXPORTER" "$OUT" "${MODELS[@]}" 2>"$OUT/export.log" | tee "$OUT/models.txt" >&2 \
        || { tail -n 30 "$OUT/export.log" >&2; fail "the PyTorch exports failed (log: target/exports/export.log)"; }
    echo "$stamp" >"$OUT/.stamp"
else
    log "PyTorch exports up to date in $OUT"
fi

for m in "${MODELS[@]}"; do
    "$COMPILE" "$OUT/$m.onnx" -o "$OUT/$m.rbln" --json | tee "$OUT/$m.report.json" >&2 || fail "$m did not compile"
done
log "compiled ${#MODELS[@]} exported models in $OUT"
