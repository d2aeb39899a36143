#!/usr/bin/env bash
# Builds a release into one directory and prints its path:
#
#   hack/release.sh VERSION [OUT]      VERSION like v0.1.0; OUT default: target/dist
#
#   OUT/podset-apiserver-VERSION/
#     podset-apiserver-VERSION-linux-ARCH     the static binary (hack/build-static.sh), ARCH the machine's (amd64)
#     podset-apiserver-VERSION.oci.tar        the image as an OCI archive, tagged VERSION (hack/build-image.sh)
#     image.digest, image.ref                 the image's digest, and IMAGE_REPO:VERSION@digest
#     manifests/<overlay>/podset-apiserver.yaml   each overlay of deploy/overlays rendered, the image pinned by
#                                             digest: one directory per overlay, as they exclude each other
#     manifests/backup/backup.yaml            deploy/backup's CronJob, the same image (beside any overlay)
#     restore/restore.yaml                    the restore Job, applied alone by docs/operate.md's steps (never
#                                             with the manifests)
#     sbom.cdx.json                           the binary's dependencies, CycloneDX (cargo-cyclonedx)
#     SHA256SUMS                              of all of the above
#
# It refuses a VERSION other than Cargo.toml's (the binary's --version and /version are Cargo.toml's) and a tree
# with changes or untracked files (a release is built from a commit).
#
# The binary, the archive and the manifests are reproducible: the same commit gives the same bytes (their times are
# the commit's, SOURCE_DATE_EPOCH). The SBOM carries its own time and serial number.
# IMAGE_REPO names the image in the manifests (default docker.io/library/podset-apiserver, what the archive is named
# on a node it is imported into); PROFILE the cargo profile (release; the tests use static-test). Only the
# machine's own architecture is built (this machine's toolchain has no aarch64 target).
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'status=$?; echo "hack/release.sh: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2' ERR

version="${1:?usage: hack/release.sh VERSION [OUT]}"
if ! [[ "$version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
  echo "hack/release.sh: VERSION must look like v1.2.3 (or v1.2.3-rc.1), not $version" >&2
  exit 1
fi
cargo_version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
if [ "${version#v}" != "$cargo_version" ]; then
  echo "hack/release.sh: VERSION $version is not Cargo.toml's version ($cargo_version): set it there and commit first, so that --version and /version say $version" >&2
  exit 1
fi
if [ -n "$(git status --porcelain)" ]; then
  echo "hack/release.sh: the tree has changes or untracked files (git status): a release is built from a commit" >&2
  exit 1
fi
out_root="${2:-target/dist}"
profile="${PROFILE:-release}"
repo="${IMAGE_REPO:-docker.io/library/podset-apiserver}"
name="podset-apiserver-$version"
mkdir -p "$out_root"
out="$(cd "$out_root" && pwd)/$name"
rm -rf "$out"
mkdir -p "$out/manifests" "$out/restore"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)"
fi
export SOURCE_DATE_EPOCH

echo "hack/release.sh: the static binary ($profile)" >&2
binary="$(hack/build-static.sh "$profile")"
case "$(rustc -vV | sed -n 's/^host: //p')" in
  x86_64-*) arch=amd64 ;;
  aarch64-*) arch=arm64 ;;
  *) echo "hack/release.sh: a host neither x86-64 nor aarch64" >&2; exit 1 ;;
esac
cp "$binary" "$out/$name-linux-$arch"
touch -d "@$SOURCE_DATE_EPOCH" "$out/$name-linux-$arch"

echo "hack/release.sh: the image" >&2
archive="$(PODSET_STATIC_BIN="$binary" IMAGE_TAG="$version" hack/build-image.sh podset-apiserver "$profile")"
cp "$archive" "$out/$name.oci.tar"
digest="$(tar -xOf "$out/$name.oci.tar" index.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')"
echo "hack/release.sh: image $repo:$version@$digest" >&2
printf '%s\n' "$digest" > "$out/image.digest"
printf '%s:%s@%s\n' "$repo" "$version" "$digest" > "$out/image.ref"
touch -d "@$SOURCE_DATE_EPOCH" "$out/image.digest" "$out/image.ref"

echo "hack/release.sh: the manifests" >&2
kubectl="${KUBECTL:-}"
if [ -z "$kubectl" ]; then
  if command -v kubectl >/dev/null; then
    kubectl=kubectl
  else
    kubectl="$(hack/install-test-assets.sh)/kubectl"
  fi
fi
# kustomize takes only paths relative to the kustomization: a scratch one under target/ pins the image.
scratch="target/release-kustomize"
render() { # NAME RESOURCE FILE: FILE (under OUT) from RESOURCE (relative to the scratch kustomization)
  cat > "$scratch/$1/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- $2
images:
- {name: podset-apiserver, newName: $repo, digest: "$digest"}
EOF
  mkdir -p "$(dirname "$out/$3")"
  "$kubectl" kustomize "$scratch/$1" > "$out/$3"
  touch -d "@$SOURCE_DATE_EPOCH" "$out/$3"
}
rm -rf "$scratch"
for overlay_dir in deploy/overlays/*/; do
  overlay="$(basename "$overlay_dir")"
  mkdir -p "$scratch/$overlay"
  render "$overlay" "../../../deploy/overlays/$overlay" "manifests/$overlay/podset-apiserver.yaml"
done
mkdir -p "$scratch/backup" "$scratch/restore"
render backup ../../../deploy/backup manifests/backup/backup.yaml
# restore.yaml is one file, not a kustomization; kustomize reads files only under its own directory.
cp deploy/backup/restore.yaml "$scratch/restore/"
render restore restore.yaml restore/restore.yaml
rm -rf "$scratch"

echo "hack/release.sh: the SBOM" >&2
if ! cargo cyclonedx --version >/dev/null 2>&1; then
  echo "hack/release.sh: installing cargo-cyclonedx" >&2
  cargo install --locked --quiet cargo-cyclonedx --version 0.5.9 >&2
fi
cargo cyclonedx --format json --target "$(rustc -vV | sed -n 's/^host: //p')" --override-filename podset-apiserver.cdx >&2
mv podset-apiserver.cdx.json "$out/sbom.cdx.json"
find envtest robustness images -maxdepth 1 -name 'podset-apiserver.cdx.json' -delete

(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum > SHA256SUMS)
echo "$out"
