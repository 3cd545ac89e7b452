# rbln-run runs an example model (made with the .rbln writer API) on the
# NPU and matches its CPU reference; bad inputs and files get clear errors
# and documented exit codes.
. tests/vm/lib.sh
m=target/models

check "example models were generated on the host" test -f $m/mlp.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
check "Runtime and AsyncRuntime API tests" rbln-runtime-tests $m/mlp.rbln $m/mlp.input.npy $m/mlp.expected.npy
check "rbln-run --inspect" sh -c "rbln-run $m/mlp.rbln --inspect | grep -q 'input:    x f32 \[16, 256\]'"
check "rbln-run: MLP on the NPU" rbln-run $m/mlp.rbln --input $m/mlp.input.npy --output /tmp/y.npy --iterations 20 --warmup 2
check "outputs match the CPU reference (tol 1e-4)" rbln-example-models compare /tmp/y.npy $m/mlp.expected.npy 1e-4
check "--json report" sh -c "rbln-run $m/mlp.rbln --json --iterations 3 | grep -q '\"p99_ms\"'"
check "--json report: the device time of each timed inference (3 of them)" sh -c "rbln-run $m/mlp.rbln --json --iterations 3 | grep -q '\"device\":{\"count\":3,'"
rc=0; rbln-run $m/mlp.rbln --input $m/mlp.badshape.npy >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "wrong input shape: exit 2, names the tensor" sh -c "test $rc = 2 && grep -q \"input 'x': expected shape \[16, 256\]\" /tmp/err"
head -c 5000 $m/mlp.rbln >/tmp/trunc.rbln
rc=0; rbln-run /tmp/trunc.rbln >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "truncated model: exit 3 with a precise error" test $rc = 3
check "AsyncRuntime, parallel 1: outputs match" sh -c "rbln-run $m/mlp.rbln --async --parallel 1 --input $m/mlp.input.npy --output /tmp/y1.npy --iterations 8 >/dev/null && rbln-example-models compare /tmp/y1.npy $m/mlp.expected.npy 1e-4"
check "AsyncRuntime, parallel 2: outputs match" sh -c "rbln-run $m/mlp.rbln --async --parallel 2 --input $m/mlp.input.npy --output /tmp/y2.npy --iterations 8 >/dev/null && rbln-example-models compare /tmp/y2.npy $m/mlp.expected.npy 1e-4"
# Throughput with one instance vs two (input transfer of request i+1
# overlapping compute of request i), same boot.
tp() { rbln-run $m/mlp-wide.rbln --async --parallel $1 --input $m/mlp-wide.input.npy --iterations 40 --warmup 4 --json | sed 's/.*"throughput_per_s":\([0-9.]*\).*/\1/'; }
t1=$(tp 1); t2=$(tp 2)
echo "# mlp-wide throughput: parallel=1 $t1/s, parallel=2 $t2/s, ratio $(awk "BEGIN { printf \"%.2f\", $t2 / $t1 }")"
check "wide MLP matches its reference" sh -c "rbln-run $m/mlp-wide.rbln --input $m/mlp-wide.input.npy --output /tmp/yw.npy >/dev/null && rbln-example-models compare /tmp/yw.npy $m/mlp-wide.expected.npy 1e-3"
check "--profile writes a Chrome trace with one event per node" sh -c "rbln-run $m/mlp.rbln --profile /tmp/trace.json >/dev/null && grep -o '\"ph\":\"X\"' /tmp/trace.json | wc -l | grep -qx 4 && grep -q '\"name\":\"fc1\"' /tmp/trace.json"
cat /tmp/trace.json; echo
check "--profile-runs 3: one inference's events (the last of three back to back), its outputs match, every run's span recorded" sh -c "rbln-run $m/mlp.rbln --input $m/mlp.input.npy --output /tmp/yp.npy --profile /tmp/trace3.json --profile-runs 3 >/dev/null && grep -o '\"ph\":\"X\"' /tmp/trace3.json | wc -l | grep -qx 4 && grep -q '\"runs\":3' /tmp/trace3.json && grep -q '\"run_spans_us\":\[[0-9.]*,[0-9.]*,[0-9.]*\]' /tmp/trace3.json && rbln-example-models compare /tmp/yp.npy $m/mlp.expected.npy 1e-4"
rc=0; rbln-run $m/mlp.rbln --profile /tmp/trace0.json --profile-runs 0 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "--profile-runs 0: exit 2, names the range" sh -c "test $rc = 2 && grep -q 'profile runs must be 1 ..= 100, not 0' /tmp/err"
check "CNN (conv, pool, dense) matches its reference" sh -c "rbln-run $m/cnn.rbln --input $m/cnn.input.npy --output /tmp/yc.npy --iterations 5 >/dev/null && rbln-example-models compare /tmp/yc.npy $m/cnn.expected.npy 1e-4"
check "CNN through AsyncRuntime and the API tests" rbln-runtime-tests $m/cnn.rbln $m/cnn.input.npy $m/cnn.expected.npy
cp $m/mlp.rbln /tmp/flip.rbln
printf '\377' | dd of=/tmp/flip.rbln bs=1 seek=3000 conv=notrunc 2>/dev/null
rc=0; rbln-run /tmp/flip.rbln >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "corrupted model (one byte flipped): exit 3, checksum error" sh -c "test $rc = 3 && grep -qi 'checksum\|crc' /tmp/err"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
