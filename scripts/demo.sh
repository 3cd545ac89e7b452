#!/usr/bin/env bash
# The demo: boot the guest with one NPU, load the driver (its probe
# self-test rings a doorbell and waits for the fence interrupt), run a
# compiled model with rbln-run and check it against the CPU, an ONNX model
# compiled by rbln-compile against onnxruntime, the same from Python
# (`import rbln`: Runtime, AsyncRuntime under asyncio), run a GEMM from
# C, jobs through kernel and user-mode submission, show the device state,
# and unload cleanly.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
"$RBLN_ROOT/target/release/rbln-example-models" "$RBLN_ROOT/target/models"
# ONNX models (with onnxruntime references) compiled by rbln-compile.
"$RBLN_ROOT/tests/compiler/compile-models.sh" 2>/dev/null
# The guest's python3 with the rbln wheel (target/guest-python).
"$RBLN_ROOT/scripts/build-guest-python.sh" >/dev/null
exec "$RBLN_ROOT/scripts/vm.sh" '
echo "== guest kernel $(uname -r); NPU on the PCI bus:"
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/device)" = 0x52b1 ] && echo "   $d class $(cat $d/class)"; done
insmod kmd/rbln.ko
dmesg | grep rbln0
echo "== rbln-run: a compiled .rbln model (2-layer MLP) on the NPU"
rbln-run target/models/mlp.rbln --inspect
rbln-run target/models/mlp.rbln --input target/models/mlp.input.npy --output /tmp/y.npy --iterations 50 --warmup 5
rbln-example-models compare /tmp/y.npy target/models/mlp.expected.npy
echo "== rbln-compile: an ONNX ResNet-style CNN on the NPU vs onnxruntime"
rbln-run target/onnx/resnet.rbln --inspect
rbln-run target/onnx/resnet.rbln --input target/onnx/resnet.input.npy --output /tmp/r.npy --iterations 20 --warmup 2
rbln-example-models compare /tmp/r.npy target/onnx/resnet.expected.npy
echo "== Python: import rbln; Runtime on the ResNet-style CNN, then 100 requests through asyncio.gather (AsyncRuntime, parallel=2)"
python3 -c "
import numpy as np, rbln
print(\"rbln.devices():\", rbln.devices())
x = np.load(\"target/onnx/resnet.input.npy\")
with rbln.Runtime(\"target/onnx/resnet.rbln\") as rt:
    y = rt.run(x)
want = np.load(\"target/onnx/resnet.expected.npy\")
err = float(np.max(np.abs(y - want)))
print(\"rbln.Runtime: output\", y.shape, y.dtype, \"max |y - onnxruntime| =\", err)
assert err <= 1e-4 * (1 + float(np.max(np.abs(want))))
"
python3 examples/python/async_gather.py target/models/mlp.rbln
echo "== a C program (librbln_umd) runs a GEMM on the NPU, user-mode submission"
target/c-examples/gemm user
echo "== jobs through the kernel (SUBMIT + interrupt-driven FENCE_WAIT) and from user space (own ring + doorbell)"
rbln-kmd-tests submit_and_wait user_mode_submission
echo "== /sys/kernel/debug/rbln0/state"
cat /sys/kernel/debug/rbln0/state
rmmod rbln
echo "== rbln.ko loaded, ran jobs and unloaded cleanly"
'
