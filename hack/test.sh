#!/usr/bin/env bash
# The project's test command: installs the test binaries (cached), then runs every test.
set -euo pipefail
trap 'status=$?; echo "hack/test.sh: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2' ERR
cd "$(dirname "$0")/.."
hack/install-build-deps.sh
KUBEBUILDER_ASSETS="$(hack/install-test-assets.sh)"
export KUBEBUILDER_ASSETS
echo "test assets: $KUBEBUILDER_ASSETS" >&2
# The last build that served only v1alpha1, for the rolling upgrade and rollback test (built once, cached).
PODSET_OLD_RELEASE_BIN="$(hack/install-old-release.sh)"
export PODSET_OLD_RELEASE_BIN
# Its image, for the life cycle on the local node (tests/install.rs; built once, cached).
PODSET_OLD_RELEASE_IMAGE="$(hack/install-old-release.sh --image)"
export PODSET_OLD_RELEASE_IMAGE
cargo test --locked --workspace --lib --bins --tests "$@"
