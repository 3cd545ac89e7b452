# rbln.ko binds the NPU, creates /dev/rbln0, answers INFO and rejects bad
# ioctls; rmmod unbinds cleanly.
. tests/vm/lib.sh

check "insmod rbln.ko" insmod kmd/rbln.ko
check "/dev/rbln0 exists" test -c /dev/rbln0
check "the driver bound the PCI function" test -e "$(npu_devices | head -1)/driver"
check "info ioctls" rbln-kmd-tests info info_sizes unknown_ioctls
check "rmmod rbln" rmmod rbln
check "/dev/rbln0 is gone" test ! -e /dev/rbln0
