# rbln-smi: without the driver it says there is no NPU; with it, the
# device's identity and, from the driver's fdinfo statistics, a process
# holding buffers and a queue (rbln-kmd-tests hold: 256 KiB host, 1 MiB
# DRAM, one queue), as a table, as JSON and in watch mode; once that
# process is gone, nothing; rbln-exporter's /metrics. (The device model
# has 2 GiB of DRAM.)
. tests/vm/lib.sh

check "without rbln.ko: exit 1, no NPU" sh -c "rbln-smi >/tmp/smi.out 2>&1; test \$? = 1 && grep -q 'no NPU: there is no /dev/rbln' /tmp/smi.out"
check "insmod rbln.ko" insmod "$RBLN_KO"
check "loopback up" ip link set lo up
rbln-smi | tee /tmp/smi0.txt
check "idle: device 0 listed with its DRAM, no processes" sh -c "grep -q '/dev/rbln0' /tmp/smi0.txt && grep -q '| 0.0 MiB / 2048.0 MiB' /tmp/smi0.txt && grep -q 'No processes are using an NPU' /tmp/smi0.txt"

rbln-kmd-tests hold >/tmp/hold.out 2>&1 &
hold=$!
n=0
until grep -q holding /tmp/hold.out || [ $n -ge 100 ]; do sleep 0.1; n=$((n + 1)); done
check "a process holds buffers and a queue" grep -q holding /tmp/hold.out
rbln-smi | tee /tmp/smi1.txt
check "table: the holder with its DRAM and host buffers" sh -c "grep -E '\\| *$hold *\\| rbln-kmd-tests *\\| 1.0 MiB *\\| 0.2 MiB' /tmp/smi1.txt"
rbln-smi --json >/tmp/smi.json
cat /tmp/smi.json
check "JSON: device and process figures" python3 -c "
import json
r = json.load(open('/tmp/smi.json'))
d = r['devices'][0]
assert d['index'] == 0 and d['health'] == 'ok' and d['dram_total_bytes'] == 2048 << 20, d
assert d['dram_used_bytes'] == 1 << 20 and d['host_bytes'] == 256 << 10 and d['clients'] == 1, d
assert d['core_utilization'] is not None and 0 <= d['core_utilization'] <= 1 and d['faults'] == 0, d
assert d['hw_version'] and d['cores'] >= 1 and r['driver_version'], r
[p] = [p for p in r['processes'] if p['pid'] == $hold]
assert p['name'] == 'rbln-kmd-tests' and p['device'] == 0 and p['dram_bytes'] == 1 << 20, p
assert p['host_bytes'] == 256 << 10 and p['buffers'] == 2 and p['queues'] == 1 and p['submits'] == 1, p
assert len(r['processes']) == 1, r['processes']
"
# Utilisation: while a model runs in a loop, the cores are busy.
rbln-run target/models/cnn.rbln --input target/models/cnn.input.npy --iterations 1000000 >/tmp/run.out 2>&1 &
run=$!
# Wait until it has run on the device: loading alone can take seconds in
# a slow TCG guest (a sample taken before the first submit sees idle
# cores).
n=0
until rbln-smi --json 2>/dev/null | python3 -c "
import json, sys
r = json.load(sys.stdin)
sys.exit(0 if any(p['name'] == 'rbln-run' and p['submits'] > 0 and p['engine_ns'] > 0 for p in r['processes']) else 1)
" || [ $n -ge 120 ] || ! kill -0 $run 2>/dev/null; do sleep 0.5; n=$((n + 1)); done
check "a model is running" kill -0 $run
check "utilisation: the cores are busy while a model runs" python3 -c "
import json, subprocess
r = json.loads(subprocess.run(['rbln-smi', '--json'], capture_output=True, text=True, check=True).stdout)
d = r['devices'][0]
print('# core utilisation', d['core_utilization'], 'DMA', d['dma_utilization'])
assert d['core_utilization'] > 0.01, (d, open('/tmp/run.out').read()[-2000:])
assert any(p['name'] == 'rbln-run' and p['submits'] + p['queues'] > 0 and p['engine_ns'] > 0 for p in r['processes']), r['processes']
"
# The Prometheus exporter, scraped while the model still runs.
rbln-exporter --listen 127.0.0.1:9400 >/tmp/exporter.log 2>&1 &
exp=$!
check "rbln-exporter: /metrics has the device, its counters and the processes" python3 -c "
import time, urllib.request
text, err = None, None
for _ in range(100):
    try:
        text = urllib.request.urlopen('http://127.0.0.1:9400/metrics', timeout=30).read().decode()
        break
    except OSError as e:
        err = e
        time.sleep(0.2)
assert text is not None, f'no answer from rbln-exporter: {err}: ' + open('/tmp/exporter.log').read()
def value(prefix):
    vals = [float(l.rsplit(' ', 1)[1]) for l in text.splitlines() if l.startswith(prefix)]
    assert vals, prefix + ' missing:\n' + text
    return vals[0]
assert value('rbln_device_health{device=\"0\",state=\"ok\"}') == 1
assert value('rbln_device_dram_total_bytes{device=\"0\"}') == 2048 << 20
assert value('rbln_device_info{device=\"0\"') == 1
assert value('rbln_device_core_busy_seconds_total{core=\"0\",device=\"0\"}') > 0
assert value('rbln_device_compute_ops_total{device=\"0\"}') > 0
assert value('rbln_process_queues{device=\"0\",pid=\"$run\",process=\"rbln-run\"}') >= 1
assert value('rbln_process_engine_seconds_total{device=\"0\",pid=\"$run\",process=\"rbln-run\"}') > 0
"
kill $exp; wait $exp 2>/dev/null || true
kill $run 2>/dev/null; wait $run 2>/dev/null || true
check "watch mode: -l 0.2 --count 3 prints 3 reports" sh -c "test \$(rbln-smi --json -l 0.2 --count 3 | wc -l) = 3"
kill $hold 2>/dev/null || true  # the driver may have ended its wait as hung already
wait $hold 2>/dev/null || true
check "after the holder exits: no processes, no DRAM in use" sh -c "rbln-smi | tee /tmp/smi2.txt | grep -q 'No processes are using an NPU' && grep -q '| 0.0 MiB / 2048.0 MiB' /tmp/smi2.txt"
check "rbln-smi --loop 0 is refused" sh -c "rbln-smi -l 0; test \$? = 2"
check "rmmod rbln" rmmod rbln
