#!/usr/bin/env bash
# Quantised models as onnxruntime's quantizer writes them (QDQ and
# QOperator; tests/models/gen_int8.py, in the venv of scripts/setup-python.sh),
# compiled with rbln-compile into target/int8: the quantised Conv and GEMM
# must run on the int8 kernels (the report counts them). Malformed
# quantisation parameters must be refused. tests/vm/int8.sh then runs the
# models on the NPU against onnxruntime.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

OUT=$RBLN_ROOT/target/int8
COMPILE=$RBLN_ROOT/target/release/rbln-compile
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"

PY=$("$RBLN_ROOT/scripts/setup-python.sh" | tail -n 1)
rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" "$RBLN_ROOT/tests/models/gen_int8.py" "$OUT" 2> >(grep -v "^WARNING:root:\|Please consider to run pre-processing" >&2)

source "$RBLN_ROOT/tests/compiler/lib.sh"

# model, int8 Conv, int8 GEMM, int8 Add/Mul (QBINARY), int8 MaxPool, Conv
# with weights in tiles expected (all but the stem of a ResNet;
# MobileNetV2's 1×1 convolutions over multiples of 64 channels)
while read -r m conv gemm elt mp tiles; do
    "$COMPILE" "$OUT/$m.onnx" -o "$OUT/$m.rbln" >"$OUT/$m.report.txt" || fail "$m did not compile"
    cat "$OUT/$m.report.txt" >&2
    grep -q "int8: $conv Conv and $gemm GEMM on integer kernels (.*, $tiles in tiles), $elt Add/Mul and $mp MaxPool on int8 values" "$OUT/$m.report.txt" \
        || fail "$m: expected $conv Conv ($tiles in tiles) and $gemm GEMM on int8 kernels, $elt Add/Mul and $mp MaxPool on int8 values"
done <<'LIST'
resnet18-int8 20 1 8 1 19
resnet18-int8-pt 20 1 8 1 19
resnet18-int8-s8 20 1 8 1 19
mobilenetv2-int8 52 1 10 0 18
transformer-int8 0 7 3 0 0
resnet18-int8-qop 20 1 8 1 19
transformer-int8-qop 0 7 3 0 0
LIST

# Calibration data for rbln-quantize (tests/vm/quantize.sh).
"$PY" "$RBLN_ROOT/tests/models/gen_int8.py" --calibration "$OUT"
"$PY" "$RBLN_ROOT/tests/models/gen_int8.py" --bad "$OUT"
expect_error 1 "zero point 300 is outside the range of u8" "$OUT/bad-zero.onnx" -o "$OUT/bad.rbln"
expect_error 1 "scale -0.5 is not a finite positive number" "$OUT/bad-scale.onnx" -o "$OUT/bad.rbln"
expect_error 1 "3 scales do not match axis 1 of the input's shape [1, 4, 8, 8]" "$OUT/bad-axis.onnx" -o "$OUT/bad.rbln"
expect_error 1 "blocked quantization (block_size) is not supported" "$OUT/bad-block.onnx" -o "$OUT/bad.rbln"
[[ ! -e $OUT/bad.rbln ]] || fail "a failed compile left an output file"
log "compiled int8 models in $OUT"
