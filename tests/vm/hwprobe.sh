# vm-env: NPU_ARGS=--dram-bar-mmap
# Drive the NPU from guest user space through sysfs (no driver): registers
# over vfio-user, DRAM through BAR2, DMA into guest RAM, fences, faults.
# BAR2 is offered mappable here (--dram-bar-mmap: CPU accesses go straight
# to the memfd and MMIO writes are not posted), the other suites run the
# default (BAR2 trapped, posted writes), so both configurations are used.
. tests/vm/lib.sh

check "rbln-hwprobe passes" rbln-hwprobe
