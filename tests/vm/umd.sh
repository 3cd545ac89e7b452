# librbln_umd in the guest: the Rust API end to end (rbln-umd-tests: DMA,
# GEMM vs CPU, user-mode and ioctl submission, 4 threads on one device,
# faults, timeouts, latency benchmark) and the C example through the C ABI
# (built on the host beforehand by examples/c/build.sh into
# target/c-examples/). Everything the UMD allocated comes back.
. tests/vm/lib.sh

export LD_LIBRARY_PATH=/rbln/target/release
state=/sys/kernel/debug/rbln0/state
leak_lines() { grep -E '^(contexts_open|queues_in_use|bos|host_bo_bytes|dram_free_bytes):' "$state"; }

check "the C example was built on the host (examples/c/build.sh)" test -x target/c-examples/gemm -a -x target/c-examples/gemm-static
check "insmod rbln.ko" insmod "$RBLN_KO"
before=$(leak_lines)
check "UMD Rust API tests" rbln-umd-tests
check "C example: GEMM on a user-mode queue" target/c-examples/gemm user
check "C example: GEMM on a kernel queue" target/c-examples/gemm kernel
check "C example: GEMM, librbln_umd.a linked in" target/c-examples/gemm-static user
after=$(leak_lines)
check "every buffer, queue and context came back" test "$before" = "$after"
check "rmmod rbln" rmmod rbln
