# rbln-serve on the NPU, driven by the official Open Inference Protocol
# clients (tritonclient HTTP and gRPC, in the guest's python) and by raw
# HTTP: metadata, inference (JSON, binary extension, gRPC raw and typed)
# matching the references, the repository extension, every bad-input
# case, the queue bound, timeouts and metrics (tests/serve/client.py);
# unloading every model gives every device resource back while the server
# runs; SIGTERM shuts it down cleanly.
. tests/vm/lib.sh
m=target/models
o=target/onnx
R=/tmp/repo
LOG=/tmp/rbln-serve.log

check "rbln-serve is built (target/release)" test -x target/release/rbln-serve
check "the guest python has tritonclient (python/guest-requirements.txt)" python3 -c "import tritonclient.http, tritonclient.grpc"
check "test models were built on the host" test -f $m/mlp.rbln -a -f $m/cnn.rbln -a -f $o/bert-ids.rbln -a -f target/exports/yolov8n.rbln -a -f target/exports/unet.rbln -a -f $o/dynamic-batch.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
check "loopback up" ip link set lo up

# The repository: mlp in versions 1 and 2 (2 is served), cnn with one
# instance and a queue of 1, bert-ids (INT64 inputs), yolo-timeout (the
# YOLOv8n export at 640x640, ~400 ms a run, with a 2 ms timeout: the
# guest's clock may lag, never by that much), unet
# (~70 ms an inference, one instance, a queue of 1: the queue-bound
# tests), dyn (dynamic-batch compiled for 3 rows, served with dynamic
# batching: single-row requests gathered within 2 s) and
# broken (a truncated file: listed, not loaded).
mkdir -p $R/mlp/1 $R/mlp/2 $R/cnn/1 $R/bert-ids/1 $R/yolo-timeout/1 $R/unet/1 $R/broken/1 $R/dyn/1
cp $m/mlp.rbln $R/mlp/1/model.rbln
cp $m/mlp.rbln $R/mlp/2/model.rbln
cp $m/cnn.rbln $R/cnn/1/model.rbln
echo '{"instances": 1, "max_queue": 1}' >$R/cnn/config.json
cp $o/bert-ids.rbln $R/bert-ids/1/model.rbln
cp target/exports/yolov8n.rbln $R/yolo-timeout/1/model.rbln
echo '{"instances": 1, "timeout_ms": 2}' >$R/yolo-timeout/config.json
cp target/exports/unet.rbln $R/unet/1/model.rbln
echo '{"instances": 1, "max_queue": 1}' >$R/unet/config.json
head -c 5000 $m/mlp.rbln >$R/broken/1/model.rbln
cp $o/dynamic-batch.rbln $R/dyn/1/model.rbln
echo '{"instances": 1, "max_batch_size": 3, "max_batch_delay_us": 2000000}' >$R/dyn/config.json

rbln-serve --model-repository $R --host 127.0.0.1 --http-port 8000 --grpc-port 8001 --metrics-port 8002 \
    --max-body-bytes 8388608 >$LOG 2>&1 &
pid=$!
ready=0
wait_http_ready $pid http://127.0.0.1:8000/v2/health/ready && ready=1
cat $LOG
check "rbln-serve is ready" test $ready = 1
check "the broken model's load failure is logged, the others loaded" sh -c "grep -q \"model 'broken' not loaded\" $LOG && grep -q \"loaded model 'bert-ids' version 1\" $LOG && grep -q \"loaded model 'mlp' version 2\" $LOG"

t0=$(date +%s)
rc=0; python3 tests/serve/client.py 8000 8001 8002 || rc=$?
echo "# client checks took $(( $(date +%s) - t0 )) s"
check "tritonclient HTTP + gRPC and raw HTTP checks (tests/serve/client.py, status $rc)" test $rc = 0
t0=$(date +%s)
rc=0; python3 tests/serve/kserve_client.py 8000 8001 || rc=$?
echo "# kserve client checks took $(( $(date +%s) - t0 )) s"
check "the kserve package's REST (v2) and gRPC clients (tests/serve/kserve_client.py, status $rc)" test $rc = 0
check "rbln-serve survived all of it" kill -0 $pid
# A bounded load (Rust tonic client, serve/src/bin/rbln-serve-load.rs):
# every answer correct, no error; the figures are printed, not asserted.
for c in 1 4; do
    check "load: 100 gRPC requests on mlp at concurrency $c, 0 errors, all match" \
        rbln-serve-load mlp --input $m/mlp.input.npy --expected $m/mlp.expected.npy --requests 100 --concurrency $c
done
check "unload every model through the repository extension" python3 tests/serve/unload_all.py 8000
cat /sys/kernel/debug/rbln0/state
check "all unloaded: the running server holds no device context or buffer" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "still live" wget -q -O /dev/null http://127.0.0.1:8000/v2/health/live
# SIGTERM under load: the requests in flight are answered (correctly),
# the rest are refused (UNAVAILABLE, or the connection closes under them:
# "Transport"), the server exits 0.
check "load mlp again" python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:8000/v2/repository/models/mlp/load', data=b'{}', method='POST'), timeout=60)"
rbln-serve-load mlp --input $m/mlp.input.npy --expected $m/mlp.expected.npy \
    --requests 600 --concurrency 4 --json >/tmp/load.json 2>/tmp/load.err &
lpid=$!
sleep 3
kill -TERM $pid
src=0; wait $pid || src=$?
lrc=0; wait $lpid || lrc=$?
cat /tmp/load.json /tmp/load.err
tail -n 8 $LOG
check "SIGTERM under load: rbln-serve exits 0 with every accepted request answered (status $src)" \
    sh -c "test $src = 0 && grep -q 'shutting down: [0-9]* inference request(s) in flight' $LOG && grep -q 'stopped (0 inference request(s) left unanswered)' $LOG"
check "the load saw only correct answers and, after the signal, refused requests" python3 -c "
import json
r = json.load(open('/tmp/load.json'))
assert r['wrong'] == 0 and r['ok'] >= 1 and set(r['error_codes']) <= {'Unavailable', 'Unknown', 'Cancelled', 'Transport'}, r
"
check "no panic in the server's log" sh -c "! grep -q panicked $LOG"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
