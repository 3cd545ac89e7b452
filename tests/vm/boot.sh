# The guest boots, rbln.ko loads and unloads cleanly.
. tests/vm/lib.sh

check "guest runs a Linux 7.x kernel" sh -c 'uname -r | grep -q "^7\."'
check "the repo is shared into the guest" test -f /rbln/kmd/Kbuild
check "the guest runs on all ${RBLN_VM_SMP:-?} vCPUs QEMU was given" sh -c '[ "$(nproc)" = "$RBLN_VM_SMP" ]'
check "insmod rbln.ko" insmod "$RBLN_KO"
check "rbln is listed in /proc/modules" grep -q '^rbln ' /proc/modules
check "the driver logs its version" sh -c 'dmesg | grep -qE "rbln driver [0-9]+\.[0-9]+\.[0-9]+ loaded"'
check "rmmod rbln" rmmod rbln
check "rbln is gone from /proc/modules" sh -c '! grep -q "^rbln " /proc/modules'
check "the driver logs its unload" sh -c 'dmesg | grep -q "rbln driver .* unloaded"'
