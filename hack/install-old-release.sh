#!/usr/bin/env bash
# Builds the last build that served only demo.k8s.io/v1alpha1 (the fixture build of hack/make-upgrade-fixture.sh)
# from this repository's history, once, into the test-asset cache, and prints its binary's path. The rolling
# upgrade and rollback test (tests/robustness.rs) runs it beside this build, tests/encryption.rs on a store this
# build decrypted; its image (--image) is what docs/install.md's life cycle installs first (tests/install.rs).
# If PODSET_OLD_RELEASE_BIN already names an executable, it is used as it is. Progress goes to stderr.
#
#   hack/install-old-release.sh           prints the old build's binary (bin/podset-apiserver)
#   hack/install-old-release.sh --image   prints the old build's OCI image archive, for a local cluster's node
#
# --image: the old tree's own hack/build-image.sh builds the archive once, into the cache directory beside the
# binary's: podset-apiserver-1e229b9174e7-image/podset-apiserver.oci.tar. The image is
# docker.io/library/podset-apiserver:v0.1.0-1e229b9174e7 (what the kubelet looks up for
# podset-apiserver:v0.1.0-1e229b9174e7), its revision label the commit, its time the commit's. The image has no
# libc, so its binary is a static build of its own (the old hack/build-static.sh, profile static-test: several
# minutes more), not the binary above, which links the host's libc. Building it needs root (the old
# hack/build-image.sh chowns the image's files). If PODSET_OLD_RELEASE_IMAGE already names a file, it is used as it is.
set -Eeuo pipefail

COMMIT=1e229b9174e75f80c3fdfcf22b1826e357ca9d57

log() { echo "install-old-release: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck disable=SC2154 # status is assigned in the trap's own command
trap 'status=$?; log "ERROR: \`$BASH_COMMAND\` failed with exit status $status (hack/install-old-release.sh line $LINENO)"' ERR

image=""
case "$*" in
  "") ;;
  --image) image=1 ;;
  *)
    echo "usage: hack/install-old-release.sh [--image]" >&2
    exit 2
    ;;
esac

if [ -n "$image" ]; then
  if [ -n "${PODSET_OLD_RELEASE_IMAGE:-}" ] && [ -f "$PODSET_OLD_RELEASE_IMAGE" ]; then
    echo "$PODSET_OLD_RELEASE_IMAGE"
    exit 0
  fi
elif [ -n "${PODSET_OLD_RELEASE_BIN:-}" ] && [ -x "$PODSET_OLD_RELEASE_BIN" ]; then
  echo "$PODSET_OLD_RELEASE_BIN"
  exit 0
fi

here="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
root="${PODSET_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/podset-apiserver/assets}"
dir="$root/podset-apiserver-${COMMIT:0:12}"
bin="$dir/bin/podset-apiserver"
need_commit() {
  git -C "$here" cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
    die "commit $COMMIT is not in this checkout's history (a shallow clone?): fetch it with \`git fetch --unshallow\`"
}

if [ -n "$image" ]; then
  # A directory beside the binary's, not in it: building the binary starts by emptying its own directory.
  idir="$dir-image"
  archive="$idir/podset-apiserver.oci.tar"
  tag="v0.1.0-${COMMIT:0:12}" # what the old hack/build-image.sh names it by default: v<version>-<commit>
  if [ -f "$archive" ] && [ -e "$idir/.complete" ]; then
    echo "$archive"
    exit 0
  fi
  need_commit
  [ "$(id -u)" = 0 ] || die "building the image needs root: the old hack/build-image.sh chowns the image's files to 0:0"
  log "building the image podset-apiserver:$tag at ${COMMIT:0:12} (a static build, several minutes, once) into $idir"
  rm -rf "$idir"
  mkdir -p "$idir/src"
  git -C "$here" archive "$COMMIT" | tar -x -C "$idir/src"
  # The extracted tree is no git checkout: the commit and its time are given. PODSET_STATIC_BIN is not passed on
  # (the old script would pack that binary), so it builds its own with the old hack/build-static.sh.
  epoch="$(git -C "$here" log -1 --format=%ct "$COMMIT")"
  built="$(
    cd "$idir/src"
    env -u PODSET_STATIC_BIN PODSET_GIT_COMMIT="$COMMIT" PODSET_GIT_TREE_STATE=clean SOURCE_DATE_EPOCH="$epoch" \
      IMAGE_TAG="$tag" PODSET_IMAGE_DIR="$idir" CARGO_TARGET_DIR="$idir/target" CARGO_INCREMENTAL=0 \
      hack/build-image.sh podset-apiserver static-test
  )"
  [ "$built" = "$archive" ] || die "the old hack/build-image.sh printed $built, not $archive"
  rm -rf "$idir/target" "$idir/src"
  tar -xOf "$archive" index.json | grep -F "\"docker.io/library/podset-apiserver:$tag\"" >/dev/null ||
    die "$archive does not name podset-apiserver:$tag"
  touch "$idir/.complete"
  echo "$archive"
  exit 0
fi

if [ -x "$bin" ] && [ -e "$dir/.complete" ]; then
  echo "$bin"
  exit 0
fi

need_commit
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
