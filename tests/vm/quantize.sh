# rbln-quantize: the float test models (tests/compiler/compile-models.sh)
# quantised on the NPU over 4 calibration samples
# (tests/compiler/compile-int8.sh), compiled in the guest (slow under
# TCG: so ResNet-18 once, the small test models for the variants) and run on the
# int8 kernels; the result keeps cosine similarity >= 0.99 with the float
# model's onnxruntime output. Bad calibration data gets a clear error.
. tests/vm/lib.sh
o=target/onnx
c=target/int8

check "float models and calibration data were made on the host" test -f $o/resnet18.onnx -a -f $c/calib-resnet18.npz
check "insmod rbln.ko" insmod "$RBLN_KO"
# model, input, extra rbln-quantize options
while read -r m opts; do
    check "$m: rbln-quantize $opts" sh -c "rbln-quantize $o/$m.onnx --calibration $c/calib-$m.npz -o /tmp/$m.q.onnx $opts >/tmp/$m.q.txt"
    sed "s/^/# $m: /" /tmp/$m.q.txt
    case "$opts" in
        *--no-report*) ;;
        *) check "$m: the report covers every layer and the output" sh -c "grep -q '<output>' /tmp/$m.q.txt && grep -q 'lowest layer cosine similarity' /tmp/$m.q.txt" ;;
    esac
    check "$m: rbln-compile runs the quantised layers on int8 kernels" sh -c "rbln-compile /tmp/$m.q.onnx -o /tmp/$m.q.rbln | tee /tmp/$m.c.txt | grep -q 'int8: '"
    grep int8: /tmp/$m.c.txt | sed "s/^/# $m: /"
    check "$m: rbln-run" rbln-run /tmp/$m.q.rbln --input $o/$m.input.npy --output /tmp/$m.q.npy
    rc=0; rbln-example-models cosine /tmp/$m.q.npy $o/$m.expected.npy 0.99 >/tmp/cmp 2>&1 || rc=$?
    sed "s/^/# $m vs float: /" /tmp/cmp
    check "$m: cosine similarity to the float model >= 0.99" test $rc = 0
done <<LIST
resnet18
mobilenet --method percentile --percentile 99.99
resnet --reduce-range --no-report
LIST
rc=0; rbln-quantize $o/resnet.onnx --calibration $c/calib-mobilenet.npz -o /tmp/bad.onnx >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "calibration data for another model: exit 2, names the missing input" sh -c \
    "test $rc = 2 && grep -q \"no array named 'image'\" /tmp/err && test ! -e /tmp/bad.onnx"
check "rmmod" rmmod rbln
