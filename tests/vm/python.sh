# The rbln Python package on the NPU: pytest runs python/tests in the
# guest against /dev/rbln0, with the Python of scripts/build-guest-python.sh
# (target/guest-python: the host's CPython, numpy, pytest and the rbln
# wheel), then the asyncio example.
. tests/vm/lib.sh
PY=python3   # target/guest-python/bin/python3 (on the guest's PATH)

check "the guest python is built (scripts/build-guest-python.sh)" test -x target/guest-python/bin/python3
check "insmod rbln.ko" insmod "$RBLN_KO"
check "import rbln sees one NPU" $PY -c "import rbln; assert rbln.device_count() == 1, rbln.devices()"
rc=0; RBLN_REQUIRE_DEVICE=1 $PY -m pytest -p no:cacheprovider --color=no -v python/tests || rc=$?
check "pytest python/tests (status $rc)" test $rc = 0
check "examples/python/async_gather.py" $PY examples/python/async_gather.py target/models/mlp.rbln
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
