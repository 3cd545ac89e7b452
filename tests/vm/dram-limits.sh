# vm-env: NPU_ARGS=--dram-mib=32
# A device with 32 MiB of DRAM: a model whose weights and activations do
# not fit is refused at load time with what it needs and what the device
# has (rbln-run exit 3, Python RBLNModelError); one that fits alone but not
# beside another (AsyncRuntime, parallel 2: two arenas) says that the DRAM
# is held by others (exit 4); either way nothing leaks, and a model that
# fits still runs and matches.
. tests/vm/lib.sh
o=target/onnx

check "test models were compiled on the host" test -f $o/resnet18.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
check "the device has 32 MiB of DRAM" grep -q '^dram_total_bytes: 33554432$' /sys/kernel/debug/rbln0/state

# resnet18: 50.2 MiB of arena (46.3 MiB of weights: 7 convs with their
# filters in Winograd's domain, 16/9 of the direct bytes).
rc=0; rbln-run $o/resnet18.rbln >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "a model larger than the DRAM: exit 3, need vs. have" sh -c \
    "test $rc = 3 && grep -q 'needs 50.2 MiB of device DRAM (46.3 MiB of weights, the rest activations), more than the device.s 32.0 MiB in all' /tmp/err"
check "Python: the same refusal as rbln.RBLNModelError" python3 -c "
import rbln
try:
    rbln.Runtime('$o/resnet18.rbln')
except rbln.RBLNModelError as e:
    assert 'more than the device\'s 32.0 MiB in all' in str(e), e
else:
    raise SystemExit('no error')
"

# mobilenetv2: 19.1 MiB of arena; two of them do not fit.
check "a model that fits runs and matches" sh -c \
    "rbln-run $o/mobilenetv2.rbln --input $o/mobilenetv2.input.npy --output /tmp/m.npy >/dev/null && rbln-example-models compare /tmp/m.npy $o/mobilenetv2.expected.npy 1e-4"
rc=0; rbln-run $o/mobilenetv2.rbln --async --parallel 2 --input $o/mobilenetv2.input.npy >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "a second instance that no longer fits: exit 4, DRAM held by others" sh -c \
    "test $rc = 4 && grep -q 'needs 19.1 MiB of device DRAM .* the device has 32.0 MiB in all, but not that much free now' /tmp/err"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state && grep -q '^dram_free_bytes: 33554432$' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
