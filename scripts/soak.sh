#!/usr/bin/env bash
# `make soak`: tests/vm-soak/soak.sh in one guest for SOAK_SECONDS (default
# 1800): four processes of mixed work plus a faulting one, device faults
# injected every minute; no failure, no leak, latency per minute printed.
# SOAK_KERNEL=debug runs it under the debug kernel of `make test-debug`
# (then kmemleak is checked at the end too). Not part of `make test`.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

S=${SOAK_SECONDS:-1800}

main() {
    local r=$RBLN_ROOT
    cargo build --release --workspace --quiet
    RBLN_SKIP_CARGO=1 "$r/examples/c/build.sh"
    "$r/target/release/rbln-example-models" "$r/target/models"
    KERNEL_FLAVOR=${SOAK_KERNEL:-} "$r/scripts/build-kmd.sh"
    log "soak: ${S}s"
    VM_KERNEL=${SOAK_KERNEL:-} VM_TIMEOUT=$((S + 900)) "$r/scripts/vm.sh" "SOAK_SECONDS=$S sh tests/vm-soak/soak.sh"
}

main "$@"
