#!/usr/bin/env bash
# Build the Debian sysroot that holds the guest-kernel toolchain and QEMU.
# Idempotent: an existing, complete sysroot (marked by .complete) is reused.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT=$(sysroot_dir)

# The host's apt mirror, read from its own sources so no mirror host name is
# written into the repo. The host's apt configuration is never changed.
host_mirror() {
    local uri
    uri=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | awk '{print $2}')
    if [[ -z $uri ]]; then
        uri=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 | awk '{print $2}')
    fi
    [[ -n $uri ]] || die "cannot find a Debian mirror in the host's apt sources"
    echo "$uri"
}

# debootstrap is unpacked into the cache rather than installed on the host.
fetch_debootstrap() {
    local dir=$RBLN_CACHE/tools/debootstrap
    if [[ ! -x $dir/usr/sbin/debootstrap ]]; then
        log "fetching debootstrap (unpacked into the cache, not installed)"
        mkdir -p "$dir"
        local tmp; tmp=$(mktemp -d)
        (cd "$tmp" && apt-get download debootstrap >/dev/null 2>&1) || {
            apt-get update >/dev/null
            (cd "$tmp" && apt-get download debootstrap >/dev/null)
        }
        dpkg -x "$tmp"/debootstrap_*.deb "$dir"
        rm -rf "$tmp"
    fi
    echo "$dir"
}

# choose_version NAME PIN LINE: read the versions the archive serves (one
# per line) on stdin and print the one to install: the pinned upstream
# version if served, else the newest of LINE (with a warning), else fail
# naming the package. A LINE ending in "+" ("1.96+") also accepts, when
# nothing of the line is served, the newest release after it (with a
# warning): for packages where newer is compatible and Debian keeps only
# the newest backport (rustc: the kernel's Rust support takes any rustc
# from its minimum on).
choose_version() {
    local name=$1 pin=$2 line=$3 v up newer=0 later=""
    if [[ $line == *+ ]]; then newer=1; later=" or later"; line=${line%+}; fi
    versions=$(sort -Vr -u)
    [[ -n $versions ]] || die "package $name (pinned $pin) is not in the $SYSROOT_SUITE archive"
    for v in $versions; do
        up=${v#*:}; up=${up%%[-+~]*}
        if [[ $up == "$pin" ]]; then echo "$v"; return; fi
    done
    for v in $versions; do   # newest first
        up=${v#*:}
        if [[ $up == "$line"* ]]; then
            warn "package $name: pinned $pin is no longer served; using the newest of line $line: $v"
            echo "$v"
            return
        fi
    done
    if ((newer)); then
        v=$(head -1 <<<"$versions"); up=${v#*:}; up=${up%%[-+~]*}
        if [[ $(printf '%s\n' "$line" "$up" | sort -V | head -1) == "$line" ]]; then
            warn "package $name: no version of line $line is served; using the newest, later release: $v"
            echo "$v"
            return
        fi
    fi
    die "package $name: pinned $pin is gone and no version of line $line$later is served (have: $(echo $versions))"
}

# resolve_pin NAME PIN LINE: append NAME=VERSION for a pinned package, from
# the sysroot's archive, to PINS. A PIN of "=OTHER" is the upstream version
# chosen for the package OTHER listed before it, exactly (rust-src must be
# the source of the very rustc that builds the kernel); CHOSEN keeps the
# upstream version chosen per package.
declare -A CHOSEN=()
PINS=()
resolve_pin() {
    local name=$1 pin=$2 line=$3 v up
    if [[ $pin == =* ]]; then
        pin=${CHOSEN[${pin#=}]:?"$name follows ${pin#=}, which must be listed before it"}
        line=$pin
    fi
    v=$(in_sysroot apt-cache madison "$name" | awk -F'|' '{gsub(/ /,"",$2); print $2}' \
        | choose_version "$name" "$pin" "$line")
    up=${v#*:}; CHOSEN[$name]=${up%%[-+~]*}
    PINS+=("$name=$v")
}

main() {
    if [[ -f $ROOT/.complete ]]; then
        log "sysroot ready: $ROOT"
        return
    fi
    local mirror ds
    mirror=$(host_mirror)
    ds=$(fetch_debootstrap)
    rm -rf "$ROOT"
    log "debootstrap $SYSROOT_SUITE into $ROOT"
    DEBOOTSTRAP_DIR=$ds/usr/share/debootstrap "$ds/usr/sbin/debootstrap" \
        --variant=minbase --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
        "$SYSROOT_SUITE" "$ROOT" "$mirror" >"$RBLN_CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$RBLN_CACHE/debootstrap.log"; die "debootstrap failed (log: $RBLN_CACHE/debootstrap.log)"; }

    cat >"$ROOT/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: $SYSROOT_SUITE $SYSROOT_SUITE-updates $SYSROOT_SUITE-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    rm -f "$ROOT/etc/apt/sources.list"
    log "apt-get update in the sysroot"
    in_sysroot apt-get update -q >/dev/null

    local name pin line
    while read -r name pin line; do
        [[ -n $name ]] || continue
        resolve_pin "$name" "$pin" "$line"
    done <<<"$PINNED_PACKAGES"
    log "installing ${PINS[*]}"
    # shellcheck disable=SC2086
    in_sysroot apt-get install -y -q --no-install-recommends -t "$SYSROOT_SUITE-backports" \
        "${PINS[@]}" $SYSROOT_PACKAGES >"$RBLN_CACHE/sysroot-apt.log" 2>&1 \
        || { tail -30 "$RBLN_CACHE/sysroot-apt.log"; die "apt-get install in the sysroot failed"; }
    in_sysroot apt-get clean
    printf '%s\n' "${PINS[@]}" >"$ROOT/.pins"
    touch "$ROOT/.complete"
    log "sysroot ready: $ROOT ($(du -sh "$ROOT" | cut -f1))"
}

# Sourced by the tests for choose_version; run otherwise.
[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
