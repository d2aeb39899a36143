#!/usr/bin/env bash
# Builds the last build that served only demo.k8s.io/v1alpha1 (the fixture build of hack/make-upgrade-fixture.sh)
# from this repository's history, once, into the test-asset cache, and prints its binary's path. The rolling
# upgrade and rollback test (tests/robustness.rs) runs it beside this build.
# If PODSET_OLD_RELEASE_BIN already names an executable, it is used as it is. Progress goes to stderr.
set -Eeuo pipefail

COMMIT=1e229b9174e75f80c3fdfcf22b1826e357ca9d57

log() { echo "install-old-release: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
trap 'status=$?; log "ERROR: \`$BASH_COMMAND\` failed with exit status $status (hack/install-old-release.sh line $LINENO)"' ERR

if [ -n "${PODSET_OLD_RELEASE_BIN:-}" ] && [ -x "$PODSET_OLD_RELEASE_BIN" ]; then
  echo "$PODSET_OLD_RELEASE_BIN"
  exit 0
fi

here="$(cd "$(dirname "$0")/.." && pwd)"
root="${PODSET_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/podset-apiserver/assets}"
dir="$root/podset-apiserver-${COMMIT:0:12}"
bin="$dir/bin/podset-apiserver"
if [ -x "$bin" ] && [ -e "$dir/.complete" ]; then
  echo "$bin"
  exit 0
fi

git -C "$here" cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
  die "commit $COMMIT is not in this checkout's history (a shallow clone?): fetch it with \`git fetch --unshallow\`"
log "building podset-apiserver at ${COMMIT:0:12} (a few minutes, once) into $dir"
rm -rf "$dir"
mkdir -p "$dir/src" "$dir/bin"
git -C "$here" archive "$COMMIT" | tar -x -C "$dir/src"
# Its own target directory: the current build's is never touched. Its build.rs records the commit it is.
(
  cd "$dir/src"
  PODSET_GIT_COMMIT=$COMMIT PODSET_GIT_TREE_STATE=clean CARGO_TARGET_DIR="$dir/target" CARGO_INCREMENTAL=0 \
    cargo build --locked --profile static-test --bin podset-apiserver >&2
)
cp "$dir/target/static-test/podset-apiserver" "$bin"
rm -rf "$dir/target" "$dir/src"
"$bin" --version >&2 || die "the built binary does not run"
touch "$dir/.complete"
echo "$bin"
