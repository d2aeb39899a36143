#!/usr/bin/env bash
# The quick start: a local control plane with podset-apiserver registered, and a shell to use it (needs root).
# Arguments after -- run instead of the shell: hack/local-cluster.sh -- kubectl get podsets
set -euo pipefail
trap 'status=$?; echo "hack/local-cluster.sh: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2' ERR
cd "$(dirname "$0")/.."
hack/install-build-deps.sh
KUBEBUILDER_ASSETS="$(hack/install-test-assets.sh)"
export KUBEBUILDER_ASSETS
cargo build --release --locked -p podset-envtest --bin podset-local-cluster >&2
exec "${CARGO_TARGET_DIR:-target}/release/podset-local-cluster" "$@"
