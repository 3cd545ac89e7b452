#!/usr/bin/env bash
# The pinned-version fallback of scripts/setup-sysroot.sh: exact pin when
# served, newest of the same line (with a warning) when not, and a clear
# failure naming the package when the line is gone.
source "$(dirname "$0")/../../scripts/setup-sysroot.sh"
set -euo pipefail

fail() { echo "FAIL: $*" >&2; exit 1; }
served='1:11.1.3+ds-1~bpo13+1
1:11.1.5+ds-1~bpo13+1
1:10.0.2+ds-2'

got=$(choose_version qemu 11.1.3 11. <<<"$served" 2>/dev/null)
[[ $got == 1:11.1.3+ds-1~bpo13+1 ]] || fail "exact pin: got $got"

out=$(choose_version qemu 11.1.2 11. <<<"$served" 2>&1 >/dev/null)
got=$(choose_version qemu 11.1.2 11. <<<"$served" 2>/dev/null)
[[ $got == 1:11.1.5+ds-1~bpo13+1 ]] || fail "fallback: got $got"
[[ $out == *"pinned 11.1.2 is no longer served"* ]] || fail "fallback must warn: $out"

if out=$( (choose_version qemu 12.0.1 12. <<<"$served") 2>&1); then
    fail "a missing line must fail"
fi
[[ $out == *"package qemu"*"12."* ]] || fail "failure must name the package and line: $out"
# "LINE+": a later release when the line is gone, loudly; never an older one.
rust='1.97.1+dfsg1-1~bpo13+1
1.85.1+dfsg1-1+deb13u1'
out=$(choose_version rustc 1.96.1 1.96+ <<<"$rust" 2>&1 >/dev/null)
got=$(choose_version rustc 1.96.1 1.96+ <<<"$rust" 2>/dev/null)
[[ $got == 1.97.1+dfsg1-1~bpo13+1 ]] || fail "later release: got $got"
[[ $out == *"no version of line 1.96 is served"* ]] || fail "later release must warn: $out"
if out=$( (choose_version rustc 1.98.0 1.98+ <<<"$rust") 2>&1); then
    fail "an older release must not stand in for a newer line"
fi
[[ $out == *"package rustc"*"1.98 or later"* ]] || fail "failure must name the package and line: $out"
echo "ok - pinned-version fallback"
