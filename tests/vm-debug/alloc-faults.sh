# Allocation-failure injection on every ioctl path (debug kernel only,
# `make test-debug`): failslab and fail_page_alloc, filtered to call stacks
# that pass through rbln.ko, fail 3 in 100 of the driver's allocations
# while the driver test suite runs, six times over (rarely enough that most
# calls get deep into their ioctl before one fails).
# The kernel's own report of each failed allocation (a bare stack dump) is
# expected: run with VM_ALLOW_STACK_DUMPS=1 (scripts/test-debug.sh does). The tests may fail
# (that is the point); the kernel must not oops, warn or leak (the harness
# and the kmemleak check fail the run otherwise), nothing may stay
# allocated, and once injection stops every test passes again.
. tests/vm/lib.sh

D=/sys/kernel/debug
check "insmod rbln.ko" insmod "$RBLN_KO"
# From rbln.ko's base (/proc/modules) to the end of the x86-64 module
# area: no module loads after it, so only stacks through rbln.ko match.
read -r _ size _ _ _ base _ <<EOF2
$(grep '^rbln ' /proc/modules)
EOF2
case $base in 0xffffffff*) ;; *) fail "no kernel address for rbln in /proc/modules: '$base'" ;; esac
start=$base
end=0xffffffffff000000
echo "# rbln.ko: $size bytes at $base"

arm() { # arm FAULT TIMES: the stack filter first; armed only if it took
    echo 0 >$D/$1/verbose || return 1
    echo N >$D/$1/task-filter || return 1
    echo N >$D/$1/ignore-gfp-wait || return 1
    echo "$start" >$D/$1/require-start || return 1
    echo "$end" >$D/$1/require-end || return 1
    [ "$(cat $D/$1/require-start)" != 0 ] || return 1
    echo 1 >$D/$1/interval || return 1
    echo "$2" >$D/$1/times || return 1
    echo 3 >$D/$1/probability
}
disarm() { echo 0 >$D/$1/probability; echo 0 >$D/$1/times; }

check "arm failslab (the driver's kmallocs)" arm failslab 100000
check "arm fail_page_alloc (its pages and DMA buffers)" arm fail_page_alloc 100000
for round in 1 2 3 4 5 6; do
    rc=0; rbln-kmd-tests >/tmp/round.txt 2>&1 || rc=$?
    echo "# round $round: $(grep -c '^ok' /tmp/round.txt) tests passed, $(grep -c '^FAIL' /tmp/round.txt) failed under injection (status $rc)"
    grep '^FAIL' /tmp/round.txt | head -5 | sed 's/^/#   /'
done
slab=$((100000 - $(cat $D/failslab/times)))
page=$((100000 - $(cat $D/fail_page_alloc/times)))
disarm failslab
disarm fail_page_alloc
echo "# allocations failed on purpose: $slab kmalloc, $page page"
check "allocations were failed on the driver's paths" test $((slab + page)) -gt 0
check "nothing left allocated after the processes exit" sh -c "grep -q '^contexts_open: 0' $D/rbln0/state && grep -q '^bos: 0' $D/rbln0/state && grep -q '^host_bo_bytes: 0' $D/rbln0/state"
check "with injection off, every driver test passes again" rbln-kmd-tests
check "rmmod rbln" rmmod rbln
