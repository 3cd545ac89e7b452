# The guest side of `make bench` (scripts/bench.sh boots one VM for it):
#
#     sh tests/bench/guest.sh OUT        (OUT: repo-relative, e.g. target/bench)
#
# Reads OUT/plan.env (what to run, how often), runs everything on
# /dev/rbln0 with the binaries and rbln.ko snapshotted in OUT/bin, and
# writes raw results into OUT/guest/; the host aggregates them
# (tests/models/bench_report.py). A failing measurement records its exit
# status and stderr and the script goes on: the report names what failed.
# POSIX sh (the guest runs busybox).
set -u
OUT=$1
. "$OUT/plan.env"
B=$OUT/bin
M=$OUT/models
G=$OUT/guest
rm -rf "$G"
mkdir -p "$G"
export PATH="/rbln/$B:$PATH"

# step NAME CMD...: run CMD with stdout to G/NAME.json, stderr to
# G/NAME.err, status to G/NAME.rc.
step() {
    name=$1; shift
    rc=0
    "$@" >"$G/$name.json" 2>"$G/$name.err" || rc=$?
    echo "$rc" >"$G/$name.rc"
    [ "$rc" = 0 ] || { echo "bench: $name failed (status $rc):"; tail -n 5 "$G/$name.err"; }
    return "$rc"
}

# host_client ARGS...: the harness's host client
# (scripts/bench-host-client.sh: "load ..." runs rbln-serve-load on the
# host, reaching the guest's port 8001 through QEMU user networking;
# "ort NAME" times onnxruntime on NAME, "native" the micro rows' host
# references; scripts/vm.sh VM_HOST_CLIENT) run with ARGS: its output,
# errors and exit status become this command's.
#
# It polls for the answer five times a second for the first two seconds
# (an onnxruntime turn takes about one), then once a second: every poll
# is a fork and exec of busybox's sleep on the emulated CPU, and at 5 polls
# a second for a whole load run those were about a fifth of all guest
# instructions while rbln-serve answered a small model's requests (the
# client times itself on the host, so the poll interval adds nothing to
# its figures).
host_client() {
    rm -f /run/rbln/host-client.rc
    echo "$*" >/run/rbln/host-client.req.tmp && mv /run/rbln/host-client.req.tmp /run/rbln/host-client.req
    k=0
    while [ ! -f /run/rbln/host-client.rc ]; do
        k=$((k + 1))
        [ "$k" -lt 610 ] || { echo "the host client did not answer in 600 s" >&2; return 124; }
        if [ "$k" -le 10 ]; then sleep 0.2 2>/dev/null || sleep 1; else sleep 1; fi
    done
    cat /run/rbln/host-client.out
    cat /run/rbln/host-client.err >&2
    return "$(cat /run/rbln/host-client.rc)"
}

# ort_turn NAME: one turn of the paired onnxruntime reference of NAME
# (scripts/bench-host-client.sh appends its runs to ort.paired.jsonl).
ort_turn() {
    host_client ort "$1" >/dev/null 2>>"$G/$1.ort.err" || echo "bench: onnxruntime for $1 failed (see $1.ort.err)"
}

# native_turn TAG: one turn of the micro rows' host references (gemm
# crate, copy bandwidth), tagged with what it is paired with
# (scripts/bench-host-client.sh appends it to native.paired.jsonl).
native_turn() {
    [ "$paired" = 1 ] || return 0
    host_client native "$1" >/dev/null 2>>"$G/native.err" || echo "bench: host references failed (see native.err)"
}

t0=$(date +%s)
elapsed() { echo "[guest +$(($(date +%s) - t0))s] $*"; }

if ! insmod "$B/rbln.ko"; then
    echo "insmod failed" >"$G/fatal"
    exit 1
fi
cat /sys/devices/system/clocksource/clocksource0/current_clocksource >"$G/clocksource" 2>/dev/null || true
nproc >"$G/cpus"

