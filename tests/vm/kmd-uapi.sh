# Every ioctl on its success and error paths: BOs, VA mappings, queues,
# kernel submission, interrupt-driven fences, timeouts and faults.
. tests/vm/lib.sh

check "insmod rbln.ko" insmod "$RBLN_KO"
check "uAPI tests" rbln-kmd-tests dram_scrubbed queue_errors fault_isolation bo_errors vm_errors submit_and_wait timeout_and_fault user_mode_submission signal_interrupts_wait dram_churn fdinfo stats
check "rmmod rbln" rmmod rbln
