# vm-env: VM_DEVICES=2
# Device health: the stable sysfs attributes, the privileged reset that
# brings a faulted device back, and surprise removal (the harness makes a
# device model fall off the bus: reads all ones, no interrupts): waiters
# and later calls fail with ENODEV within a second, rbln-run says the
# device is lost, and rmmod still works.
. tests/vm/lib.sh

check "insmod rbln.ko" insmod "$RBLN_KO"
d=/sys/class/misc/rbln0
for a in hw_version driver_version dram_total_bytes dram_used_bytes utilization health reset_count faults pci_address; do
    echo "# $a: $(cat $d/$a)"
done
check "sysfs: versions, memory and state of an idle device" sh -c "
    grep -qE '^1\\.[0-9]+\$' $d/hw_version &&
    test \$(cat $d/dram_total_bytes) = 2147483648 && test \$(cat $d/dram_used_bytes) = 0 &&
    test \$(cat $d/health) = ok && test \$(cat $d/reset_count) = 0 && test \$(cat $d/utilization) -le 100"
check "sysfs: driver_version is the loaded driver's" sh -c "dmesg | grep -q \"rbln driver \$(cat $d/driver_version) loaded\""
check "sysfs: pci_address is the PCI function's" sh -c "test -e /sys/bus/pci/devices/\$(cat $d/pci_address)/vendor && dmesg | grep -q \"rbln \$(cat $d/pci_address): rbln0: NPU\""
check "sysfs: reset is write-only, for root" sh -c "test \"\$(stat -c %a $d/reset)\" = 200"
check "DRAM in use shows in sysfs" sh -c "rbln-kmd-tests hold >/tmp/hold.out 2>&1 & p=\$!; n=0
    until grep -q holding /tmp/hold.out || [ \$n -ge 100 ]; do sleep 0.1; n=\$((n + 1)); done
    used=\$(cat $d/dram_used_bytes); kill \$p; wait \$p 2>/dev/null; test \$used = 1048576"
check "reset: faulted -> ok, open contexts poisoned, new ones work" rbln-kmd-tests reset

# Surprise removal of /dev/rbln1 while rbln-run is mid-inference: it stops
# with "device lost" within a second.
check "lost device: rbln-run fails with a clear error within 1 s" python3 -c "
import subprocess, time
p = subprocess.Popen(['rbln-run', 'target/models/cnn.rbln', '--input', 'target/models/cnn.input.npy',
                      '--iterations', '1000000', '--device', '1'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
time.sleep(3)
assert p.poll() is None, p.stdout.read()
t0 = time.monotonic()
open('/run/rbln/unplug-npu1', 'w').close()
out, _ = p.communicate(timeout=30)
took = time.monotonic() - t0
print('# rbln-run exited', p.returncode, 'after %.3f s:' % took, out.strip().splitlines()[-1])
assert p.returncode == 4, (p.returncode, out)
assert 'device lost' in out, out
assert took < 1.0, took
"
check "sysfs and rbln-smi: rbln1 lost, rbln0 ok" sh -c "test \$(cat /sys/class/misc/rbln1/health) = lost && rbln-smi --json | python3 -c '
import json, sys
r = json.load(sys.stdin)
h = {d[\"index\"]: d[\"health\"] for d in r[\"devices\"]}
assert h == {0: \"ok\", 1: \"lost\"}, h'"
check "kernel log: the loss is reported" sh -c "dmesg | grep -q 'rbln1: device lost'"
check "driver-level: waiters and later calls on a lost device get ENODEV" rbln-kmd-tests lost
bdf=$(cat /sys/class/misc/rbln1/pci_address)
check "unbind of a lost device ($bdf)" sh -c "echo $bdf > /sys/bus/pci/drivers/rbln/unbind && test ! -e /dev/rbln1"
check "rmmod rbln with a lost device left" rmmod rbln
