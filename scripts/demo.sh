#!/usr/bin/env bash
# The demo: boot the guest, load the driver, show what it logged, unload it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
exec "$RBLN_ROOT/scripts/vm.sh" '
echo "== guest kernel: $(uname -r)"
insmod kmd/rbln.ko
dmesg | grep rbln
rmmod rbln
echo "== rbln.ko loaded and unloaded cleanly"
'
