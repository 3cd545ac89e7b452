#!/usr/bin/env bash
# A Python environment for the tests: a venv holding the pinned packages of
# one requirements file. Without an argument it is the compiler tests' venv,
# tests/models/requirements.txt (onnx, onnxruntime, numpy), used to build
# the ONNX test models and their reference outputs; the exporters' venvs
# (tests/models/exports/*.txt: PyTorch, TensorFlow) are made the same way.
#
# The venv lives in $RBLN_CACHE/pyenv-HASH, HASH being a short hash of the
# requirements file, so changing a pin makes a new venv. A line
# `# import: a b c` in the file names the modules checked after the install
# (default: onnx onnxruntime numpy). Idempotent: a complete venv (marked by
# .complete) is reused at once. Logs go to stderr; the last line on stdout
# is the venv's python, e.g.
#     PY=$(scripts/setup-python.sh) && "$PY" tests/models/gen_models.py OUT
#     PY=$(scripts/setup-python.sh tests/models/exports/torch.txt)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

REQ=${1:-$RBLN_ROOT/tests/models/requirements.txt}
[[ $REQ = /* ]] || REQ=$PWD/$REQ
[[ -f $REQ ]] || die "missing $REQ"
REQ_NAME=${REQ#"$RBLN_ROOT"/}
IMPORTS=$(sed -n 's/^# import: *//p' "$REQ" | head -n 1)
IMPORTS=${IMPORTS:-onnx onnxruntime numpy}
VENV=$RBLN_CACHE/pyenv-$(hash_of "$REQ")
PY=$VENV/bin/python

ready() { [[ -f $VENV/.complete && -x $PY ]]; }

# The system interpreter: Debian's, not whatever a version manager puts
# first on PATH, so every machine builds the same environment.
system_python() {
    if [[ -x /usr/bin/python3 ]]; then
        echo /usr/bin/python3
    elif command -v python3 >/dev/null; then
        command -v python3
    else
        die "python3 is missing (install Debian's python3)"
    fi
}

# Debian splits venv's pip bootstrap (ensurepip) into python3-venv; install
# it when missing, as setup.sh installs missing host tools.
ensure_venv_module() {
    local py=$1
    "$py" -c 'import venv, ensurepip' 2>/dev/null && return
    command -v apt-get >/dev/null || die "$py has no venv/ensurepip module and apt-get is missing: install python3-venv"
    log "installing missing host package: python3-venv"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
    "$py" -c 'import venv, ensurepip' 2>/dev/null \
        || die "$py still has no venv/ensurepip module after installing python3-venv"
}

main() {
    if ready; then
        log "python venv ready: $VENV"
        echo "$PY"
        return
    fi

    # One builder at a time; a second one waits, then finds the venv ready.
    exec 9>"$VENV.lock"
    flock 9
    if ready; then
        log "python venv ready: $VENV"
        echo "$PY"
        return
    fi

    local sys_py
    sys_py=$(system_python)
    ensure_venv_module "$sys_py"

    # A venv without .complete is what an interrupted run left: start over.
    # (A venv cannot be built elsewhere and renamed, since pip writes its
    # absolute path into the scripts it installs.)
    rm -rf "$VENV"
    log "creating python venv $VENV ($("$sys_py" --version 2>&1))"
    "$sys_py" -m venv "$VENV" >&2 || die "python -m venv failed"
    log "installing $(grep -cv '^\s*\(#\|$\)' "$REQ") pinned packages from $REQ_NAME"
    "$PY" -m pip install -q --no-input --disable-pip-version-check -r "$REQ" >&2 \
        || die "pip install -r $REQ_NAME failed"
    "$PY" -c "import ${IMPORTS// /, }" >&2 \
        || die "the venv's packages do not import ($IMPORTS)"
    touch "$VENV/.complete"
    log "python venv ready: $VENV"
    echo "$PY"
}

main "$@"
