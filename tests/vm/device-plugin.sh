# vm-env: VM_DEVICES=2
# Kubernetes on a node with two NPUs: rbln-device-plugin against a kubelet
# stub (tests/kubelet-stub) on the kubelet's real socket layout. The stub
# sees both devices, allocates rbln1, sees rbln0 go Unhealthy within 1 s
# of a fault and Healthy after `rbln-smi reset`, and sees the plugin
# register again after a kubelet restart. A process given the allocation's
# RBLN_VISIBLE_DEVICES sees only its device, as device 0. The node labels
# are in NFD's feature file. The plugin starts before the driver is loaded
# (a DaemonSet on a node that is still booting): it lists no device, then
# both once rbln.ko is in.
. tests/vm/lib.sh

dir=/var/lib/kubelet/device-plugins
features=/etc/kubernetes/node-feature-discovery/features.d
mkdir -p $dir
rbln-device-plugin >/tmp/plugin.log 2>&1 &
plugin=$!

fault='rbln-kmd-tests fault_hold >/tmp/fault.out 2>&1 & echo $! >/tmp/fault.pid; n=0
until grep -q "# faulted" /tmp/fault.out || [ $n -ge 100 ]; do sleep 0.05; n=$((n + 1)); done
grep -q "# faulted" /tmp/fault.out'
check "kubelet stub: registration, devices, allocation, health, re-registration" \
    rbln-kubelet-stub --expect-devices 2 --add-devices-cmd "insmod $RBLN_KO" \
    --fault-cmd "$fault" --reset-cmd "rbln-smi reset -d 0" --env-out /tmp/alloc.env
cat /tmp/plugin.log
check "the allocation's environment" grep -qx RBLN_VISIBLE_DEVICES=1 /tmp/alloc.env
check "with it, the Python SDK sees one NPU, /dev/rbln1, as device 0" env $(cat /tmp/alloc.env) python3 -c "
import rbln
assert rbln.device_count() == 1, rbln.device_count()
[d] = rbln.devices()
assert d['index'] == 0 and d['path'] == '/dev/rbln1', d
"
check "with it, rbln-run's device 0 is /dev/rbln1" sh -c "env \$(cat /tmp/alloc.env) rbln-run target/models/cnn.rbln --input target/models/cnn.input.npy | tee /tmp/run.out | grep -q 'on /dev/rbln1'"
check "with it, device 1 is not visible: a clear error" sh -c "env \$(cat /tmp/alloc.env) rbln-run target/models/cnn.rbln --input target/models/cnn.input.npy --device 1 >/tmp/run1.out 2>&1; test \$? = 4 && grep -q 'not visible to this process: RBLN_VISIBLE_DEVICES=\"1\"' /tmp/run1.out"
check "a malformed RBLN_VISIBLE_DEVICES is refused" sh -c "RBLN_VISIBLE_DEVICES=1,x rbln-run target/models/cnn.rbln --input target/models/cnn.input.npy >/tmp/run2.out 2>&1; test \$? = 4 && grep -q 'comma-separated' /tmp/run2.out"
cat $features/rbln
check "node labels: NFD feature file with count, product and versions" sh -c "
    grep -qx rbln.dev/npu.present=true $features/rbln && grep -qx rbln.dev/npu.count=2 $features/rbln &&
    grep -qx rbln.dev/npu.product=rbln-npu $features/rbln &&
    grep -qx rbln.dev/npu.hw-version=\$(cat /sys/class/misc/rbln0/hw_version) $features/rbln &&
    grep -qx rbln.dev/driver.version=\$(cat /sys/class/misc/rbln0/driver_version) $features/rbln &&
    grep -qx rbln.dev/npu.memory-mib=2048 $features/rbln"
kill -TERM $plugin
check "SIGTERM: the plugin exits and removes its socket" sh -c "wait $plugin 2>/dev/null; n=0; while kill -0 $plugin 2>/dev/null && [ \$n -lt 50 ]; do sleep 0.1; n=\$((n + 1)); done; ! kill -0 $plugin 2>/dev/null && test ! -e $dir/rbln-npu.sock"
holder=$(cat /tmp/fault.pid)
kill $holder
n=0; while kill -0 $holder 2>/dev/null && [ $n -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
check "rmmod rbln" rmmod rbln
