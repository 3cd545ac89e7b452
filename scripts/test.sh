#!/usr/bin/env bash
# `make test`: host tests first, then the VM suites in tests/vm/ (each in a
# freshly booted guest), then self-tests of the VM harness. Each step prints
# its elapsed time; the last line is "N passed, N failed".
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# expect_status WANT CMD...: succeed iff CMD exits with status WANT.
expect_status() {
    local want=$1; shift
    local rc=0
    "$@" || rc=$?
    [[ $rc == "$want" ]] || { log "expected status $want, got $rc"; return 1; }
}

vm() { "$RBLN_ROOT/scripts/vm.sh" "$@"; }

main() {
    step "setup (sysroot, kernel, initramfs)" "$RBLN_ROOT/scripts/setup.sh"
    step "scripts: pinned-version fallback" "$RBLN_ROOT/tests/scripts/test-pins.sh"
    step "cargo test (host)" cargo test --release --workspace --quiet
    # On an AVX-512 host the kernels above ran their AVX-512 builds; the
    # AVX2 builds (what other hosts run) get the same tests.
    step "cargo test (kernels, AVX2 builds: RBLN_NO_AVX512=1)" env RBLN_NO_AVX512=1 cargo test --release -p rbln-kernels --quiet
    step "deploy/kubernetes manifests valid against the Kubernetes API schemas" "$RBLN_ROOT/tests/deploy/validate.sh"
    step "cargo build --release (binaries for the guest)" cargo build --release --workspace --quiet
    # The guest has no compiler: C programs are built here against librbln_umd.
    step "build the C examples (examples/c)" env RBLN_SKIP_CARGO=1 "$RBLN_ROOT/examples/c/build.sh"
    step "write the example models (target/models)" "$RBLN_ROOT/target/release/rbln-example-models" "$RBLN_ROOT/target/models"
    step "compile the ONNX test models (target/onnx)" "$RBLN_ROOT/tests/compiler/compile-models.sh"
    step "quantise (onnxruntime) and compile the int8 test models (target/int8)" "$RBLN_ROOT/tests/compiler/compile-int8.sh"
    step "compile the TFLite test models (target/tflite)" "$RBLN_ROOT/tests/compiler/compile-tflite.sh"
    step "Triton kernels as TTIR, read by the TTIR parser (target/triton)" "$RBLN_ROOT/tests/triton/check.sh"
    step "export and compile real PyTorch models (target/exports)" "$RBLN_ROOT/tests/compiler/compile-exports.sh"
    step "build the rbln Python wheel and the guest's Python (target/guest-python)" "$RBLN_ROOT/scripts/build-guest-python.sh"
    step "build kmd/rbln.ko" "$RBLN_ROOT/scripts/build-kmd.sh"

    # Each suite boots its own guest; a "# vm-env: VAR=value ..." line in
    # a suite sets the VM's environment (e.g. the number of NPUs).
    local suite name env
    for suite in "$RBLN_ROOT"/tests/vm/*.sh; do
        name=$(basename "$suite")
        [[ $name == lib.sh ]] && continue
        env=$(sed -n 's/^# vm-env: //p' "$suite")
        # shellcheck disable=SC2086
        step "vm: tests/vm/$name" env $env "$RBLN_ROOT/scripts/vm.sh" "sh tests/vm/$name"
    done

    # make bench at tiny sizes, one boot: the report must be well-formed
    # and complete (speed is never asserted).
    step "bench smoke (make bench, BENCH_SMOKE=1)" env BENCH_SMOKE=1 BENCH_SKIP_BUILD=1 \
        "$RBLN_ROOT/scripts/bench.sh"

    # The harness itself must catch what it promises to catch.
    step "harness: guest exit status is propagated" expect_status 3 vm 'exit 3'
    step "harness: a kernel WARNING fails the run" expect_status 90 \
        vm 'echo "WARNING: CPU: 0 PID: 1 at rbln-harness-selftest" >/dev/kmsg'
    step "harness: a hung guest is killed" expect_status 124 env VM_TIMEOUT=30 "$RBLN_ROOT/scripts/vm.sh" 'sleep 600'

    steps_summary
}

main "$@"