# Models: timed runs (p50) with one profiled submission, then more (each
# a fresh rbln-run after one warm-up inference) for the median device
# time. Each profiled submission runs the inference PROFILE_RUNS times (or
# more, below) back to back; the report takes the median of the runs'
# spans but each submission's first (the steady state of a loop).
paired=0
grep -q '^8001 ' /run/rbln/forward 2>/dev/null && paired=1
for m in $MODELS $MICRO_MODELS; do
    [ -f "$M/$m.rbln" ] && [ "$m" != "$ASYNC_MODEL" ] || continue
    case " $MICRO_MODELS " in
        *" $m "*) iters=$MICRO_ITERS; warm=$MICRO_WARMUP; profiles=$MICRO_PROFILES ;;
        *) iters=$ITERS; warm=$WARMUP; profiles=$PROFILES ;;
    esac
    elapsed "$m: $iters iterations after $warm warm-up, $profiles profiles"
    # One input file, or .input0.npy, .input1.npy, ... for several.
    if [ -f "$M/$m.input.npy" ]; then
        ins="--input $M/$m.input.npy"
    else
        ins=""
        k=0
        while [ -f "$M/$m.input$k.npy" ]; do ins="$ins --input $M/$m.input$k.npy"; k=$((k + 1)); done
    fi
    # The paired onnxruntime reference, timed on the host now while this
    # guest sleeps (the device idle), and again before each further
    # profile: the host's speed drifts too much over a whole bench for
    # references taken before and after the VM, and by up to 1.6x within
    # seconds (its clock under other tenants' load), so onnxruntime and the
    # device take turns and each figure is the median over all the turns.
    # The micro rows compared with rbln-bench-host take turns with it the
    # same way.
    case " ${NATIVE_MODELS:-} " in *" $m "*) nat=1 ;; *) nat=0 ;; esac
    [ "$paired" = 1 ] && ort_turn "$m"
    [ "$nat" = 1 ] && native_turn "$m"
    # shellcheck disable=SC2086 # $ins is a list of arguments
    step "$m.run" rbln-run "$M/$m.rbln" $ins --output "$G/$m.out.npy" \
        --iterations "$iters" --warmup "$warm" --json --profile "$G/$m.trace.0.json" --profile-runs "${PROFILE_RUNS:-1}" || continue
    # The later submissions of a fast model run more inferences, about
    # PROFILE_BUDGET_MS of them by the timed p50 (at most 40): its first
    # few runs after a start are not yet its steady state.
    runs=${PROFILE_RUNS:-1}
    p50=$(sed -n 's/.*"latency":{[^}]*"p50_ms":\([0-9.e+-]*\).*/\1/p' "$G/$m.run.json")
    if [ -n "$p50" ]; then
        runs=$(awk -v p="$p50" -v lo="$runs" -v b="${PROFILE_BUDGET_MS:-0}" \
            'BEGIN { n = (p > 0) ? int(b / p) : lo; if (n > 40) n = 40; if (n < lo) n = lo; print n }')
    fi
    i=1
    while [ "$i" -lt "$profiles" ]; do
        [ "$paired" = 1 ] && ort_turn "$m"
        [ "$nat" = 1 ] && native_turn "$m"
        # shellcheck disable=SC2086
        step "$m.profile.$i" rbln-run "$M/$m.rbln" $ins --warmup 1 \
            --profile "$G/$m.trace.$i.json" --profile-runs "$runs" || break
        i=$((i + 1))
    done
done

elapsed "DMA host <-> DRAM: $DMA_SIZES bytes"
native_turn dma
args=""
for s in $DMA_SIZES; do args="$args --size $s"; done
# shellcheck disable=SC2086
step dma rbln-bench-guest dma $args --reps "$DMA_REPS" || true

elapsed "NOP submit -> fence latency"
step latency rbln-bench-guest latency --runs "$LAT_RUNS" --warmup "$LAT_WARMUP" || true

a=$ASYNC_MODEL
if [ -f "$M/$a.rbln" ]; then
    for p in 1 2; do
        elapsed "AsyncRuntime parallel $p: $ASYNC_ITERS iterations"
        step "async.p$p" rbln-run "$M/$a.rbln" --input "$M/$a.input.npy" --async --parallel "$p" \
            --iterations "$ASYNC_ITERS" --warmup "$ASYNC_WARMUP" --json || true
    done
fi

