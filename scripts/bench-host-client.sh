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
#   bench-host-client.sh ADDR native TAG    the micro rows' host references
#                                           (rbln-bench-host: gemm crate,
#                                           copy bandwidth) now, appended
#                                           as one line {"tag": TAG, ...}
#                                           to OUT/host/native.paired.jsonl
#
# `ort` is the paired reference of the model rows (`native` that of the
# micro rows): the guest asks for it before each of the model's profiles
# (`native`: before each profile of the micro models compared with it,
# TAG naming the model, and before the DMA step) and sleeps meanwhile, so
# that the host library and the device take turns seconds apart, not an
# hour (this host's speed drifts by a third within a `make bench`, and by
# up to 1.6x within seconds).
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
        [[ $# == 1 && $1 =~ ^[A-Za-z0-9._-]+$ ]] || { echo "$0: native takes one tag ([A-Za-z0-9._-]+)" >&2; exit 2; }
        # shellcheck disable=SC2086 # a list of options
        json=$("$root/target/release/rbln-bench-host" --threads "$BENCH_HOST_THREADS" $BENCH_HOST_NATIVE_ARGS)
        # rbln-bench-host prints one object on one line: tag it.
        [[ $json == "{"*"}" && $json != *$'\n'* ]] || { echo "$0: rbln-bench-host printed no one-line JSON object" >&2; exit 1; }
        printf '{"tag":"%s",%s\n' "$1" "${json#\{}" >>"$BENCH_HOST_OUT/host/native.paired.jsonl"
        ;;
    *) echo "$0: unknown request '$what' (load, ort, native)" >&2; exit 2 ;;
esac
