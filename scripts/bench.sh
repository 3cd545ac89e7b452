#!/usr/bin/env bash
# `make bench`: the virtual NPU against onnxruntime on the same host cores.
# One run: builds the models, times onnxruntime and the host references,
# boots one VM for every device measurement (tests/bench/guest.sh), then
# prints the table and writes $BENCH_OUT/report.json (README.md,
# "Benchmarks", says what it holds). Speed is never asserted; a model that
# does not compile or run is reported with an error and the rest goes on.
#
# Environment:
#   BENCH_SMOKE=1       tiny sizes, one small model (+ a tiny BERT), and a
#                       completeness check of the report (make test runs it)
#   BENCH_OUT           output directory, relative to the repo (default
#                       target/bench, target/bench-smoke with BENCH_SMOKE=1)
#   BENCH_MODELS        models to run instead of the default list (names of
#                       tests/models/gen_models.py or bench_models.py)
#   BENCH_ITERS, BENCH_PROFILES   timed inferences (default 20) and
#                       profiled inferences (default 5) per model
#   BENCH_PROFILE_RUNS  inferences each profiled submission runs back to back
#                       (default 3; rbln-run --profile-runs); device_ms is
#                       the median of their spans but each submission's
#                       first: the steady state of a loop, as onnxruntime's
#                       median is
#   BENCH_PROFILE_BUDGET_MS  fast models' later submissions run more: as many
#                       as take about this long by the model's timed p50
#                       (default 30, at most 40 runs)
#   BENCH_THREADS       onnxruntime's intra-op threads and the host
#                       references' threads (default: the device model's
#                       compute threads, i.e. its rayon pool: RAYON_NUM_THREADS
#                       or one per host core)
#   BENCH_KERNEL        guest kernel flavor (scripts/build-kernel.sh): default
#                       "bench" (no lockdep, optimised for speed; built once
#                       into RBLN_CACHE, about 10-15 min), and with
#                       BENCH_SMOKE=1 "" (the test kernel make test has
#                       already built); the module is built for it
#   BENCH_SKIP_BUILD=1  do not run cargo build first (make bench builds the
#                       workspace itself); the module for BENCH_KERNEL is
#                       still built
#   BENCH_NO_VM=1       host side only (the device rows then show errors)
#   BENCH_VM_SMP        the guest's vCPUs (default 1; see below)
#   RBLN_NO_AVX512=1    the device model's kernels as on an AVX2 host
#                       (machine.kernels_isa in the report, from
#                       rbln-bench-host, says which ran)
#   VM_TIMEOUT          seconds for the VM (default here 900 + 40 per model)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

