# Helpers for the VM suites (POSIX sh: the guest runs busybox). Source it.
set -eu

fail() { echo "FAIL: $*" >&2; exit 1; }
ok()   { echo "ok - $*"; }

# check DESCRIPTION CMD...: run CMD, fail the suite if it fails.
check() {
    desc=$1; shift
    if "$@"; then ok "$desc"; else fail "$desc"; fi
}
