# vm-env: VM_DEVICES=2
# rbln-serve finds both NPUs by itself (no --device) and spreads a model
# over them: each
# device holds an instance set and both execute requests; a model pinned
# to one device (config.json "devices") stays there. Then rbln1 falls off
# the bus: mlp goes on serving on rbln0 with no errors once the loss is
# seen, cnn (only on rbln1) and the server turn not ready. Then SIGTERM,
# exit 0, every resource back on both devices.
. tests/vm/lib.sh
m=target/models
R=/tmp/repo
LOG=/tmp/rbln-serve.log

packets() { sed -n 's/^hw_packets: //p' /sys/kernel/debug/rbln$1/state; }
contexts() { sed -n 's/^contexts_open: //p' /sys/kernel/debug/rbln$1/state; }

mkdir -p $R
check "without rbln.ko: rbln-serve exits 1 saying there is no NPU" sh -c \
    "rbln-serve --model-repository $R --host 127.0.0.1 >/tmp/nonpu.log 2>&1; test \$? = 1 && grep -q 'no NPU: there is no /dev/rbln\\*' /tmp/nonpu.log"
check "insmod rbln.ko" insmod "$RBLN_KO"
check "two NPUs" test -c /dev/rbln0 -a -c /dev/rbln1
check "loopback up" ip link set lo up
mkdir -p $R/mlp/1 $R/cnn/1
cp $m/mlp.rbln $R/mlp/1/model.rbln
cp $m/cnn.rbln $R/cnn/1/model.rbln
echo '{"instances": 1, "devices": [1]}' >$R/cnn/config.json

rbln-serve --model-repository $R --host 127.0.0.1 >$LOG 2>&1 &
pid=$!
ready=0
wait_http_ready $pid http://127.0.0.1:8000/v2/health/ready && ready=1
cat $LOG
check "rbln-serve is ready" test $ready = 1
check "it found both devices" grep -q "devices /dev/rbln0 /dev/rbln1," $LOG
c0=$(contexts 0); c1=$(contexts 1)
check "mlp on both devices, cnn on rbln1 only (contexts: rbln0 $c0, rbln1 $c1)" sh -c "test $c0 = 1 && test $c1 = 2"

p0=$(packets 0); p1=$(packets 1)
check "100 requests on mlp at concurrency 4: 0 errors, all match" \
    rbln-serve-load mlp --input $m/mlp.input.npy --expected $m/mlp.expected.npy --requests 100 --concurrency 4
d0=$(( $(packets 0) - p0 )); d1=$(( $(packets 1) - p1 ))
echo "# hw_packets during the load: rbln0 +$d0, rbln1 +$d1"
check "both devices executed mlp requests" sh -c "test $d0 -gt 0 && test $d1 -gt 0"
p0=$(packets 0)
check "cnn (pinned to rbln1) answers correctly" \
    rbln-serve-load cnn --input $m/cnn.input.npy --expected $m/cnn.expected.npy --requests 10 --concurrency 2
check "cnn did not touch rbln0" test "$(packets 0)" = "$p0"

# Surprise removal of rbln1 (scripts/vm.sh): requests on it when it goes
# fail; after that the model's requests all go to rbln0.
touch /run/rbln/unplug-npu1
# Until the harness has taken it off the bus and the driver noticed (not
# a fixed sleep: how long that takes depends on the host's load).
n=0
until { test -e /run/rbln/unplugged-npu1 && test "$(cat /sys/class/misc/rbln1/health 2>/dev/null)" = lost; } || [ $n -ge 100 ]; do
    sleep 0.1; n=$((n + 1))
done
# The server learns of the loss from a request that fails on rbln1; the
# requests are spread over the instances, but a round can miss rbln1's.
n=0
until grep -q "/dev/rbln1 is lost" $LOG || [ $n -ge 5 ]; do
    rbln-serve-load mlp --input $m/mlp.input.npy --requests 20 --concurrency 2 >/tmp/first.out 2>&1 || true
    n=$((n + 1))
done
check "the loss is logged" grep -q "/dev/rbln1 is lost" $LOG
check "after rbln1 is lost: 100 requests on mlp, 0 errors (all on rbln0)" \
    rbln-serve-load mlp --input $m/mlp.input.npy --expected $m/mlp.expected.npy --requests 100 --concurrency 4
check "a request to cnn (only on rbln1) fails, saying the device is lost" sh -c \
    "! rbln-serve-load cnn --input $m/cnn.input.npy --requests 1 --concurrency 1 >/tmp/cnn.out 2>&1; cat /tmp/cnn.out; grep -q 'lost' /tmp/cnn.out"
check "cnn is not ready, mlp is, the server is not" sh -c \
    "! wget -q -O /dev/null http://127.0.0.1:8000/v2/models/cnn/ready && wget -q -O /dev/null http://127.0.0.1:8000/v2/models/mlp/ready && ! wget -q -O /dev/null http://127.0.0.1:8000/v2/health/ready"

kill -TERM $pid
src=0; wait $pid || src=$?
tail -n 3 $LOG
check "SIGTERM: exit 0 (status $src)" test $src = 0
check "no panic in the server's log" sh -c "! grep -q panicked $LOG"
for d in 0 1; do
    check "every resource came back on rbln$d" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln$d/state && grep -q '^bos: 0' /sys/kernel/debug/rbln$d/state"
done
check "rmmod rbln" rmmod rbln
