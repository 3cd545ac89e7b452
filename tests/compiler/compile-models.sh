#!/usr/bin/env bash
# Build the ONNX test models with their onnxruntime references
# (tests/models/gen_models.py, in the venv of scripts/setup-python.sh),
# compile each with rbln-compile into target/onnx, and check that the models
# the compiler must refuse are refused with the promised messages.
# tests/vm/compiler.sh then runs the compiled models on the NPU.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

OUT=$RBLN_ROOT/target/onnx
COMPILE=$RBLN_ROOT/target/release/rbln-compile
[[ -x $COMPILE ]] || die "build rbln-compile first (cargo build --release)"

PY=$("$RBLN_ROOT/scripts/setup-python.sh" | tail -n 1)
rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" "$RBLN_ROOT/tests/models/gen_models.py" "$OUT" >&2

source "$RBLN_ROOT/tests/compiler/lib.sh"

for m in resnet mobilenet transformer ops gelu20 ops2 ops3 legacy resnet18 mobilenetv2 encoder4 bert-ids fold-ops resize convtranspose norm-space einsum masks dilated conv3d recurrent activations topk pads rounding sampling; do
    "$COMPILE" "$OUT/$m.onnx" -o "$OUT/$m.rbln" --json | tee "$OUT/$m.report.json" >&2 || fail "$m did not compile"
done
# Token ids with one out of the embedding's range (100 rows): the runtime
# must refuse them naming the input (tests/vm/compiler.sh).
"$PY" -c "import numpy as np, sys; a = np.load(sys.argv[1]); a[1, 3] = 100; np.save(sys.argv[2], a)" \
    "$OUT/bert-ids.input0.npy" "$OUT/bert-ids.bad-ids.npy"
"$COMPILE" "$OUT/dynamic-batch.onnx" -o "$OUT/dynamic-batch.rbln" --input-shape x=3x8 >&2 \
    || fail "dynamic-batch did not compile with --input-shape"

expect_error 1 "node 'random1' (RandomUniformLike): op type 'RandomUniformLike' is not supported by rbln-compile" \
    "$OUT/unsupported-op.onnx" -o "$OUT/unsupported.rbln"
expect_error 1 "input 'x' has a dynamic dimension 'batch' (axis 0); give static shapes with --input-shape x=" \
    "$OUT/dynamic-batch.onnx" -o "$OUT/dyn.rbln"
expect_error 2 "axis 1 is fixed to 8 in the model, 9 given" "$OUT/dynamic-batch.onnx" --input-shape x=3x9
expect_error 2 "'y' is not an input of the model (inputs: x)" "$OUT/dynamic-batch.onnx" --input-shape y=3x8
head -c 300 "$OUT/resnet.onnx" >"$OUT/truncated.onnx"
expect_error 1 "not an ONNX model: protobuf decoding failed" "$OUT/truncated.onnx"
[[ ! -e $OUT/unsupported.rbln && ! -e $OUT/dyn.rbln ]] || fail "a failed compile left an output file"
log "compiled models in $OUT"
