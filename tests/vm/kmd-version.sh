# vm-env: NPU_ARGS=--report-version=0x20000
# A device reporting a hardware major version the driver does not know is
# refused with a clear log line, and no device node appears.
. tests/vm/lib.sh

check "insmod rbln.ko (the module loads)" insmod "$RBLN_KO"
check "the device is refused" test ! -e /dev/rbln0
check "the log says why" sh -c 'dmesg | grep -q "hardware version 2.0 is not supported"'
check "rmmod rbln" rmmod rbln
