"""What the serve test clients share: one "ok - ..." line per passed check,
exit 1 at the first failure."""

import sys


def check(desc, cond, detail=""):
    if not cond:
        print(f"FAIL: {desc} {detail}", flush=True)
        sys.exit(1)
    print(f"ok - {desc}", flush=True)