SMOKE=${BENCH_SMOKE:-0}
if [[ $SMOKE == 1 ]]; then OUT_REL=${BENCH_OUT:-target/bench-smoke}; else OUT_REL=${BENCH_OUT:-target/bench}; fi
# Timings come from a kernel configured as a deployment's would be: the
# test kernel's lockdep executes more guest instructions than the stack
# itself on every ioctl, interrupt and socket call (guest-kernel-bench.config).
if [[ $SMOKE == 1 ]]; then KERNEL=${BENCH_KERNEL-}; else KERNEL=${BENCH_KERNEL-bench}; fi
KMD_KO=kmd/rbln.ko
[[ -z $KERNEL ]] || KMD_KO=target/kmd-$KERNEL/kmd/rbln.ko
[[ $OUT_REL != /* && $OUT_REL != *..* ]] || die "BENCH_OUT must be a path inside the repo, relative to it"
OUT=$RBLN_ROOT/$OUT_REL
# The device model runs a queue's kernels on a pool of one thread per host
# core unless RAYON_NUM_THREADS says otherwise (vm.sh passes the
# environment on). onnxruntime and the host references get as many.
THREADS=${BENCH_THREADS:-${RAYON_NUM_THREADS:-$(nproc)}}
# The device model's compute cores (rbln-npu --cores, default 2; vm.sh adds
# NPU_ARGS).
CORES=$(sed -n 's/.*--cores[ =]\([0-9]*\).*/\1/p' <<<"${NPU_ARGS:-}")
CORES=${CORES:-2}
# The guest's vCPUs. Every vCPU is a host thread beside the device model's
# compute threads on this 2-core machine: with a second one, the guest's
# idle-time work (scheduler and RCU softirqs, QEMU's main loop for two
# CPUs) preempted the compute threads twice as often (their involuntary
# context switches, 8 s of a ResNet-50 loop: 814 -> 1602) and ResNet-50's
# device time rose from 60-71 to 80-84 ms (3 alternated boots each), while
# rbln-serve and the transfer-bound AsyncRuntime rows gained from the
# second vCPU (stop 47's note). The device is what is measured against
# onnxruntime on these cores: one vCPU, as in every figure before stop 47.
VM_SMP_BENCH=${BENCH_VM_SMP:-1}

# The test models are those tests/compiler/compile-models.sh compiles.
test_models() {
    local line
    line=$(grep -m1 -E '^for m in [a-z0-9 _-]+; do' "$RBLN_ROOT/tests/compiler/compile-models.sh") \
        || die "cannot find the model list in tests/compiler/compile-models.sh"
    line=${line#for m in }
    echo "${line%%; do*}"
}

if [[ $SMOKE == 1 ]]; then
    TEST_MODELS=resnet
    BENCH_MODELS_LIST=bert-tiny
    ITERS=3 WARMUP=1 PROFILES=2 PROFILE_RUNS=${BENCH_PROFILE_RUNS:-2} PROFILE_BUDGET_MS=0
    MICRO_ITERS=1 MICRO_WARMUP=0 MICRO_PROFILES=2
    DMA_SIZES="65536 1048576" DMA_REPS=3
    LAT_RUNS=20 LAT_WARMUP=5
    ASYNC_ITERS=4 ASYNC_WARMUP=1
    PY_MODELS=micro-mlp PY_ITERS=10 PY_WARMUP=2 PY_REQUESTS=10 PY_ROUNDS=1
    SERVE_MODELS=micro-mlp SERVE_CONC=2 SERVE_REQUESTS=10
    ORT_ARGS=(--warmup 1 --min-runs 3 --max-runs 10 --budget 0.5)
    PAIRED_ORT_ARGS=("${ORT_ARGS[@]}")
    NATIVE_ARGS=(--gemm 64 --reps 3)
else
    TEST_MODELS=$(test_models)
    # resnet50-int8: resnet50 quantised by onnxruntime's quantize_static;
    # resnet50-int8r: with reduce_range (7-bit weights).
    BENCH_MODELS_LIST="resnet50 resnet50-int8 resnet50-int8r mobilenetv3-small efficientnet-b0 bert-l12-h384"
    ITERS=${BENCH_ITERS:-20} WARMUP=2 PROFILES=${BENCH_PROFILES:-5} PROFILE_RUNS=${BENCH_PROFILE_RUNS:-3}
    # A fast model's profiled submissions run more inferences back to
    # back, about this much of rbln-run time each (at most 40): three runs
    # of a 0.2 ms model are not yet a steady state (measured: the test
    # resnet's 2nd and 3rd runs 0.27-0.37 ms after a fresh start, 0.19-0.21
    # from the 5th on), while onnxruntime's turns get 3 warm-ups and up to
    # 60 runs.
    PROFILE_BUDGET_MS=${BENCH_PROFILE_BUDGET_MS:-30}
    MICRO_ITERS=3 MICRO_WARMUP=1 MICRO_PROFILES=5
    DMA_SIZES="16777216 1048576" DMA_REPS=9
    LAT_RUNS=300 LAT_WARMUP=30
    ASYNC_ITERS=30 ASYNC_WARMUP=3
    # The Python SDK against the Rust runtime on a small model (per-call
    # costs) and a CNN (the common case).
    PY_MODELS="micro-mlp resnet18" PY_ITERS=100 PY_WARMUP=10 PY_REQUESTS=100 PY_ROUNDS=3
    # rbln-serve under a bounded gRPC load (rbln-serve-load) at several
    # concurrencies against rbln-run --async on the same model and device.
    SERVE_MODELS="micro-mlp resnet18" SERVE_CONC="1 4 8" SERVE_REQUESTS=100
    ORT_ARGS=(--warmup 3 --min-runs 8 --max-runs 60 --budget 2)
    # One turn of the paired reference (before each of a model's profiles,
    # tests/bench/guest.sh): as warm as ORT_ARGS' runs, a quarter of the
    # time (fast models still get their 60 runs).
    PAIRED_ORT_ARGS=(--warmup 3 --min-runs 5 --max-runs 60 --budget 0.5)
    NATIVE_ARGS=(--gemm 1024 --reps 11)
fi
# The real PyTorch exports of tests/compiler/compile-exports.sh, benched as
# export-NAME when target/exports holds them (make test builds them; so
# does that script alone).
export_models() {
    local m
    for m in $(sed -n 's/^MODELS=(\(.*\))$/\1/p' "$RBLN_ROOT/tests/compiler/compile-exports.sh"); do
        if [[ -f $RBLN_ROOT/target/exports/$m.onnx ]]; then echo "export-$m"; fi
    done
}
EXPORT_MODELS_LIST=""
[[ $SMOKE == 1 ]] || EXPORT_MODELS_LIST=$(export_models | tr '\n' ' ')
# The decoders of tests/models/exports/export_decoder.py (one .rbln of
# entry points each), when target/exports holds them: time to first token
# and decode tokens/s of rbln-generate, alone and with continuous batching
# of DEC_SEQS sequences, against onnxruntime running the same programs
# with the KV cache on the host.
DECODERS=""
for d in gpt2 llama; do
    [[ -f $RBLN_ROOT/target/exports/$d-decoder.rbln ]] && DECODERS+="${DECODERS:+ }$d"
done
DEC_SEQS=4
if [[ $SMOKE == 1 ]]; then DEC_TOKENS=8 DEC_RUNS=1; else DEC_TOKENS=64 DEC_RUNS=3; fi
if [[ -n ${BENCH_MODELS:-} ]]; then
    all_tests=" $(test_models) "
    TEST_MODELS="" BENCH_MODELS_LIST="" EXPORT_MODELS_LIST=""
    for m in $BENCH_MODELS; do
        if [[ $m == export-* ]]; then EXPORT_MODELS_LIST+="${EXPORT_MODELS_LIST:+ }$m"
        elif [[ $all_tests == *" $m "* ]]; then TEST_MODELS+="${TEST_MODELS:+ }$m"; else BENCH_MODELS_LIST+="${BENCH_MODELS_LIST:+ }$m"; fi
    done
fi
MICRO_MODELS="micro-gemm micro-gemm-int8 micro-gemm-int8r micro-attention-triton micro-attention-builtin micro-conv micro-add micro-relu"
# The micro models compared with rbln-bench-host (gemm crate, copy): the
# guest has it timed right before each of their profiles.
NATIVE_MODELS="micro-gemm micro-add"
# Python and serving rows need their models generated; resnet18 is a test
# model.
for m in $PY_MODELS $SERVE_MODELS; do
    case " $TEST_MODELS $BENCH_MODELS_LIST $MICRO_MODELS resnet18 " in *" $m "*) ;; *) MICRO_MODELS+=" $m" ;; esac
done
[[ " $TEST_MODELS " == *" resnet18 "* ]] || { PY_MODELS=${PY_MODELS//resnet18/}; SERVE_MODELS=${SERVE_MODELS//resnet18/}; }
ASYNC_MODEL=micro-relu  # only run with --async (guest.sh)
# The host copy reference covers the Add's tensor size and the DMA sizes.
if [[ $SMOKE == 1 ]]; then ADD_BYTES=$((4 * 4 * 32 * 32)); else ADD_BYTES=$((4 * 64 * 256 * 256)); fi
read -r -a COPY_SIZES <<<"$(printf '%s\n' $ADD_BYTES $DMA_SIZES | sort -nu | tr '\n' ' ')"
for s in "${COPY_SIZES[@]}"; do NATIVE_ARGS+=(--copy "$s"); done

# Other work on the machine moves every number. cpu_mark VAR stores in VAR
# what phase_end needs: wall ns, busy and steal ticks of all CPUs
# (/proc/stat), and the CPU seconds this script's finished children used
# (`times`, run in this shell: a subshell would not see them).
cpu_mark() {
    local _c u n sy idle iow irq sirq st rest children
    read -r _c u n sy idle iow irq sirq st rest </proc/stat
    times >"$OUT/.times"
    children=$(tail -n 1 "$OUT/.times" | awk '
        function sec(t) { split(t, a, /[ms]/); return a[1] * 60 + a[2] }
        { printf "%.3f", sec($1) + sec($2) }')
    printf -v "$1" '%s %s %s %s' "$(date +%s%N)" $((u + n + sy + irq + sirq)) "$st" "$children"
}

# phase_end NAME MARK: record in machine.env the share of the machine's CPU
# time since MARK that other processes used (busy time not ours) and that
# the hypervisor stole.
phase_end() {
    local name=$1 w0 b0 s0 c0 w1 b1 s1 c1 now
    read -r w0 b0 s0 c0 <<<"$2"
    cpu_mark now
    read -r w1 b1 s1 c1 <<<"$now"
    awk -v w="$((w1 - w0))" -v b="$((b1 - b0))" -v s="$((s1 - s0))" -v c0="$c0" -v c1="$c1" \
        -v hz="$(getconf CLK_TCK)" -v n="$(nproc)" -v name="$name" 'BEGIN {
            cap = w / 1e9 * n; other = (b / hz - (c1 - c0)) / cap; if (other < 0) other = 0
            printf "others_cpu_%s=%.3f\nsteal_cpu_%s=%.3f\n", name, other, name, s / hz / cap }' \
        >>"$OUT/machine.env"
}

# host_references PHASE: onnxruntime on every model, then the gemm crate
# and copy bandwidth, into OUT/host/{ort,native}.PHASE.*
host_references() {
    local phase=$1 mark
    cpu_mark mark
    log "onnxruntime on $THREADS threads (ORT_ENABLE_ALL, sequential), $phase the VM"
    "$PY" "$RBLN_ROOT/tests/models/bench_models.py" ort "$OUT/models" --threads "$THREADS" "${ORT_ARGS[@]}" \
        "${all[@]}" >"$OUT/host/ort.$phase.jsonl"
    if [[ -n $DECODERS ]]; then
        # shellcheck disable=SC2086 # a list of names
        "$PY" "$RBLN_ROOT/tests/models/bench_models.py" decoder-ort "$OUT/models" --threads "$THREADS" \
            --new-tokens "$DEC_TOKENS" --runs "$DEC_RUNS" --seqs "$DEC_SEQS" $DECODERS >"$OUT/host/decoder.$phase.jsonl"
    fi
    log "host references: gemm crate, copy bandwidth ($THREADS threads), $phase the VM"
    "$RBLN_ROOT/target/release/rbln-bench-host" --threads "$THREADS" "${NATIVE_ARGS[@]}" \
        >"$OUT/host/native.$phase.json"
    phase_end "host_$phase" "$mark"
}

main() {
    local t0=$SECONDS
    if [[ ${BENCH_SKIP_BUILD:-0} != 1 ]]; then
        log "building (cargo build --release --workspace)"
        cargo build --release --workspace --quiet
    fi
    # `make bench` builds the workspace and the test kernel's module; the
    # module for another kernel (and that kernel, the first time) is built
    # here.
    if [[ ${BENCH_SKIP_BUILD:-0} != 1 || (-n $KERNEL && ${BENCH_NO_VM:-0} != 1) ]]; then
        KERNEL_FLAVOR=$KERNEL "$RBLN_ROOT/scripts/build-kmd.sh"
    fi
    # The guest's Python with the rbln wheel (the Python SDK rows); quick
    # when nothing changed.
    local pyout
    pyout=$("$RBLN_ROOT/scripts/build-guest-python.sh" 2>&1) || { echo "$pyout" >&2; die "scripts/build-guest-python.sh failed"; }
    PY=$("$RBLN_ROOT/scripts/setup-python.sh" | tail -n 1)

    rm -rf "$OUT"
    mkdir -p "$OUT/models" "$OUT/host" "$OUT/bin"
    # The guest runs these copies, so a rebuild by someone else during the
    # run does not change what is measured.
    local b
    for b in rbln-run rbln-bench-guest rbln-serve rbln-serve-load; do
        cp "$RBLN_ROOT/target/release/$b" "$OUT/bin/" || die "target/release/$b is missing: run 'make host'"
    done
    if [[ ${BENCH_NO_VM:-0} != 1 ]]; then
        cp "$RBLN_ROOT/$KMD_KO" "$OUT/bin/" || die "$KMD_KO is missing: run 'KERNEL_FLAVOR=$KERNEL scripts/build-kmd.sh'"
    fi
    {
        echo "host_cpus=$(nproc)"
        echo "guest_kernel='${KERNEL:-test}'"
        echo "device_cores=$CORES"
        echo "cpu_model='$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1 | tr -d "'")'"
        echo "loadavg_at_start='$(cut -d' ' -f1-3 /proc/loadavg)'"
        echo "git_commit=$(git -C "$RBLN_ROOT" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
        echo "git_dirty_files=$(git -C "$RBLN_ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)"
        echo "rbln_npu_sha256=$(sha256sum "$RBLN_ROOT/target/release/rbln-npu" | cut -c1-16)"
    } >"$OUT/machine.env"

    local generated=($TEST_MODELS $BENCH_MODELS_LIST $MICRO_MODELS)
    log "generating ${#generated[@]} ONNX models ($OUT_REL/models)"
    local smoke_flag=()
    [[ $SMOKE == 1 ]] && smoke_flag=(--smoke)
    # The Triton attention kernel's TTIR (tests/triton/kernels.py, cached
    # like tests/triton/check.sh's) for the micro-attention-* models.
    local ttir_dir
    ttir_dir=$(source "$RBLN_ROOT/tests/compiler/lib.sh" && EXPORT_DEPS=$RBLN_ROOT/python/rbln/_ttir.py \
        cached_exports ttir "$RBLN_ROOT/tests/triton/requirements.txt" "$RBLN_ROOT/tests/triton/kernels.py") \
        || die "printing the Triton kernels' TTIR failed"
    RBLN_TTIR_DIR=$ttir_dir "$PY" "$RBLN_ROOT/tests/models/bench_models.py" gen "$OUT/models" "${smoke_flag[@]}" "${generated[@]}"
    local e f
    for e in $EXPORT_MODELS_LIST; do
        for f in "$RBLN_ROOT/target/exports/${e#export-}".{onnx,input*.npy}; do
            [[ -f $f ]] || die "$f is missing: run tests/compiler/compile-exports.sh"
            cp "$f" "$OUT/models/$e${f#"$RBLN_ROOT/target/exports/${e#export-}"}"
        done
    done
    all=("${generated[@]}" $EXPORT_MODELS_LIST)
    for d in $DECODERS; do
        for f in "$RBLN_ROOT/target/exports/$d"-{decoder.rbln,decoder.prompt.txt,prefill-8.onnx,decode.onnx,prefill-slot-8.onnx,decode-batch.onnx}; do
            cp "$f" "$OUT/models/" || die "$f is missing: run tests/compiler/compile-exports.sh"
        done
    done

    local m rc
    for m in "${all[@]}"; do
        rc=0
        "$RBLN_ROOT/target/release/rbln-compile" "$OUT/models/$m.onnx" -o "$OUT/models/$m.rbln" --json \
            >"$OUT/models/$m.report.json" 2>"$OUT/models/$m.compile.err" || rc=$?
        echo "$rc" >"$OUT/models/$m.compile.rc"
        if [[ $rc != 0 ]]; then
            warn "rbln-compile $m failed (status $rc): $(tail -n 1 "$OUT/models/$m.compile.err")"
        fi
    done

    # Host references before and after the VM (never while it runs): the
    # report pools both, and their difference shows drift of the machine.
    host_references before
    {
        local v
        for v in SMOKE THREADS TEST_MODELS BENCH_MODELS_LIST EXPORT_MODELS_LIST MICRO_MODELS NATIVE_MODELS ITERS WARMUP PROFILES PROFILE_RUNS \
            PROFILE_BUDGET_MS MICRO_ITERS MICRO_WARMUP MICRO_PROFILES DMA_SIZES DMA_REPS LAT_RUNS LAT_WARMUP \
            ASYNC_MODEL ASYNC_ITERS ASYNC_WARMUP PY_MODELS PY_ITERS PY_WARMUP PY_REQUESTS PY_ROUNDS \
            SERVE_MODELS SERVE_CONC SERVE_REQUESTS DECODERS DEC_TOKENS DEC_RUNS DEC_SEQS; do
            echo "${v%_LIST}='${!v}'"
        done
        echo "MODELS='$TEST_MODELS $BENCH_MODELS_LIST $EXPORT_MODELS_LIST'"
    } >"$OUT/plan.env"

    echo "loadavg_before_vm='$(cut -d' ' -f1-3 /proc/loadavg)'" >>"$OUT/machine.env"
    local mark
    cpu_mark mark
    rc=0
    if [[ ${BENCH_NO_VM:-0} == 1 ]]; then
        log "BENCH_NO_VM=1: no device measurements"
        rc=-1
    else
        log "device measurements: one VM boot (tests/bench/guest.sh)"
        # The rbln-serve rows' load client runs here on the host, reaching
        # the guest's gRPC port through QEMU user networking.
        # The same channel brings the guest's requests for onnxruntime
        # before each of a model's profiles, and for the micro rows' host
        # references before each profile of the micro models compared with
        # them and before the DMA step (scripts/bench-host-client.sh).
        rm -f "$OUT/host/ort.paired.jsonl" "$OUT/host/native.paired.jsonl"
        # The guest's time grows with the models: 62 (with the exports)
        # took 1100 s on an AVX2 host before the Python and serve rows, past
        # a fixed 1200 s limit. The limit only catches a hung guest.
        read -r -a _models <<<"$TEST_MODELS $BENCH_MODELS_LIST $EXPORT_MODELS_LIST"
        vm_timeout=$((900 + 40 * ${#_models[@]}))
        BENCH_HOST_OUT=$OUT BENCH_HOST_PY=$PY BENCH_HOST_THREADS=$THREADS BENCH_HOST_ORT_ARGS="${PAIRED_ORT_ARGS[*]}" \
        BENCH_HOST_NATIVE_ARGS="${NATIVE_ARGS[*]}" \
        VM_FORWARD=8001 VM_HOST_CLIENT="$RBLN_ROOT/scripts/bench-host-client.sh http://{8001}" \
            VM_KERNEL=$KERNEL VM_SMP=$VM_SMP_BENCH VM_TIMEOUT=${VM_TIMEOUT:-$vm_timeout} "$RBLN_ROOT/scripts/vm.sh" "sh tests/bench/guest.sh $OUT_REL" \
            2>&1 | tee "$OUT/vm.log" || rc=${PIPESTATUS[0]}
    fi
    echo "$rc" >"$OUT/vm.rc"
    phase_end vm "$mark"
    echo "loadavg_after_vm='$(cut -d' ' -f1-3 /proc/loadavg)'" >>"$OUT/machine.env"
    host_references after
    [[ $rc == 0 ]] || warn "the VM run failed (status $rc); the report shows what is missing"

    "$PY" "$RBLN_ROOT/tests/models/bench_report.py" "$OUT"
    log "report: $OUT_REL/report.json ($((SECONDS - t0)) s)"
    if [[ $SMOKE == 1 ]]; then
        "$PY" "$RBLN_ROOT/tests/models/bench_report.py" --check "$OUT/report.json"
        [[ $rc == 0 ]] || die "the VM run failed (status $rc)"
    fi
}

main "$@"
