# Keras models converted to float32 TFLite and compiled by rbln-compile
# (tests/compiler/compile-tflite.sh, run on the host first) run on the NPU
# through rbln-run and match ai-edge-litert's interpreter:
# |got - want| <= 1e-4 * (1 + |want|), DeepLabV3+ 1e-3: its reference's own
# noise is that large (litert's XNNPACK and builtin kernels differ by up to
# 3.8e-4 on it, scaled; the NPU differs from the builtin kernels by 4.5e-4).
# DeepLabV3+ at 512x512 has an arena of about 340 MB (the decoder
# upsamples 256 channels to 512x512 before the last 1x1 conv), and
# AsyncRuntime with parallel 2 holds two: the default 2 GiB of device DRAM
# holds both.
. tests/vm/lib.sh
o=target/tflite

check "compiled TFLite models were made on the host" test -f $o/deeplabv3plus.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
# compare NAME GOT WANT [TOL]: prefix the errors so that they are easy to find.
compare() {
    rc=0; rbln-example-models compare "$2" "$3" "${4:-1e-4}" >/tmp/cmp 2>&1 || rc=$?
    sed "s/^/# $1: /" /tmp/cmp
    return $rc
}
for m in keras-cnn tf-ops keras-cnn-fp16 mobilenetv2; do
    check "$m: rbln-run" rbln-run $o/$m.rbln --input $o/$m.input.npy --output /tmp/$m.npy --iterations 3 --warmup 1
    check "$m matches ai-edge-litert (tol 1e-4)" compare $m /tmp/$m.npy $o/$m.expected.npy
done
# keras-cnn's second output is 4-D NHWC, as in the TFLite model.
check "keras-cnn output 1 (NHWC feature map) matches" compare keras-cnn.1 /tmp/keras-cnn.1.npy $o/keras-cnn.expected.1.npy
check "keras-cnn-fp16 output 1 matches" compare keras-cnn-fp16.1 /tmp/keras-cnn-fp16.1.npy $o/keras-cnn-fp16.expected.1.npy
m=deeplabv3plus
check "$m (1x512x512x3): rbln-run --profile" rbln-run $o/$m.rbln --input $o/$m.input.npy --output /tmp/$m.npy --profile /tmp/$m.trace.json
check "$m matches ai-edge-litert (tol 1e-3)" compare $m /tmp/$m.npy $o/$m.expected.npy 1e-3
check "$m through AsyncRuntime (parallel 2)" sh -c \
    "rbln-run $o/$m.rbln --async --parallel 2 --input $o/$m.input.npy --output /tmp/$m.async.npy --iterations 2 >/dev/null"
check "$m async output matches (tol 1e-3)" compare $m.async /tmp/$m.async.npy $o/$m.expected.npy 1e-3
# Fully quantised models (int8 kernels). Through many layers an int8
# network carries rounding differences far: litert's own builtin and
# reference kernels (BUILTIN_REF) disagree by up to 16 steps on
# mobilenetv2-int8's logits, whose random weights amplify them. So the
# deep model is held to its float model (cosine similarity at least that
# of litert's int8 output, 0.977, less a margin) and the distances to both
# litert kernel sets are printed; keras-cnn-int8 (int8 input and outputs;
# many ops that TFLite computes with fixed-point tables: hard-swish,
# sigmoid, tanh, resizes) is held to litert within MAX steps per element,
# measured 5 and 4 where litert's two kernel sets differ by 3 and 2.
# model, output suffix, most steps from litert ("-": printed only), least cosine to float ("-": none)
while read -r m sfx max cos; do
    [ -n "$sfx" ] && [ "$sfx" != - ] || sfx=
    if [ -z "$sfx" ]; then
        check "$m: rbln-run" rbln-run $o/$m.rbln --input $o/$m.input.npy --output /tmp/$m.npy --iterations 3 --warmup 1
    fi
    step=$(cat $o/$m.step$sfx)
    lim=$max; [ "$max" != - ] || lim=1000
    rc=0; rbln-example-models compare-steps /tmp/$m$sfx.npy $o/$m.expected$sfx.npy "$step" "$lim" >/tmp/cmp 2>&1 || rc=$?
    sed "s/^/# $m$sfx vs litert: /" /tmp/cmp
    rbln-example-models compare-steps /tmp/$m$sfx.npy $o/$m.expected-ref$sfx.npy "$step" 1000 | sed "s/^/# $m$sfx vs litert's reference kernels: /"
    rbln-example-models compare-steps $o/$m.expected-ref$sfx.npy $o/$m.expected$sfx.npy "$step" 1000 | sed "s/^/# $m$sfx litert's reference vs builtin kernels: /"
    [ "$max" = - ] || check "$m$sfx matches litert within $max steps" test $rc = 0
    if [ "$cos" != - ]; then
        rc=0; rbln-example-models cosine /tmp/$m$sfx.npy $o/$m.float$sfx.npy "$cos" >/tmp/cmp 2>&1 || rc=$?
        sed "s/^/# $m$sfx vs float: /" /tmp/cmp
        rbln-example-models cosine $o/$m.expected$sfx.npy $o/$m.float$sfx.npy 0 | sed "s/^/# litert's $m$sfx vs float: /"
        check "$m$sfx stays close to the float model (cosine >= $cos)" test $rc = 0
    fi
done <<LIST
keras-cnn-int8 - 6 -
keras-cnn-int8 .1 5 -
mobilenetv2-int8 - - 0.97
LIST
check "keras-cnn-int8 takes and gives int8 tensors" sh -c "rbln-run $o/keras-cnn-int8.rbln --inspect | grep -q int8"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
