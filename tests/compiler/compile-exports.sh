#!/usr/bin/env bash
# Real exports: public PyTorch architectures built with random weights by
# their own libraries (torchvision, transformers, ultralytics) and exported
# by their own exporters (tests/models/exports/export_torch.py, in the venv
# of tests/models/exports/torch.txt), with onnxruntime references; each is
# compiled with rbln-compile into target/exports. tests/vm/exports.sh then
# runs them on the NPU.
#
# The exports are cached in $RBLN_CACHE/exports-torch-HASH, HASH covering
# the exporter and the venv's pins (about 2 min to make, 0.6 GB), and
# hard-linked (or copied) into target/exports.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

OUT=$RBLN_ROOT/target/exports
COMPILE=$RBLN_ROOT/target/release/rbln-compile
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"
REQ=$RBLN_ROOT/tests/models/exports/torch.txt
EXPORTER=$RBLN_ROOT/tests/models/exports/export_torch.py
MODELS=(resnet50 mobilenet_v3_small efficientnet_b0 swin_v2_t maxvit_t deeplabv3 unet bert gpt2 llama roberta bart dinov2 detr yolov8n yolo11n)

fail() { log "FAIL: $*"; exit 1; }

CACHE=$RBLN_CACHE/exports-torch-$(hash_of "$REQ" "$EXPORTER")
if [[ ! -f $CACHE/.complete ]]; then
    PY=$("$RBLN_ROOT/scripts/setup-python.sh" "$REQ" | tail -n 1)
    exec 9>"$CACHE.lock"
    flock 9
    if [[ ! -f $CACHE/.complete ]]; then
        rm -rf "$CACHE"
        mkdir -p "$CACHE"
        log "exporting ${#MODELS[@]} models with PyTorch into $CACHE"
        "$PY" "$EXPORTER" "$CACHE" "${MODELS[@]}" 2>"$CACHE/export.log" | tee "$CACHE/models.txt" >&2 \
            || { tail -n 30 "$CACHE/export.log" >&2; fail "the PyTorch exports failed (log: $CACHE/export.log)"; }
        touch "$CACHE/.complete"
    fi
else
    log "PyTorch exports cached in $CACHE"
fi
rm -rf "$OUT"
mkdir -p "$OUT"
cp -l "$CACHE"/* "$OUT"/ 2>/dev/null || cp "$CACHE"/* "$OUT"/

for m in "${MODELS[@]}"; do
    "$COMPILE" "$OUT/$m.onnx" -o "$OUT/$m.rbln" --json | tee "$OUT/$m.report.json" >&2 || fail "$m did not compile"
done
log "compiled ${#MODELS[@]} exported models in $OUT"
