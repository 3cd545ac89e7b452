# Real exports (tests/compiler/compile-exports.sh, run on the host first):
# PyTorch models from torchvision, transformers and ultralytics run on the
# NPU through rbln-run and match onnxruntime's outputs within
# |got - want| <= tol * (1 + |want|), tol from NAME.tol: 1e-4, or three
# times the reference's own noise where that is larger (export_torch.py's
# `tolerance`; the exporter prints it per model).
. tests/vm/lib.sh
o=target/exports

check "exported models were compiled on the host" test -f $o/yolov8n.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"

# run NAME TOL: one inference of NAME with its saved inputs, compared.
run() {
    m=$1 tol=$2 ins=""
    if [ -f $o/$m.input.npy ]; then ins="--input $o/$m.input.npy"; else
        i=0; while [ -f $o/$m.input$i.npy ]; do ins="$ins --input $o/$m.input$i.npy"; i=$((i + 1)); done
    fi
    check "$m: rbln-run" rbln-run $o/$m.rbln $ins --output /tmp/$m.npy
    rc=0; rbln-example-models compare /tmp/$m.npy $o/$m.expected.npy "$tol" >/tmp/cmp 2>&1 || rc=$?
    sed "s/^/# $m: /" /tmp/cmp
    check "$m matches onnxruntime (tol $tol)" test $rc = 0
}

# Every model tests/compiler/compile-exports.sh compiled (its MODELS list);
# the decoders (NAME-decoder.rbln, several entry points) are generated
# with by tests/vm/decoder.sh instead.
n=0
for r in $o/*.rbln; do
    m=$(basename $r .rbln)
    case $m in *-decoder) continue ;; esac
    run $m "$(cat $o/$m.tol)"
    n=$((n + 1))
done
check "all $n compiled exports ran (at least 30)" test $n -ge 30
# Profiling a long program (Swin V2: hundreds of device ops even with
# element-wise chains fused): one timestamp pair per op fits the profiled
# submission.
long_ops=$(rbln-run $o/swin_v2_t.rbln --inspect --json | grep -o '"ops":\[[^]]*\]' | head -n 1 | grep -o '"count":[0-9]*' | awk -F: '{s += $2} END {print s + 0}')
check "--profile traces every op of Swin V2 ($long_ops ops)" sh -c \
    "test $long_ops -ge 300 && rbln-run $o/swin_v2_t.rbln --input $o/swin_v2_t.input.npy --profile /tmp/long.json >/dev/null && test \$(grep -o '\"ph\":\"X\"' /tmp/long.json | wc -l) -ge $long_ops"
# Recurrent layers run as one RECURRENT op per direction (plus the input
# projection and output copies), not several ops per step: the tagger
# (two bidirectional LSTM layers and a GRU over 12 steps) took 307 ops
# unrolled.
tagger_ops=$(rbln-run $o/lstm_tagger.rbln --inspect --json | grep -o '"ops":\[[^]]*\]' | head -n 1 | grep -o '"count":[0-9]*' | awk -F: '{s += $2} END {print s + 0}')
check "the LSTM tagger's recurrent layers are not unrolled ($tagger_ops ops)" test "$tagger_ops" -gt 0 -a "$tagger_ops" -le 60
# The tutorial's concurrent workload: YOLOv8n through AsyncRuntime with two
# requests in flight.
check "yolov8n through AsyncRuntime (parallel 2) matches" sh -c \
    "rbln-run $o/yolov8n.rbln --async --parallel 2 --input $o/yolov8n.input.npy --output /tmp/ya.npy --iterations 4 >/dev/null && rbln-example-models compare /tmp/ya.npy $o/yolov8n.expected.npy $(cat $o/yolov8n.tol)"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
