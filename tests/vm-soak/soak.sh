# The soak (`make soak`, scripts/soak.sh): for SOAK_SECONDS (default 1800),
# four processes work the device at once — models through rbln-run
# (synchronous and AsyncRuntime parallel=2, outputs checked), GEMMs by
# user-mode submission (the C example), and a latency probe of back-to-back
# jobs (a lost fence fails it) — while a fifth faults its own jobs on
# purpose every few seconds and the harness injects device faults every
# minute (lost, late and spurious interrupts). At the end: no worker
# failed, nothing is left allocated, and the probe's latency is printed
# per minute. Needs target/models and target/c-examples (scripts/soak.sh).
. tests/vm/lib.sh

S=${SOAK_SECONDS:-1800}
m=target/models
state=/sys/kernel/debug/rbln0/state
out=/tmp/soak
mkdir -p $out
export LD_LIBRARY_PATH=/rbln/target/release

# Ask the harness's debug control of device model 0 (scripts/vm.sh).
npu_ctl() {
    rm -f /run/rbln/ctl-npu0.reply
    echo "$1" >/run/rbln/ctl-npu0.req.tmp && mv /run/rbln/ctl-npu0.req.tmp /run/rbln/ctl-npu0.req
    i=0
    while [ ! -e /run/rbln/ctl-npu0.reply ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    cat /run/rbln/ctl-npu0.reply 2>/dev/null || echo "error: no reply"
}

check "insmod rbln.ko" insmod "$RBLN_KO"
leak_lines() { grep -E '^(contexts_open|queues_in_use|bos|host_bo_bytes|dram_free_bytes):' $state; }
before=$(leak_lines)
end=$(($(date +%s) + S))

# loop NAME CMD...: run CMD until the end, counting passes and failures.
loop() {
    name=$1; shift
    ok=0; bad=0
    while [ "$(date +%s)" -lt $end ]; do
        if "$@" >$out/$name.last 2>&1; then ok=$((ok + 1)); else bad=$((bad + 1)); cp $out/$name.last $out/$name.fail.$bad; fi
    done
    echo "$ok $bad" >$out/$name.count
}
run_models() {
    rbln-run $m/mlp.rbln --input $m/mlp.input.npy --output $out/mlp.npy --iterations 20 >/dev/null &&
        rbln-example-models compare $out/mlp.npy $m/mlp.expected.npy 1e-4 &&
        rbln-run $m/cnn.rbln --input $m/cnn.input.npy --output $out/cnn.npy --iterations 5 >/dev/null &&
        rbln-example-models compare $out/cnn.npy $m/cnn.expected.npy 1e-4
}
run_async() {
    rbln-run $m/mlp-wide.rbln --async --parallel 2 --input $m/mlp-wide.input.npy --output $out/wide.npy --iterations 16 >/dev/null &&
        rbln-example-models compare $out/wide.npy $m/mlp-wide.expected.npy 1e-4
}
# A job that faults (its context is poisoned and dropped): EIO expected.
run_faulting() {
    rbln-kmd-tests fault_isolation >/dev/null 2>&1 || return 1
    sleep 2
}

loop models run_models &
loop async run_async &
loop user target/c-examples/gemm user &
loop faulting run_faulting &
RBLN_SOAK_SECONDS=$S rbln-kmd-tests latency_probe >$out/probe.txt 2>&1 &
probe=$!

# Device faults from the harness, one kind a minute, none of which may
# fail a job: lost, late and spurious interrupts.
n=0
while [ "$(date +%s)" -lt $((end - 30)) ]; do
    sleep 60
    case $((n % 3)) in
        0) plan="irq-drop:count=5" ;;
        1) plan="irq-delay:ms=300,count=5" ;;
        2) plan="irq-spurious:count=50" ;;
    esac
    echo "# minute $((n + 1)): inject $plan: $(npu_ctl "inject $plan")"
    n=$((n + 1))
done
wait
echo "# device faults injected: $(npu_ctl status)"
cat $out/probe.txt
for w in models async user faulting; do
    read -r ok bad <$out/$w.count
    echo "# $w: $ok passes, $bad failures"
    if [ "$bad" != 0 ]; then echo "# $w's last failure:"; sed 's/^/#   /' $out/$w.fail.$bad | tail -5; fi
    check "$w: no failure in ${S}s" test "$bad" = 0 -a "$ok" -gt 0
done
check "latency probe: no fence lost" grep -q "^ok - latency_probe" $out/probe.txt
sleep 1
after=$(leak_lines)
echo "$after" | sed 's/^/# after: /'
check "nothing left allocated after the soak" test "$before" = "$after"
grep -E '^(interrupts|interrupts_spurious|fences_found_by_polling|faults_found_by_polling|status_blocks_refused|hw_faults)' $state | sed 's/^/# /'
check "rmmod rbln" rmmod rbln
