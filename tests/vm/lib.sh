# Helpers for the VM suites (POSIX sh: the guest runs busybox). Source it.
set -eu

# The driver module to load: the harness points it at a build for the
# debug kernel under `make test-debug` (scripts/vm.sh, VM_KERNEL=debug).
RBLN_KO=${RBLN_KO:-kmd/rbln.ko}

fail() { echo "FAIL: $*" >&2; exit 1; }
ok()   { echo "ok - $*"; }

# check DESCRIPTION CMD...: run CMD, fail the suite if it fails.
check() {
    desc=$1; shift
    if "$@"; then ok "$desc"; else fail "$desc"; fi
}

# Sysfs directories of the rbln NPUs (vendor 0x1234, device 0x52b1).
npu_devices() {
    for d in /sys/bus/pci/devices/*; do
        if [ "$(cat "$d/vendor")" = 0x1234 ] && [ "$(cat "$d/device")" = 0x52b1 ]; then
            echo "$d"
        fi
    done
}

# bar_size DEV N: size in bytes of BAR N (from sysfs "resource").
bar_size() {
    sed -n "$(($2 + 1))p" "$1/resource" | { read -r start end _; echo $((end - start + 1)); }
}

# bar_flags DEV N: the resource flags of BAR N.
bar_flags() {
    sed -n "$(($2 + 1))p" "$1/resource" | { read -r _ _ flags; echo $((flags)); }
}

# Config byte at OFFSET of DEV.
config_byte() {
    od -An -tu1 -j "$2" -N1 "$1/config" | tr -d ' '
}

# Number of MSI-X vectors in DEV's capability list (empty if none).
msix_vectors() {
    ptr=$(config_byte "$1" 52)
    while [ "$ptr" != 0 ]; do
        if [ "$(config_byte "$1" "$ptr")" = 17 ]; then
            lo=$(config_byte "$1" $((ptr + 2))); hi=$(config_byte "$1" $((ptr + 3)))
            echo $(( ((hi & 7) << 8 | lo) + 1 ))
            return
        fi
        ptr=$(config_byte "$1" $((ptr + 1)))
    done
}

# Wait up to 2 minutes for an HTTP server (process $1) to answer 200 at
# URL $2; 0 once it does, 1 when it exited or the time ran out.
wait_http_ready() {
    _i=0
    while [ $_i -lt 240 ]; do
        wget -q -O /dev/null "$2" 2>/dev/null && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 0.5
        _i=$((_i + 1))
    done
    return 1
}
