# rbln.ko binds the NPU, creates /dev/rbln0, answers INFO and rejects bad
# ioctls; rmmod unbinds cleanly.
. tests/vm/lib.sh

check "insmod rbln.ko" insmod "$RBLN_KO"
check "/dev/rbln0 exists" test -c /dev/rbln0
check "probe self-test: a fence interrupt arrived" sh -c 'dmesg | grep -q "rbln0: self-test passed: fence interrupt after"'
check "9 MSI-X vectors are registered" test "$(grep -c ' rbln$' /proc/interrupts)" = 9
check "the interrupts fired" sh -c "awk '/ rbln\$/ { n += \$2 + \$3 } END { exit !(n >= 1) }' /proc/interrupts"
check "the driver bound the PCI function" test -e "$(npu_devices | head -1)/driver"
check "info ioctls" rbln-kmd-tests info info_sizes unknown_ioctls
check "an open file keeps rmmod out" sh -c 'exec 3</dev/rbln0; ! rmmod rbln 2>/dev/null'
check "rmmod rbln" rmmod rbln
check "/dev/rbln0 is gone" test ! -e /dev/rbln0
