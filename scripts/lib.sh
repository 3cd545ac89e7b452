# Shared helpers for the rbln scripts. Source it; do not run it.
#
# Everything the scripts build lives under $RBLN_CACHE (default
# ~/.cache/rbln), keyed by versions and content hashes so a warm cache is
# reused and a changed input rebuilds only what depends on it.

set -euo pipefail

RBLN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RBLN_CACHE=${RBLN_CACHE:-$HOME/.cache/rbln}
mkdir -p "$RBLN_CACHE"
RBLN_CACHE=$(cd "$RBLN_CACHE" && pwd)
export RBLN_ROOT RBLN_CACHE

# shellcheck source=versions.env
source "$RBLN_ROOT/scripts/versions.env"

# Elapsed time is measured from the first script in a `make` invocation so
# that nested scripts print one consistent clock.
: "${RBLN_T0:=$(date +%s)}"
export RBLN_T0

elapsed() {
    local s=$(($(date +%s) - RBLN_T0))
    printf '%02d:%02d' $((s / 60)) $((s % 60))
}

log()  { printf '[%s] %s\n' "$(elapsed)" "$*" >&2; }
warn() { printf '[%s] WARNING: %s\n' "$(elapsed)" "$*" >&2; }
die()  { printf '[%s] ERROR: %s\n' "$(elapsed)" "$*" >&2; exit 1; }

# Short content hash of files and strings, used in cache keys.
hash_of() {
    local item
    for item in "$@"; do
        if [[ -f $item ]]; then cat "$item"; else printf '%s\n' "$item"; fi
    done | sha256sum | cut -c1-12
}

# The sysroot directory, keyed by the pinned suite and package set.
sysroot_dir() {
    echo "$RBLN_CACHE/sysroot-$SYSROOT_SUITE-$(hash_of "$RBLN_ROOT/scripts/versions.env")"
}

# Run a command inside the sysroot. The bind mounts live in a private mount
# namespace (unshare -m), so they disappear with the command and nothing
# stays mounted on the host even if the command is killed.
#
# Inside, the repo is /rbln and the extra "HOSTDIR:GUESTDIR" pairs given in
# $SYSROOT_BINDS (space separated) are bind-mounted too.
in_sysroot() {
    local root
    root=$(sysroot_dir)
    [[ -x $root/usr/bin/apt-get ]] || die "sysroot missing at $root: run 'make setup'"
    unshare -m --propagation private -- "$RBLN_ROOT/scripts/chroot-run.sh" "$root" "$@"
}

# Multi-step runs (make test, make test-debug, make fuzz): `step NAME
# CMD...` runs one step and logs its outcome and elapsed time;
# `steps_summary` lists the failed steps, prints "N passed, N failed" as
# the last line and returns non-zero if any step failed.
STEPS_PASSED=0
STEPS_FAILED=0
STEPS_FAILURES=()
step() {
    local name=$1; shift
    local t0=$SECONDS rc=0
    log "---- $name"
    "$@" || rc=$?
    if [[ $rc == 0 ]]; then
        STEPS_PASSED=$((STEPS_PASSED + 1))
        log "PASS $name ($((SECONDS - t0))s)"
    else
        STEPS_FAILED=$((STEPS_FAILED + 1)); STEPS_FAILURES+=("$name")
        log "FAIL $name (status $rc, $((SECONDS - t0))s)"
    fi
}
steps_summary() {
    if ((STEPS_FAILED > 0)); then
        log "failed steps:"; printf '    %s\n' "${STEPS_FAILURES[@]}" >&2
    fi
    log "total time $(elapsed)"
    echo "$STEPS_PASSED passed, $STEPS_FAILED failed"
    ((STEPS_FAILED == 0))
}
