#!/usr/bin/env python3
"""Attribute a tbprof dump (tbprof.c) to functions.

    symbolize.py PROFILE --maps MAPS [--kernel KDIR] [--top N]

PROFILE: the plugin's "dump" file. MAPS: /proc/PID/maps of the guest
process of interest, copied out while it ran (with ASLR off in the guest,
`echo 0 > /proc/sys/kernel/randomize_va_space`, other processes of the same
binary map alike). KDIR: the guest kernel's build tree (its System.map; the
test kernel by default, as scripts/build-kernel.sh prints it). Kernel
addresses are named from System.map, user addresses from the mapped files:
/rbln/... is this repo, other paths are the host's own files (the guest's
initramfs carries the host's glibc). Stripped files (the host's libc, the
wheel's extension) give only their dynamic symbols or none: profile an
unstripped copy (for rbln._rbln, target/release/lib_rbln.so) instead.
Prints the share of executed guest instructions per object and per function.
"""

import argparse
import bisect
import collections
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Symbols:
    def __init__(self, pairs):
        pairs.sort()
        self.addrs = [a for a, _ in pairs]
        self.names = [n for _, n in pairs]

    def name(self, addr):
        i = bisect.bisect_right(self.addrs, addr) - 1
        return self.names[i] if i >= 0 else "?"


def nm(path):
    for extra in ([], ["-D"]):
        out = subprocess.run(["nm", "-C", "--defined-only", *extra, path], capture_output=True, text=True).stdout
        pairs = []
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "tTwWiI":
                pairs.append((int(parts[0], 16), parts[2]))
        if pairs:
            return Symbols(pairs)
    return Symbols([])


def kernel_symbols(kdir):
    pairs = []
    with open(os.path.join(kdir, "System.map")) as f:
        for line in f:
            addr, kind, name = line.split()[:3]
            if kind in "tT":
                pairs.append((int(addr, 16), name))
    return Symbols(pairs)


def read_maps(path):
    """(start, end, file offset, path) of each file mapping, and each
    file's load bias (start minus offset of its first mapping)."""
    maps, bias = [], {}
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) >= 6 and p[5].startswith("/"):
                lo, hi = (int(x, 16) for x in p[0].split("-"))
                maps.append((lo, hi, int(p[2], 16), p[5]))
                bias.setdefault(p[5], lo - int(p[2], 16))
    return maps, bias


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile")
    ap.add_argument("--maps", required=True)
    ap.add_argument("--kernel", help="the guest kernel's build tree (default: the test kernel's)")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    kdir = a.kernel
    if not kdir:
        out = subprocess.run([os.path.join(REPO, "scripts", "build-kernel.sh")], capture_output=True, text=True)
        kdir = os.path.join(out.stdout.strip(), "src")
    ksyms = kernel_symbols(kdir)
    maps, bias = read_maps(a.maps)
    files = {}

    def user(addr):
        for lo, hi, _, path in maps:
            if lo <= addr < hi:
                host = os.path.join(REPO, path[len("/rbln/"):]) if path.startswith("/rbln/") else path
                if host not in files:
                    files[host] = nm(host)
                return os.path.basename(path), files[host].name(addr - bias[path])
        return "other user", "?"

    per_fn, per_obj = collections.Counter(), collections.Counter()
    with open(a.profile) as f:
        for line in f:
            vaddr, executed, _ = line.split()
            addr, executed = int(vaddr, 16), int(executed)
            key = ("kernel", ksyms.name(addr)) if addr >= 0xFFFF800000000000 else user(addr)
            per_fn[key] += executed
            per_obj[key[0]] += executed
    total = sum(per_obj.values()) or 1
    print(f"{total} guest instructions")
    for obj, n in per_obj.most_common():
        print(f"  {100 * n / total:5.1f}%  {obj}")
    print()
    for (obj, fn), n in per_fn.most_common(a.top):
        print(f"{100 * n / total:5.1f}%  {obj:16.16s}  {fn[:120]}")


if __name__ == "__main__":
    sys.exit(main())
