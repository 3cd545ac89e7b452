#!/bin/busybox sh
# /init of the guest initramfs (scripts/build-initramfs.sh packs it).
# Mounts the repo (/rbln) and the run directory (/run/rbln) shared over 9p by
# scripts/vm.sh, runs /run/rbln/cmd.sh there, records its exit code and the
# kernel log, and powers the VM off.
/bin/busybox --install -s /bin
# python3: target/guest-python (scripts/build-guest-python.sh), when built.
export PATH=/rbln/target/release:/rbln/target/debug:/rbln/target/guest-python/bin:/bin
export HOME=/root

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
# cache=loose: the host does not change the tree while the guest runs, and
# page-cached reads make running binaries from the share much faster.
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose rbln /rbln
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rblnrun /run/rbln

cd /rbln
if [ -f /run/rbln/cmd.sh ]; then
    sh /run/rbln/cmd.sh
    rc=$?
else
    echo "rbln-vm: no command found in /run/rbln/cmd.sh" >&2
    rc=127
fi
dmesg >/run/rbln/dmesg.txt
echo "$rc" >/run/rbln/exit-code
sync
echo "rbln-vm: command exited with status $rc"
reboot -f
