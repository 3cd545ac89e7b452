#!/usr/bin/env bash
# Build the `rbln` Python wheel (python/: PyO3 extension rbln._rbln + the
# pure-Python package) with maturin from a cached venv
# (python/build-requirements.txt, scripts/setup-python.sh). One stable-ABI
# (abi3, CPython >= 3.9) wheel lands in target/wheels/; older rbln wheels
# there are removed. Idempotent: cargo rebuilds only what changed, and
# when nothing did the wheel is left as it is. The last line on stdout is
# the wheel's path.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

OUT=$RBLN_ROOT/target/wheels

# Everything the wheel is made of, for the up-to-date check: the package
# sources, and the Rust crates it links (by their sources).
inputs_hash() {
    (cd "$RBLN_ROOT" && git ls-files -co --exclude-standard -- python runtime umd hw uapi compiler Cargo.lock \
        | grep -v '^python/tests/' | LC_ALL=C sort | xargs -d '\n' sha256sum 2>/dev/null || true) | sha256sum | cut -c1-16
}

main() {
    local py maturin key stamp wheel
    py=$("$RBLN_ROOT/scripts/setup-python.sh" "$RBLN_ROOT/python/build-requirements.txt" | tail -n 1)
    maturin=$(dirname "$py")/maturin
    [[ -x $maturin ]] || die "maturin missing from the build venv ($maturin)"
    mkdir -p "$OUT"
    key=$(inputs_hash)
    stamp=$OUT/.rbln-wheel.$key
    wheel=$(ls "$OUT"/rbln-*.whl 2>/dev/null | head -n 1 || true)
    if [[ -f $stamp && -n $wheel && -f $wheel ]]; then
        log "rbln wheel up to date: ${wheel#"$RBLN_ROOT"/}"
        echo "$wheel"
        return
    fi
    log "building the rbln wheel (maturin $("$maturin" --version | cut -d' ' -f2))"
    rm -f "$OUT"/rbln-*.whl "$OUT"/.rbln-wheel.*
    # --compatibility linux: the wheel is for the host's glibc (and the
    # guest, which carries it), not a manylinux policy.
    (cd "$RBLN_ROOT/python" && "$maturin" build --release --quiet --interpreter "$py" \
        --compatibility linux --out "$OUT") >&2 || die "maturin build failed"
    wheel=$(ls "$OUT"/rbln-*.whl 2>/dev/null | head -n 1 || true)
    [[ -n $wheel ]] || die "maturin wrote no wheel into ${OUT#"$RBLN_ROOT"/}"
    touch "$stamp"
    log "rbln wheel built: ${wheel#"$RBLN_ROOT"/} ($(du -h "$wheel" | cut -f1))"
    echo "$wheel"
}

main "$@"
