#!/usr/bin/env bash
# Writes the documentation that is made from the program (docs/flags.md, from `podset-apiserver --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
PODSET_UPDATE_DOCS=1 cargo test --locked --test docs
