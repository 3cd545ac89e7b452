# rbln: the front door. `make demo` shows the stack working, `make test`
# runs every test. Build products live in target/ and in
# $(RBLN_CACHE) (default ~/.cache/rbln); see README.md.

SHELL := /bin/bash
# One clock for every script a make invocation runs (elapsed times in logs).
export RBLN_T0 := $(shell date +%s)

CARGO ?= cargo
CMD ?=

.PHONY: all setup kernel kmd host vm test test-debug fuzz soak demo bench clean

all: kmd host

## setup: sysroot (QEMU, kernel toolchain), guest kernel and initramfs; idempotent
setup:
	@scripts/setup.sh

kernel: setup

## kmd: kmd/rbln.ko against the guest kernel
kmd: setup
	@scripts/build-kmd.sh

## host: the user-space workspace (device model, UMD, tools) and the C examples
host:
	@$(CARGO) build --release --workspace --quiet
	@RBLN_SKIP_CARGO=1 examples/c/build.sh

## vm: boot the guest and run CMD in it, e.g. make vm CMD='insmod kmd/rbln.ko'
vm: kmd host
	@scripts/vm.sh "$(CMD)"

## test: host tests, then the VM suites; summary on the last line
test:
	@scripts/test.sh

## test-debug: the driver suites under a KASAN/kmemleak/lockdep kernel, allocation-failure injection
test-debug:
	@scripts/test-debug.sh

## fuzz: every fuzzer at 10^6 cases (FUZZ_CASES): .rbln, command buffers, ONNX, TFLite, TTIR, ioctls
fuzz:
	@scripts/fuzz.sh

## soak: 30 minutes (SOAK_SECONDS) of mixed work with injected device faults: no failure, no leak
soak:
	@scripts/soak.sh

## bench: the NPU vs onnxruntime on the same cores; table + target/bench/report.json
bench: kmd host
	@BENCH_SKIP_BUILD=1 scripts/bench.sh

## demo: boot the guest and show the stack working
demo: kmd host
	@scripts/demo.sh

clean:
	$(CARGO) clean
	rm -f kmd/*.o kmd/*.ko kmd/*.mod kmd/*.mod.c kmd/.*.cmd kmd/Module.symvers kmd/modules.order
