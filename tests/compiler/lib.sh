# Shared by the compile scripts of tests/compiler/ (source it after
# scripts/lib.sh, with COMPILE and OUT set).

fail() { log "FAIL: $*"; exit 1; }

# expect_error STATUS MESSAGE ARGS...: rbln-compile ARGS fails with STATUS
# and prints MESSAGE (a fixed string).
expect_error() {
    local want=$1 msg=$2 rc=0; shift 2
    "$COMPILE" "$@" >"$OUT/err.txt" 2>&1 || rc=$?
    cat "$OUT/err.txt" >&2
    [[ $rc == "$want" ]] || fail "rbln-compile $*: status $rc, expected $want"
    grep -qF -- "$msg" "$OUT/err.txt" || fail "rbln-compile $*: message lacks '$msg'"
    log "ok - rbln-compile $* fails (status $rc): $msg"
}

# cached_exports KIND REQUIREMENTS EXPORTER [ARGS...]: the directory
# $RBLN_CACHE/KIND-HASH (HASH: the exporter and the requirements file)
# holding what `EXPORTER DIR ARGS...` writes, run once in the venv of
# REQUIREMENTS (one builder at a time; its stdout is kept in models.txt,
# its stderr in export.log). Prints the directory. Making a new one
# removes the KIND caches it supersedes (older exporters or pins) that
# were completed over an hour ago and are not being built.
prune_superseded() {
    local kind=$1 keep=$2 old
    for old in "$RBLN_CACHE/$kind"-????????????; do
        [[ $old != "$keep" && -d $old && -f $old/.complete ]] || continue
        [[ -z $(find "$old/.complete" -mmin -60) ]] || continue
        # Skip one another run holds (a builder keeps its lock open).
        if flock -n "$old.lock" rm -rf "$old"; then
            rm -f "$old.lock"
            log "removed the superseded cache $old"
        fi
    done
}

cached_exports() {
    local kind=$1 req=$2 exporter=$3 cache py; shift 3
    # EXPORT_DEPS: more files the exporter reads (their change re-exports).
    cache=$RBLN_CACHE/$kind-$(hash_of "$exporter" "$req" ${EXPORT_DEPS:-})
    if [[ ! -f $cache/.complete ]]; then
        py=$("$RBLN_ROOT/scripts/setup-python.sh" "$req" | tail -n 1)
        exec 9>"$cache.lock"
        flock 9
        if [[ ! -f $cache/.complete ]]; then
            rm -rf "$cache"
            mkdir -p "$cache"
            log "exporting with $(basename "$exporter") into $cache"
            "$py" "$exporter" "$cache" "$@" 2>"$cache/export.log" | tee "$cache/models.txt" >&2 \
                || { tail -n 30 "$cache/export.log" >&2; fail "$(basename "$exporter") failed (log: $cache/export.log)"; }
            touch "$cache/.complete"
            prune_superseded "$kind" "$cache"
        fi
        exec 9>&-
    else
        log "exports cached in $cache"
    fi
    echo "$cache"
}
