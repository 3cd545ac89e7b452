# Triton custom kernels inside a model: the attention kernel as a
# rbln.triton ONNX node between built-in ops (tests/triton/check.sh built
# it on the host) runs on the NPU and matches onnxruntime running the same
# model with attention as built-in ops. (python/tests/test_triton.py, in
# tests/vm/python.sh, runs the kernels through rbln.triton.)
. tests/vm/lib.sh
t=target/triton

check "the custom-operator model was made on the host" test -f $t/attention-op.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
check "--inspect lists the TritonKernel op" sh -c "rbln-run $t/attention-op.rbln --inspect | grep -q TritonKernel"
check "attention-op: rbln-run" rbln-run $t/attention-op.rbln --input $t/attention-op.input.npy --output /tmp/att.npy --iterations 5 --warmup 1
rc=0; rbln-example-models compare /tmp/att.npy $t/attention-op.expected.npy 1e-5 >/tmp/cmp 2>&1 || rc=$?
sed "s/^/# attention-op: /" /tmp/cmp
check "attention-op matches onnxruntime's built-in attention (tol 1e-5)" test $rc = 0
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
