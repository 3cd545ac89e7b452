#!/usr/bin/env bash
# Keras models converted to float32 TFLite, with ai-edge-litert references
# (tests/models/exports/export_keras.py, in the venv of
# tests/models/exports/tensorflow.txt), compiled with rbln-compile into
# target/tflite; the models the compiler must refuse are refused with the
# promised messages. tests/vm/tflite.sh then runs the compiled models on the
# NPU.
#
# The exports are cached in $RBLN_CACHE/tflite-HASH (HASH: the exporter and
# the requirements file), so only the first run pays for TensorFlow (about
# a minute); later runs copy them.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

OUT=$RBLN_ROOT/target/tflite
COMPILE=$RBLN_ROOT/target/release/rbln-compile
EXPORTER=$RBLN_ROOT/tests/models/exports/export_keras.py
REQ=$RBLN_ROOT/tests/models/exports/tensorflow.txt
MODELS="keras-cnn tf-ops keras-cnn-fp16 mobilenetv2 deeplabv3plus keras-cnn-int8 mobilenetv2-int8"
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"

source "$RBLN_ROOT/tests/compiler/lib.sh"

CACHE=$(cached_exports tflite "$REQ" "$EXPORTER") || exit 1
rm -rf "$OUT"
mkdir -p "$OUT"
cp "$CACHE"/*.tflite "$CACHE"/*.npy "$CACHE"/*.ops.txt "$CACHE"/*.step* "$OUT"/

for m in $MODELS; do
    "$COMPILE" "$OUT/$m.tflite" -o "$OUT/$m.rbln" --json | tee "$OUT/$m.report.json" >&2 || fail "$m did not compile"
    grep -q '"format":"tflite"' "$OUT/$m.report.json" || fail "$m: the report does not say tflite"
done
# Fully quantised models: the convolutions and fully connected layers on
# the int8 kernels (keras-cnn-int8: its 8 CONV_2D, 2 DEPTHWISE_CONV_2D and
# 3 of its 4 FULLY_CONNECTED; the one with keep_num_dims, a batched MatMul
# plus Add, stays a float island, as does TRANSPOSE_CONV).
for m in keras-cnn-int8:13 mobilenetv2-int8:53; do
    # The first: the model's (its entry points repeat it).
    n=$(grep -o '"int8_ops":[0-9]*' "$OUT/${m%%:*}.report.json" | head -1 | cut -d: -f2)
    [[ $n == "${m##*:}" ]] || fail "${m%%:*}: $n ops on the int8 kernels, ${m##*:} expected"
done

head -c 3000 "$OUT/keras-cnn.tflite" >"$OUT/truncated.tflite"
expect_error 1 "not a valid TFLite model: the flatbuffer does not verify" "$OUT/truncated.tflite" -o "$OUT/truncated.rbln"
# Not a flatbuffer at all, named .tflite: the TFLite reader's error.
head -c 100 "$OUT/keras-cnn.input.npy" >"$OUT/garbage.tflite"
expect_error 1 "not a valid TFLite model: no \"TFL3\" file identifier" "$OUT/garbage.tflite"
expect_error 1 "(TOPK_V2): operator TOPK_V2 is not supported by rbln-compile (supported: ABS, ADD," \
    "$OUT/unsupported-op.tflite" -o "$OUT/unsupported.rbln"
expect_error 1 "(QUANTIZE): tensor 'serving_default_x:0_int16' is int16 (quantized): rbln-compile takes int8 and uint8 tensors" "$OUT/int16.tflite" -o "$OUT/int16.rbln"
[[ ! -e $OUT/unsupported.rbln && ! -e $OUT/int16.rbln && ! -e $OUT/truncated.rbln ]] || fail "a failed compile left an output file"
log "compiled TFLite models in $OUT"
