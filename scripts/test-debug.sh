#!/usr/bin/env bash
# `make test-debug`: the kernel-driver suites under a debug kernel (KASAN,
# kmemleak, lockdep and PROVE_RCU, debug objects, allocation-failure
# injection; scripts/guest-kernel-debug.config), each followed by a kmemleak
# check (scripts/vm.sh, VM_KERNEL=debug), then allocation-failure injection
# on every ioctl path (tests/vm-debug/alloc-faults.sh). Not part of
# `make test`: the debug kernel is a second kernel build (about 15 min) and
# its suites run several times slower. Last line: "N passed, N failed".
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The suites that exercise the driver itself (no models needed).
SUITES="boot kmd-basic kmd-uapi kmd-hang kmd-health kmd-teardown kmd-two-devices kmd-version faults umd"

main() {
    step "setup (sysroot)" "$RBLN_ROOT/scripts/setup.sh"
    step "the debug kernel (KERNEL_FLAVOR=debug)" env KERNEL_FLAVOR=debug "$RBLN_ROOT/scripts/build-kernel.sh"
    step "rbln.ko for the debug kernel (target/kmd-debug)" env KERNEL_FLAVOR=debug "$RBLN_ROOT/scripts/build-kmd.sh"
    step "cargo build --release (binaries for the guest)" cargo build --release --workspace --quiet
    step "build the C examples (examples/c)" env RBLN_SKIP_CARGO=1 "$RBLN_ROOT/examples/c/build.sh"
    local s env
    for s in $SUITES; do
        env=$(sed -n 's/^# vm-env: //p' "$RBLN_ROOT/tests/vm/$s.sh")
        # shellcheck disable=SC2086
        step "debug kernel: tests/vm/$s.sh" env $env VM_KERNEL=debug "$RBLN_ROOT/scripts/vm.sh" "sh tests/vm/$s.sh"
    done
    step "debug kernel: allocation failures on every ioctl path (tests/vm-debug/alloc-faults.sh)" \
        env VM_KERNEL=debug VM_ALLOW_STACK_DUMPS=1 "$RBLN_ROOT/scripts/vm.sh" "sh tests/vm-debug/alloc-faults.sh"
    steps_summary
}

main "$@"
