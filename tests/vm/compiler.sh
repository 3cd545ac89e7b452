# ONNX models compiled by rbln-compile (tests/compiler/compile-models.sh,
# run on the host first) run on the NPU through rbln-run and match
# onnxruntime's outputs: |got - want| <= 1e-4 * (1 + |want|).
. tests/vm/lib.sh
o=target/onnx

check "compiled models were made on the host" test -f $o/resnet.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
for m in resnet mobilenet transformer ops gelu20 ops2 ops3 legacy resnet18 mobilenetv2 encoder4 fold-ops resize convtranspose norm-space einsum dilated conv3d recurrent activations topk pads rounding sampling; do
    check "$m: rbln-run" rbln-run $o/$m.rbln --input $o/$m.input.npy --output /tmp/$m.npy --iterations 5 --warmup 1
    # The errors, prefixed so that they are easy to find in the log.
    rc=0; rbln-example-models compare /tmp/$m.npy $o/$m.expected.npy 1e-4 >/tmp/cmp 2>&1 || rc=$?
    sed "s/^/# $m: /" /tmp/cmp
    check "$m matches onnxruntime (tol 1e-4)" test $rc = 0
done
# Token ids and an attention mask (int64) as transformers exports them.
b="--input $o/bert-ids.input0.npy --input $o/bert-ids.input1.npy"
check "bert-ids (int64 input_ids + attention_mask): rbln-run" rbln-run $o/bert-ids.rbln $b --output /tmp/bert.npy --iterations 5 --warmup 1
check "bert-ids matches onnxruntime (tol 1e-4)" rbln-example-models compare /tmp/bert.npy $o/bert-ids.expected.npy 1e-4
check "bert-ids through AsyncRuntime (parallel 2) matches" sh -c \
    "rbln-run $o/bert-ids.rbln --async --parallel 2 $b --output /tmp/ba.npy --iterations 6 >/dev/null && rbln-example-models compare /tmp/ba.npy $o/bert-ids.expected.npy 1e-4"
check "--inspect shows the ids' dtype and range" sh -c "rbln-run $o/bert-ids.rbln --inspect | grep -q 'input:    input_ids i64 \[2, 16\] values -100..100'"
rc=0; rbln-run $o/bert-ids.rbln --input $o/bert-ids.bad-ids.npy --input $o/bert-ids.input1.npy >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "an out-of-range token id: exit 2, names the input and the element" sh -c \
    "test $rc = 2 && grep -q \"input 'input_ids': element \[1, 3\] is 100, outside the range -100..100\" /tmp/err"
rc=0; rbln-run $o/bert-ids.rbln --input $o/bert-ids.expected.npy >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "float data for int64 ids: exit 2, names the input and both dtypes" sh -c \
    "test $rc = 2 && grep -q \"input 'input_ids': expected dtype i64, got f32\" /tmp/err"
check "the device is fine after the refused ids" rbln-run $o/bert-ids.rbln $b --output /tmp/bert2.npy
check "masks (run-time comparisons, logic and Where from an int64 mask) matches onnxruntime" sh -c \
    "rbln-run $o/masks.rbln --input $o/masks.input0.npy --input $o/masks.input1.npy --output /tmp/mk.npy >/dev/null && rbln-example-models compare /tmp/mk.npy $o/masks.expected.npy 1e-4"
check "dynamic-batch compiled with --input-shape x=3x8 matches" sh -c \
    "rbln-run $o/dynamic-batch.rbln --input $o/dynamic-batch.b3.input.npy --output /tmp/d.npy >/dev/null && rbln-example-models compare /tmp/d.npy $o/dynamic-batch.b3.expected.npy 1e-4"
check "transformer through AsyncRuntime (parallel 2) matches" sh -c \
    "rbln-run $o/transformer.rbln --async --parallel 2 --input $o/transformer.input.npy --output /tmp/ta.npy --iterations 6 >/dev/null && rbln-example-models compare /tmp/ta.npy $o/transformer.expected.npy 1e-4"
check "--profile traces every device op of the resnet" sh -c \
    "rbln-run $o/resnet.rbln --profile /tmp/trace.json >/dev/null && grep -q '\"name\":\"layer1.0.conv1\"' /tmp/trace.json"
rc=0; rbln-run $o/resnet.rbln --input $o/mobilenet.input.npy >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "wrong input shape: exit 2, names the ONNX input" sh -c "test $rc = 2 && grep -q \"input 'image'\" /tmp/err"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
