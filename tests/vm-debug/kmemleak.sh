# kmemleak around a debug-kernel run (scripts/vm.sh, VM_KERNEL=debug):
#   sh tests/vm-debug/kmemleak.sh start   forget what boot left behind
#   sh tests/vm-debug/kmemleak.sh check   fail if anything leaked since
set -eu
K=/sys/kernel/debug/kmemleak
[ -e $K ] || { echo "FAIL: $K is missing: not the debug kernel?" >&2; exit 1; }
case ${1:-} in
    start)
        echo scan >$K
        echo clear >$K
        ;;
    check)
        # An object is reported once it has been unreferenced for 5 s and
        # two scans agree.
        sleep 6
        echo scan >$K
        echo scan >$K
        if [ -s $K ] && grep -q unreferenced $K; then
            echo "FAIL: kmemleak reports leaks:" >&2
            cat $K >&2
            exit 1
        fi
        echo "ok - kmemleak: no leak reported"
        ;;
    *) echo "usage: kmemleak.sh start|check" >&2; exit 2 ;;
esac
