# Drive the NPU from guest user space through sysfs (no driver): registers
# over vfio-user, DRAM through BAR2, DMA into guest RAM, fences, faults.
. tests/vm/lib.sh

check "rbln-hwprobe passes" rbln-hwprobe
