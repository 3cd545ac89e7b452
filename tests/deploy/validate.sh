#!/usr/bin/env bash
# deploy/kubernetes/*.yaml against the Kubernetes API schemas, offline and
# strict (unknown fields are errors), with kubernetes-validate from the
# cached venv of deploy/requirements.txt. A copy with a misspelt field must
# fail, so the check is known to bite.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"

K8S_VERSION=1.33.0

main() {
    local py bin tmp
    py=$("$RBLN_ROOT/scripts/setup-python.sh" "$RBLN_ROOT/deploy/requirements.txt")
    bin=$(dirname "$py")/kubernetes-validate
    "$bin" --strict --quiet -k "$K8S_VERSION" "$RBLN_ROOT"/deploy/kubernetes/*.yaml \
        || die "deploy/kubernetes: invalid manifests (above)"
    log "deploy/kubernetes: $(ls "$RBLN_ROOT"/deploy/kubernetes/*.yaml | wc -l) files valid against Kubernetes $K8S_VERSION (strict)"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    sed 's/readOnlyRootFilesystem:/readOnlyRootFileSystem:/' "$RBLN_ROOT/deploy/kubernetes/rbln-device-plugin.yaml" >"$tmp/bad.yaml"
    if "$bin" --strict --quiet -k "$K8S_VERSION" "$tmp/bad.yaml" >"$tmp/out" 2>&1; then
        die "kubernetes-validate accepted a misspelt field: the check does not work"
    fi
    grep -q readOnlyRootFileSystem "$tmp/out" || die "kubernetes-validate failed without naming the bad field: $(cat "$tmp/out")"
    log "a misspelt field is refused: $(grep -m1 readOnlyRootFileSystem "$tmp/out")"
}

main "$@"
