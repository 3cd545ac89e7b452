#!/usr/bin/env bash
# `make fuzz`: every fuzzer at scale, FUZZ_CASES (default 10^6) cases per
# target: the .rbln parser, the device model's command processor (command
# buffers, descriptors, register writes), the compiler's ONNX, TFLite and
# TTIR front ends (seeded with the test models), and the driver's ioctls
# from several processes with random closes, kills and mmaps (in the
# guest). Not part of `make test` (which runs each at a few hundred cases).
# A crash fails the run; its input is saved (target/fuzz-crashes/) and
# becomes a regression test. Last line: "N passed, N failed".
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

N=${FUZZ_CASES:-1000000}
# fuzz_test VAR=CASES CRATE TEST [FILTER]: cargo test of a fuzz target
# with its case count in VAR; prints its summary lines.
fuzz_test() {
    env "$1" cargo test --release --quiet -p "$2" --test "$3" -- ${4:+"$4"} --nocapture --test-threads 2 2>&1 \
        | grep -E '^fuzz |test result|panicked|FAILED|input saved'
    return "${PIPESTATUS[0]}"
}

main() {
    local r=$RBLN_ROOT
    step "cargo build --release (binaries for the guest)" cargo build --release --workspace --quiet
    # Seeds for the compiler's fuzzers: the test models.
    step "write the example models (target/models)" "$r/target/release/rbln-example-models" "$r/target/models"
    step "ONNX test models (target/onnx)" "$r/tests/compiler/compile-models.sh"
    step "int8 test models (target/int8)" "$r/tests/compiler/compile-int8.sh"
    step "TFLite test models (target/tflite)" "$r/tests/compiler/compile-tflite.sh"
    step "Triton kernels as TTIR (target/triton)" "$r/tests/triton/check.sh"
    export RBLN_FUZZ_CORPUS=$r/target/onnx:$r/target/int8:$r/target/tflite:$r/target/triton
    # The .rbln fuzzer runs 6 strategies: cases per strategy so that the
    # target gets N.
    step ".rbln parser: $N cases (6 strategies)" fuzz_test RBLN_FUZZ_CASES=$(((N + 5) / 6)) rbln-format fuzz
    step "device model: $N command buffers and descriptors on one device" \
        fuzz_test RBLN_FUZZ_SCALE="$N" rbln-npu fuzz command_buffers_at_scale
    step "compiler: $N ONNX, $N TFLite and $N TTIR cases" fuzz_test RBLN_FUZZ_CASES="$N" rbln-compile fuzz
    step "build kmd/rbln.ko" "$r/scripts/build-kmd.sh"
    step "driver: $N ioctls, mmaps, opens and closes from 4 processes, killed at random" \
        env VM_TIMEOUT=5400 "$r/scripts/vm.sh" \
        "insmod kmd/rbln.ko && RBLN_FUZZ_CALLS=$N RBLN_FUZZ_PROCS=4 rbln-kmd-tests ioctl_storm && rmmod rbln"
    steps_summary
}

main "$@"
