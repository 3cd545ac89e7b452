# The guest enumerates the rbln NPU with the right identity, class, BARs
# and MSI-X capability.
. tests/vm/lib.sh

dev=$(npu_devices | head -1)
check "an rbln NPU (1234:52b1) is on the PCI bus" test -n "$dev"
check "class is processing accelerator (0x120000)" test "$(cat "$dev/class")" = 0x120000
check "subsystem is 1234:0001" test "$(cat "$dev/subsystem_vendor"):$(cat "$dev/subsystem_device")" = 0x1234:0x0001
check "BAR0 (registers) is 64 KiB" test "$(bar_size "$dev" 0)" = 65536
check "BAR2 (DRAM) is 2 GiB, 64-bit prefetchable" sh -c "test $(bar_size "$dev" 2) = 2147483648 && test \$(( $(bar_flags "$dev" 2) & 0x2000 )) != 0"
check "BAR4 (doorbells) is 16 queues x 4 KiB" test "$(bar_size "$dev" 4)" = 65536
check "the capability list holds MSI-X with 9 vectors" test "$(msix_vectors "$dev")" = 9
