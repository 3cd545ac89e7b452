# vm-env: VM_DEVICES=2
# Two device-model instances show up as two PCI functions.
. tests/vm/lib.sh

check "two rbln NPUs are on the PCI bus" test "$(npu_devices | wc -l)" = 2
