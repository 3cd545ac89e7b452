#!/usr/bin/env bash
# A Python for guest commands: the rbln wheel (scripts/build-python.sh),
# numpy and pytest (python/guest-requirements.txt) on a copy of the host's
# CPython, in target/guest-python/ (the guest sees the repo, target/
# included, over 9p), run as
#     target/guest-python/bin/python3 -m pytest python/tests
# (also on the guest's PATH as python3, see scripts/guest-init.sh).
#
# The guest runs the host's glibc (scripts/build-initramfs.sh), so the
# host's interpreter runs there unchanged; what it needs besides glibc
# (libz, libexpat, libffi, ... found with ldd) is copied next to it.
#
# Layout, self-contained and relocatable (the wrapper finds its directory):
#     bin/python3, bin/python    wrapper: sets PYTHONHOME, PYTHONPATH,
#                                LD_LIBRARY_PATH and runs bin/python3.X
#     lib/python3.X/             the standard library (+ lib-dynload)
#     lib/native/                shared libraries beyond glibc
#     site-packages/             numpy, pytest (pip install --target)
#     rbln/                      the rbln wheel, unpacked
#
# The interpreter, library and packages are built once into
# $RBLN_CACHE/guest-python-HASH (HASH: this script, the requirements, the
# host interpreter) and copied (hard links where possible) into target/;
# the wheel is re-unpacked when it changes. Idempotent; the last line on
# stdout is the wrapper's path.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REQ=$RBLN_ROOT/python/guest-requirements.txt
DEST=$RBLN_ROOT/target/guest-python
# The guest's initramfs has these already (scripts/build-initramfs.sh).
GLIBC_LIBS='ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1'
# Parts of the standard library a test run never needs (25 MB of them is
# the static libpython in config-*).
STDLIB_SKIP=(config-3.* idlelib tkinter turtledemo lib2to3 pydoc_data test ensurepip sitecustomize.py site-packages dist-packages)

# The build venv's interpreter (same CPython as the host's) and its base.
host_python() {
    "$RBLN_ROOT/scripts/setup-python.sh" "$RBLN_ROOT/python/build-requirements.txt" | tail -n 1
}

# Non-glibc shared libraries the ELF files given need, by absolute path.
native_deps() {
    local f
    for f in "$@"; do
        ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
    done | LC_ALL=C sort -u | while read -r lib; do
        case " $GLIBC_LIBS " in *" $(basename "$lib") "*) continue ;; esac
        echo "$lib"
    done
}

build_base() {
    local py=$1 out=$2 base ver exe stdlib stage
    read -r base ver exe stdlib < <("$py" -c 'import sys, sysconfig, os
print(sys.base_prefix, "%d.%d" % sys.version_info[:2], os.path.realpath(sys._base_executable), sysconfig.get_paths()["stdlib"])')
    [[ -x $exe && -d $stdlib ]] || die "cannot find the host interpreter ($exe) or its standard library ($stdlib)"
    stage=$(mktemp -d "$RBLN_CACHE/guest-python-stage.XXXXXX")
    log "guest python: CPython $ver from $exe"
    mkdir -p "$stage"/{bin,lib/native,site-packages}
    cp -L "$exe" "$stage/bin/python$ver"
    local -a excl=()
    local s
    for s in "${STDLIB_SKIP[@]}"; do excl+=(--exclude="./$s"); done
    # -h: Debian links a few stdlib files into /etc; copy what they point to.
    mkdir -p "$stage/lib/python$ver"
    tar -C "$stdlib" -chf - "${excl[@]}" . | tar -C "$stage/lib/python$ver" -xf -
    log "guest python: installing $(grep -cv '^\s*\(#\|$\)' "$REQ") pinned packages from python/guest-requirements.txt"
    "$py" -m pip install -q --no-input --disable-pip-version-check --target "$stage/site-packages" -r "$REQ" >&2 \
        || die "pip install --target failed"
    rm -rf "$stage/site-packages/bin"
    local -a elfs
    mapfile -t elfs < <(find "$stage" -name '*.so*' -type f; echo "$stage/bin/python$ver")
    local lib
    while read -r lib; do
        [[ $lib == "$stage"/* ]] && continue   # bundled (numpy.libs)
        cp -L "$lib" "$stage/lib/native/"
    done < <(native_deps "${elfs[@]}")
    cat >"$stage/bin/python3" <<EOF
#!/bin/sh
# Python for guest commands (scripts/build-guest-python.sh): this
# directory's interpreter, standard library and packages, nothing else.
here=\$(cd "\$(dirname "\$0")/.." && pwd)
export PYTHONHOME="\$here"
export PYTHONPATH="\$here/rbln\${RBLN_PYTHONPATH:+:\$RBLN_PYTHONPATH}:\$here/site-packages"
export LD_LIBRARY_PATH="\$here/lib/native\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PYTHONNOUSERSITE=1 PYTHONUTF8=1 PYTHONDONTWRITEBYTECODE=1
exec "\$here/bin/python$ver" "\$@"
EOF
    chmod +x "$stage/bin/python3"
    ln -s python3 "$stage/bin/python"
    # Everything imports from here, not from the host's own paths.
    env -i "$stage/bin/python3" -c 'import sys, numpy, pytest, asyncio, ctypes, json
assert not any(p.startswith("/usr") for p in sys.path), sys.path' \
        || die "the guest python does not start or import its packages"
    rm -rf "$out"
    mv "$stage" "$out"
    touch "$out/.complete"
    log "guest python: built $out ($(du -sh "$out" | cut -f1))"
}

main() {
    local py key base wheel
    py=$(host_python)
    key=$(hash_of "$0" "$REQ" "$("$py" -c 'import sys; print(sys.version)')" "$(sha256sum "$(readlink -f "$py")")")
    base=$RBLN_CACHE/guest-python-$key
    if [[ ! -f $base/.complete ]]; then
        exec 9>"$base.lock"
        flock 9
        [[ -f $base/.complete ]] || build_base "$py" "$base"
    fi

    if [[ "$(cat "$DEST/.key" 2>/dev/null)" != "$key" ]]; then
        log "guest python: installing into ${DEST#"$RBLN_ROOT"/}"
        rm -rf "$DEST"
        mkdir -p "$(dirname "$DEST")"
        cp -al "$base" "$DEST" 2>/dev/null || cp -a "$base" "$DEST"
        echo "$key" >"$DEST/.key"
    fi

    wheel=$("$RBLN_ROOT/scripts/build-python.sh" | tail -n 1)
    local wkey
    wkey=$(sha256sum "$wheel" | cut -c1-16)
    if [[ "$(cat "$DEST/rbln/.wheel" 2>/dev/null)" != "$wkey" ]]; then
        rm -rf "$DEST/rbln"
        mkdir -p "$DEST/rbln"
        "$py" -m zipfile -e "$wheel" "$DEST/rbln" || die "cannot unpack $wheel"
        echo "$wkey" >"$DEST/rbln/.wheel"
        log "guest python: rbln wheel unpacked ($(basename "$wheel"))"
    fi
    env -i "$DEST/bin/python3" -c 'import rbln' || die "the guest python cannot import rbln"
    log "guest python ready: ${DEST#"$RBLN_ROOT"/}/bin/python3 ($(du -sh "$DEST" | cut -f1))"
    echo "$DEST/bin/python3"
}

main "$@"
