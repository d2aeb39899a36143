#!/usr/bin/env bash
# Builds podset-apiserver as one static executable and prints its path: glibc is linked in
# (-C target-feature=+crt-static on x86_64-unknown-linux-gnu), so the binary needs no shared library and runs on
# gcr.io/distroless/static, which has none. Used by the Dockerfile and by tests/static_binary.rs.
#
#   hack/build-static.sh [PROFILE]     PROFILE: release (default), or static-test (the test's quicker build)
#
# Host names still resolve: glibc >= 2.34 has its "files" and "dns" lookups inside libc itself, so the static
# binary reads /etc/hosts, /etc/resolv.conf and /etc/nsswitch.conf (which the image and the kubelet provide) without
# loading libnss_*.so. In a cluster, the main API server is reached at KUBERNETES_SERVICE_HOST, an IP address.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "hack/build-static.sh: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

profile="${1:-release}"
cargo="${CARGO:-cargo}"
target="$("${RUSTC:-rustc}" -vV | sed -n 's/^host: //p')"
if [[ "$target" != *-linux-gnu ]]; then
  echo "hack/build-static.sh: the host target is $target; this script makes a static glibc (linux-gnu) binary" >&2
  exit 1
fi
if [[ ! -e "$(gcc -print-file-name=libc.a 2>/dev/null || true)" ]]; then
  echo "hack/build-static.sh: glibc's static library (libc.a) is missing: install libc6-dev" >&2
  exit 1
fi
# Run from a test (tests/static_binary.rs), cargo's per-crate variables are set; build scripts that track them
# (ring's tracks CARGO_MANIFEST_DIR) would then rebuild half the tree every time it alternates with a plain run.
while read -r var; do unset "$var"; done < <(compgen -e | grep -E '^(CARGO_(MANIFEST_|PKG_|CRATE_|BIN_|PRIMARY_|TARGET_TMPDIR)|OUT_DIR$)' || true)
# The build date (build.rs) is the commit's time unless SOURCE_DATE_EPOCH says otherwise: the same commit builds
# the same binary, here, in hack/build-image.sh and in tests/static_binary.rs, without rebuilding in turn.
if [ -z "${SOURCE_DATE_EPOCH:-}" ] && epoch="$(git log -1 --format=%ct 2>/dev/null)"; then
  export SOURCE_DATE_EPOCH="$epoch"
fi
# With --target, RUSTFLAGS reach only the binary and its dependencies, not build scripts and proc macros (which
# the compiler loads as shared objects, so they must not be static). getrandom finds the getrandom(2) wrapper with
# dlsym, which a static binary cannot, and falls back to /dev/urandom, which an empty root has not: it is told to
# make the system call.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static --cfg getrandom_backend=\"linux_getrandom\"" \
  "$cargo" build --locked --profile "$profile" --target "$target" --bin podset-apiserver >&2
dir="${CARGO_TARGET_DIR:-target}"
[[ "$dir" = /* ]] || dir="$PWD/$dir"
echo "$dir/$target/$profile/podset-apiserver"
