#!/usr/bin/env bash
# The project's test command: installs the test binaries (cached), then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
KUBEBUILDER_ASSETS="$(hack/install-test-assets.sh)"
export KUBEBUILDER_ASSETS
echo "test assets: $KUBEBUILDER_ASSETS" >&2
cargo test --locked --lib --bins --tests "$@"
