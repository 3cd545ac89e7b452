#!/usr/bin/env bash
# The demo: boot the guest with one NPU, load the driver (its probe
# self-test rings a doorbell and waits for the fence interrupt), show the
# device state, run a job through kernel submission and one through
# user-mode submission, and unload cleanly.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exec "$RBLN_ROOT/scripts/vm.sh" '
echo "== guest kernel $(uname -r); NPU on the PCI bus:"
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/device)" = 0x52b1 ] && echo "   $d class $(cat $d/class)"; done
insmod kmd/rbln.ko
dmesg | grep rbln0
echo "== a C program (librbln_umd) runs a GEMM on the NPU, user-mode submission"
target/c-examples/gemm user
echo "== jobs through the kernel (SUBMIT + interrupt-driven FENCE_WAIT) and from user space (own ring + doorbell)"
rbln-kmd-tests submit_and_wait user_mode_submission
echo "== /sys/kernel/debug/rbln0/state"
cat /sys/kernel/debug/rbln0/state
rmmod rbln
echo "== rbln.ko loaded, ran jobs and unloaded cleanly"
'