# Decoders: rbln-generate (greedy, the KV cache on the device), DEC_RUNS
# generations of DEC_TOKENS tokens each after one warm-up, one sequence
# alone and DEC_SEQS sequences under continuous batching.
for d in $DECODERS; do
    [ -f "$M/$d-decoder.rbln" ] || continue
    elapsed "decoder $d: $DEC_RUNS generations of $DEC_TOKENS tokens, alone and $DEC_SEQS at once"
    p=$(cat "$M/$d-decoder.prompt.txt")
    many=""
    j=0
    while [ "$j" -lt "$DEC_SEQS" ]; do many="$many --prompt-ids $p"; j=$((j + 1)); done
    i=0
    while [ "$i" -le "$DEC_RUNS" ]; do
        step "decoder.$d.$i" rbln-generate "$M/$d-decoder.rbln" --prompt-ids "$p" --max-new-tokens "$DEC_TOKENS" --json || break
        step "decoder-batch.$d.$i" rbln-generate "$M/$d-decoder.rbln" $many --max-new-tokens "$DEC_TOKENS" --json || break
        i=$((i + 1))
    done
done

# The Python SDK (target/guest-python) against the Rust runtime on the
# same model and input, run back to back: Runtime.run vs rbln-run's
# latency, async_run under asyncio vs rbln-run --async --parallel 2.
for m in $PY_MODELS; do
    [ -f "$M/$m.rbln" ] || continue
    elapsed "Python SDK vs Rust runtime: $m"
    step "py.$m.rust-sync" rbln-run "$M/$m.rbln" --input "$M/$m.input.npy" \
        --iterations "$PY_ITERS" --warmup "$PY_WARMUP" --json || true
    step "py.$m.rust-async" rbln-run "$M/$m.rbln" --input "$M/$m.input.npy" --async --parallel 2 \
        --iterations "$((PY_REQUESTS * PY_ROUNDS))" --warmup "$PY_REQUESTS" --json || true
    step "py.$m.python" /rbln/target/guest-python/bin/python3 tests/bench/python_bench.py \
        "$M/$m.rbln" "$M/$m.input.npy" --iterations "$PY_ITERS" --warmup "$PY_WARMUP" \
        --requests "$PY_REQUESTS" --rounds "$PY_ROUNDS" || true
done

# rbln-serve (2 instances of each model) under rbln-serve-load at each
# concurrency, and rbln-run --async --parallel 2 (the same AsyncRuntime
# without the server) on the same model right before: the throughput the
# server is to come near. The load client runs on the host (its gRPC
# connection forwarded to the guest's port 8001) when the harness offers
# one, as a client would on a real machine: in the guest it would take
# the emulated CPUs the server runs on. Without it, it runs in the guest.
if [ -n "$SERVE_MODELS" ]; then
    ip link set lo up
    client=guest load=rbln-serve-load
    [ "$paired" = 1 ] && client=host load="host_client load"
    echo "$client" >"$G/serve.client"
    R=/tmp/bench-repo
    rm -rf "$R"
    for m in $SERVE_MODELS; do
        [ -f "$M/$m.rbln" ] && mkdir -p "$R/$m/1" && cp "$M/$m.rbln" "$R/$m/1/model.rbln"
    done
    rbln-serve --model-repository "$R" --host 0.0.0.0 --max-queue 256 >"$G/serve.log" 2>&1 &
    spid=$!
    k=0
    until wget -q -O /dev/null http://127.0.0.1:8000/v2/health/ready 2>/dev/null; do
        k=$((k + 1))
        if [ "$k" -gt 600 ] || ! kill -0 "$spid" 2>/dev/null; then echo "rbln-serve did not start" >"$G/serve.fatal"; break; fi
        sleep 0.2
    done
    for m in $SERVE_MODELS; do
        [ -f "$M/$m.rbln" ] && [ ! -f "$G/serve.fatal" ] || continue
        exp=""
        [ -f "$M/$m.ort.npy" ] && exp="--expected $M/$m.ort.npy --tol 1e-3"
        elapsed "rbln-serve vs rbln-run --async: $m, concurrency $SERVE_CONC"
        step "serve.$m.async" rbln-run "$M/$m.rbln" --input "$M/$m.input.npy" --async --parallel 2 \
            --iterations "$SERVE_REQUESTS" --warmup 5 --json || true
        for c in $SERVE_CONC; do
            # shellcheck disable=SC2086 # $exp is a list of arguments
            step "serve.$m.c$c" $load "$m" --input "$M/$m.input.npy" $exp \
                --requests "$SERVE_REQUESTS" --concurrency "$c" --json || true
        done
    done
    kill -TERM "$spid" 2>/dev/null
    wait "$spid" || echo "rbln-serve exited with status $?" >>"$G/serve.log"
fi

rmmod rbln || echo "rmmod failed" >"$G/rmmod-failed"
elapsed "done"
echo done >"$G/complete"
sync
