#!/usr/bin/env bash
# Real exports: public PyTorch architectures built with random weights by
# their own libraries (torchvision, transformers, ultralytics) and exported
# by their own exporters (tests/models/exports/export_torch.py, in the venv
# of tests/models/exports/torch.txt), with onnxruntime references; each is
# compiled with rbln-compile into target/exports. tests/vm/exports.sh then
# runs them on the NPU.
#
# The exports are cached in $RBLN_CACHE/exports-torch-HASH, HASH covering
# the exporter and the venv's pins (2-3 min to make, 0.85 GB), and
# hard-linked (or copied) into target/exports.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

OUT=$RBLN_ROOT/target/exports
COMPILE=$RBLN_ROOT/target/release/rbln-compile
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"
REQ=$RBLN_ROOT/tests/models/exports/torch.txt
EXPORTER=$RBLN_ROOT/tests/models/exports/export_torch.py
MODELS=(resnet50 mobilenet_v3_small efficientnet_b0 swin_v2_t maxvit_t googlenet densenet121 convnext_tiny regnet_y_400mf shufflenet_v2 mc3_18 raft_small deeplabv3 unet unet3d lstm_tagger crnn bert gpt2 llama roberta bart dinov2 detr t5_encoder qwen2 wav2vec2 segformer yolov8n yolo11n)

source "$RBLN_ROOT/tests/compiler/lib.sh"

CACHE=$(cached_exports exports-torch "$REQ" "$EXPORTER" "${MODELS[@]}") || exit 1
rm -rf "$OUT"
mkdir -p "$OUT"
cp -l "$CACHE"/* "$OUT"/ 2>/dev/null || cp "$CACHE"/* "$OUT"/

for m in "${MODELS[@]}"; do
    "$COMPILE" "$OUT/$m.onnx" -o "$OUT/$m.rbln" --json | tee "$OUT/$m.report.json" >&2 || fail "$m did not compile"
done
log "compiled ${#MODELS[@]} exported models in $OUT"

# GPT-2 and a Llama-style model as one .rbln each: a decode step and
# prefills at two prompt lengths, plus a batched decode step and slot
# prefills for continuous batching, as entry points over one copy of the
# weights, with transformers' greedy tokens
# (tests/models/exports/export_decoder.py); tests/vm/decoder.sh and
# python/tests/test_decoder.py generate with them on the NPU.
DEC=$(EXPORT_DEPS=$EXPORTER cached_exports decoder-torch "$REQ" "$RBLN_ROOT/tests/models/exports/export_decoder.py") || exit 1
for d in gpt2 llama; do
    for f in "$DEC/$d"-*; do
        cp -lf "$f" "$OUT/" 2>/dev/null || cp -f "$f" "$OUT/"
    done
    entries=(--entry "decode=$OUT/$d-decode.onnx")
    for p in 4 8; do entries+=(--entry "prefill_$p=$OUT/$d-prefill-$p.onnx"); done
    entries+=(--entry "decode_batch=$OUT/$d-decode-batch.onnx")
    for p in 4 8; do entries+=(--entry "prefill_slot_$p=$OUT/$d-prefill-slot-$p.onnx"); done
    "$COMPILE" "${entries[@]}" -o "$OUT/$d-decoder.rbln" --json | tee "$OUT/$d-decoder.report.json" >&2 || fail "$d-decoder did not compile"
done
log "compiled the GPT-2 and Llama decoders (six entry points each) in $OUT"
