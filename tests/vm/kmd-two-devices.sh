# vm-env: VM_DEVICES=2
# Two NPUs: /dev/rbln0 and /dev/rbln1, each answering for itself.
. tests/vm/lib.sh

check "insmod rbln.ko" insmod "$RBLN_KO"
check "/dev/rbln0 and /dev/rbln1 exist" test -c /dev/rbln0 -a -c /dev/rbln1
check "each device reports its own index" rbln-kmd-tests two_devices
check "rmmod rbln" rmmod rbln
