#!/usr/bin/env bash
# The host side of `make bench`'s guest requests (scripts/vm.sh runs it as
# VM_HOST_CLIENT, with the guest's words appended; scripts/bench.sh sets
# the environment below):
#
#   bench-host-client.sh ADDR load ARGS...  rbln-serve-load --addr ADDR ARGS
#                                           (the rbln-serve rows' client)
#   bench-host-client.sh ADDR ort NAME...   onnxruntime on NAME now, one JSON
#                                           line each appended to
#                                           OUT/host/ort.paired.jsonl
#   bench-host-client.sh ADDR native        the micro rows' host references
#                                           (rbln-bench-host: gemm crate,
#                                           copy bandwidth) now, into
#                                           OUT/host/native.paired.json
#
# `ort` is the paired reference of the model rows (`native` that of the
# micro rows): the guest asks for it before each of the model's profiles
# (`native`: once, before the micro models) and sleeps meanwhile, so that
# onnxruntime and the device take turns seconds apart, not an hour (this
# host's speed drifts by a third within a `make bench`, and by up to 1.6x
# within seconds).
# Environment: BENCH_HOST_OUT (the bench's output directory), BENCH_HOST_PY
# (the venv's python), BENCH_HOST_THREADS, BENCH_HOST_ORT_ARGS (options of
# bench_models.py ort), BENCH_HOST_NATIVE_ARGS (options of rbln-bench-host
# besides --threads).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[[ $# -ge 2 ]] || { echo "usage: $0 ADDR load|ort|native [ARGS...]" >&2; exit 2; }
addr=$1 what=$2
shift 2
case $what in
    load) exec "$BENCH_HOST_OUT/bin/rbln-serve-load" --addr "$addr" "$@" ;;
    ort)
        # shellcheck disable=SC2086 # a list of options
        "$BENCH_HOST_PY" "$root/tests/models/bench_models.py" ort "$BENCH_HOST_OUT/models" \
            --threads "$BENCH_HOST_THREADS" $BENCH_HOST_ORT_ARGS "$@" | tee -a "$BENCH_HOST_OUT/host/ort.paired.jsonl"
        ;;
    native)
        # shellcheck disable=SC2086 # a list of options
        "$root/target/release/rbln-bench-host" --threads "$BENCH_HOST_THREADS" $BENCH_HOST_NATIVE_ARGS \
            >"$BENCH_HOST_OUT/host/native.paired.json.tmp"
        mv "$BENCH_HOST_OUT/host/native.paired.json.tmp" "$BENCH_HOST_OUT/host/native.paired.json"
        ;;
    *) echo "$0: unknown request '$what' (load, ort, native)" >&2; exit 2 ;;
esac
