# A job that never finishes is detected (hang_ms), reset and reported.
. tests/vm/lib.sh

check "insmod rbln.ko hang_ms=300" insmod "$RBLN_KO" hang_ms=300
check "hung job: EIO, queue reset, context poisoned" rbln-kmd-tests hang
check "the hang is reported in the kernel log" sh -c 'dmesg | grep -q "made no progress for 300 ms: reset"'
check "rmmod rbln" rmmod rbln
