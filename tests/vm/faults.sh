# Fault injection: the device model misbehaves on purpose (armed through
# the harness's debug control, which the guest's device interface cannot
# reach; docs/reliability.md) and the driver recovers from each fault.
. tests/vm/lib.sh

check "insmod rbln.ko hang_ms=500" insmod "$RBLN_KO" hang_ms=500
check "dropped fence interrupts: every wait completes, found by polling" rbln-kmd-tests inject_irq_drop
check "a late fence interrupt: the wait completes, the late interrupt is harmless" rbln-kmd-tests inject_irq_delay
check "spurious interrupts on every vector: counted and ignored" rbln-kmd-tests inject_irq_spurious
check "a fault whose error interrupt is lost: found by the waiter, EIO" rbln-kmd-tests inject_missed_fault
check "... and logged as such" sh -c 'dmesg | grep -q "faulted without an error interrupt (found by its waiter)"'
check "a corrupt status write-back is refused" rbln-kmd-tests inject_status_corrupt
check "... and logged" sh -c 'dmesg | grep -q "corrupt status block write-back refused"'
check "a failed DMA transfer: EIO, nothing written" rbln-kmd-tests inject_dma_fail
check "... logged with its fault code" sh -c 'dmesg | grep -q "DMA transfer error"'
check "a stalled queue is declared hung and reset" rbln-kmd-tests inject_queue_stall
check "... logged" sh -c 'dmesg | grep -q "made no progress for 500 ms: reset"'
check "no context, queue or buffer leaked by the faulted jobs" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
cat /sys/kernel/debug/rbln0/state
check "the device dies mid-job: ENODEV, health lost" rbln-kmd-tests inject_die
check "rmmod rbln after the device died" rmmod rbln
