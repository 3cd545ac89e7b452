# Several processes at once, and a process killed mid-job: no fence is
# lost, and every resource comes back (debugfs counters return to their
# start values).
. tests/vm/lib.sh

state=/sys/kernel/debug/rbln0/state
leak_lines() { grep -E '^(contexts_open|queues_in_use|bos|host_bo_bytes|dram_free_bytes):' "$state"; }

check "insmod rbln.ko" insmod "$RBLN_KO"
check "debugfs state exists" test -r "$state"
before=$(leak_lines)
check "4 processes x 1000 submit/wait cycles lose no fence" rbln-kmd-tests stress
check "20000 random ioctls: errors, no crash, still working" rbln-kmd-tests ioctl_fuzz
rbln-kmd-tests hold >/tmp/hold.out 2>&1 &
pid=$!
i=0; while ! grep -q holding /tmp/hold.out && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
check "the holder is blocked mid-job" grep -q holding /tmp/hold.out
check "resources are in use while it runs" sh -c "grep -q '^contexts_open: 1' $state && grep -q '^queues_in_use: 1' $state"
grep -E '^queue ' "$state"
kill -9 $pid; wait $pid 2>/dev/null || true
after=$(leak_lines)
echo "# before:"; echo "$before"; echo "# after:"; echo "$after"
check "after SIGKILL every counter is back to its start value" test "$before" = "$after"
check "rmmod rbln" rmmod rbln
