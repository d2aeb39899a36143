#!/usr/bin/env bash
# Builds an image as an OCI image archive (an OCI image layout in a tar, what `skopeo copy oci-archive:...`,
# `ctr images import`, `podman load` and `kind load image-archive` read), without a container engine, and prints
# the archive's path:
#
#   hack/build-image.sh [IMAGE] [PROFILE]
#     IMAGE    podset-apiserver (default): hack/build-static.sh's binary, user 65532, as the Dockerfile builds it
#              pause: the Pod sandbox for the local node (images/src/bin/pause.rs), user 65535
#              podset-demo: the demo workload (images/src/bin/podset-demo.rs), user 65532
#     PROFILE  cargo profile of podset-apiserver's binary: release (default), or static-test (the tests' quicker one)
#   hack/build-image.sh --rootfs DIR [IMAGE] [PROFILE]   only writes the image's files into DIR (the Dockerfile's way)
#
# One layer, no base image: the binary (static, so it needs no libc), /etc/passwd and /etc/group naming the user,
# /etc/nsswitch.conf, /tmp, /home/nonroot. The labels are org.opencontainers.image.*, `revision` the git commit the binary was
# built from (PODSET_GIT_COMMIT if set, as build.rs takes it).
#
# Reproducible: file times, the image's `created` and the binary's build date are SOURCE_DATE_EPOCH (default: the
# commit's time), owners are numeric, tar entries sorted, gzip without a name or time; the same binary and
# SOURCE_DATE_EPOCH give the same archive, byte for byte. IMAGE_TAG overrides the tag (default v<version>-<commit>
# for podset-apiserver, v<version> of images/Cargo.toml for the node's).
# The archive names the image docker.io/library/<image>:<tag>, the name the kubelet looks up for `<image>:<tag>`.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.." # the checkout, also when called through a symlink
trap 'status=$?; echo "hack/build-image.sh: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2' ERR

rootfs_only=""
if [ "${1:-}" = "--rootfs" ]; then
  rootfs_only="$2"
  shift 2
fi
image="${1:-podset-apiserver}"
profile="${2:-release}"

commit="${PODSET_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}"
# Without git (a Docker build's context), the archive's time is now, and --rootfs leaves the build date to build.rs.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || true)"
  [ -n "$SOURCE_DATE_EPOCH" ] || [ -n "$rootfs_only" ] || SOURCE_DATE_EPOCH="$(date +%s)"
fi
export SOURCE_DATE_EPOCH
version() { sed -n 's/^version = "\(.*\)"/\1/p' "$1" | head -1; }
# The architecture a binary was built for, from its ELF header's e_machine, as OCI names it.
arch_of() {
  case "$(od -An -j18 -N2 -tx2 "$1" | tr -d ' ')" in
    003e) echo amd64 ;;
    00b7) echo arm64 ;;
    *) echo "hack/build-image.sh: $1 is neither an x86-64 nor an aarch64 ELF binary" >&2; return 1 ;;
  esac
}
target_dir="${CARGO_TARGET_DIR:-target}"
[[ "$target_dir" = /* ]] || target_dir="$PWD/$target_dir"

case "$image" in
  podset-apiserver)
    # PODSET_STATIC_BIN: a static binary already built (hack/build-static.sh), packed as it is.
    binary="${PODSET_STATIC_BIN:-$(hack/build-static.sh "$profile")}"
    user=65532
    title="podset-apiserver"
    tag="${IMAGE_TAG:-v$(version Cargo.toml)${commit:+-${commit:0:12}}}"
    description="$(sed -n 's/^description = "\(.*\)"/\1/p' Cargo.toml | head -1)"
    ;;
  pause | podset-demo)
    host="$(rustc -vV | sed -n 's/^host: //p')"
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
      cargo build --locked --profile node-image --target "$host" -p podset-node-images --bin "$image" >&2
    binary="$target_dir/$host/node-image/$image"
    if [ "$image" = pause ]; then
      user=65535 # as Kubernetes' own pause image
      description="The Pod sandbox process of podset-apiserver's local node"
    else
      user=65532
      description="A demo workload: serves /healthz and /readyz, exits when told to"
    fi
    title="$image"
    # A tag that stays put, for the README's PodSet example: images/ changes seldom, and each local node
    # imports the archive afresh.
    tag="${IMAGE_TAG:-v$(version images/Cargo.toml)}"
    ;;
  *)
    echo "hack/build-image.sh: unknown image $image (podset-apiserver, pause or podset-demo)" >&2
    exit 2
    ;;
esac

arch="$(arch_of "$binary")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
rootfs="${rootfs_only:-$work/rootfs}"
mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/home/nonroot"
install -m 0755 "$binary" "$rootfs/$image"
cat > "$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$rootfs/etc/group" <<EOF
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
# glibc's static lookups read it (see hack/build-static.sh); the kubelet mounts /etc/hosts and /etc/resolv.conf.
echo "hosts: files dns" > "$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
chmod 1777 "$rootfs/tmp"
chmod 0700 "$rootfs/home/nonroot"
chown -R 0:0 "$rootfs"
chown 65532:65532 "$rootfs/home/nonroot"
if [ -n "$rootfs_only" ]; then
  echo "$rootfs_only"
  exit 0
fi

# A tar whose bytes depend only on the files: sorted, one time, numeric owners, no atime/ctime in PAX headers.
det_tar() {
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime "$@"
}
layout="$work/layout"
mkdir -p "$layout/blobs/sha256"
det_tar -C "$rootfs" -cf "$work/layer.tar" .
gzip -n -9 -c "$work/layer.tar" > "$work/layer.tar.gz"

created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
python3 - "$layout" "$work/layer.tar" "$work/layer.tar.gz" <<EOF
import hashlib, json, os, shutil, sys
layout, tar, gz = sys.argv[1:4]
def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()
def blob(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(os.path.join(layout, "blobs", "sha256", digest[7:]), "wb") as f:
        f.write(data)
    return digest, len(data)
def dumps(v):
    return json.dumps(v, sort_keys=True, separators=(",", ":")).encode()
layer_digest = sha(gz)
shutil.copyfile(gz, os.path.join(layout, "blobs", "sha256", layer_digest[7:]))
labels = {
    "org.opencontainers.image.title": "$title",
    "org.opencontainers.image.description": "$description",
    "org.opencontainers.image.version": "$tag",
    "org.opencontainers.image.revision": "$commit",
    "org.opencontainers.image.created": "$created",
    "org.opencontainers.image.licenses": "Apache-2.0",
}
config = {
    "created": "$created",
    "architecture": "$arch",
    "os": "linux",
    "config": {
        "User": "$user:$user",
        "Entrypoint": ["/$image"],
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
        "WorkingDir": "/",
        "Labels": labels,
    },
    "rootfs": {"type": "layers", "diff_ids": [sha(tar)]},
    "history": [{"created": "$created", "created_by": "hack/build-image.sh $image"}],
}
config_digest, config_size = blob(dumps(config))
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
    "layers": [{
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": layer_digest,
        "size": os.path.getsize(gz),
    }],
    "annotations": {k: v for k, v in labels.items() if k in ("org.opencontainers.image.revision", "org.opencontainers.image.created")},
}
manifest_digest, manifest_size = blob(dumps(manifest))
# As BuildKit's OCI exporter: the tag for OCI tools, the full name for containerd's importer.
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": manifest_digest,
        "size": manifest_size,
        "platform": {"architecture": "$arch", "os": "linux"},
        "annotations": {
            "io.containerd.image.name": "docker.io/library/$image:$tag",
            "org.opencontainers.image.ref.name": "$tag",
        },
    }],
}
with open(os.path.join(layout, "index.json"), "wb") as f:
    f.write(dumps(index))
with open(os.path.join(layout, "oci-layout"), "wb") as f:
    f.write(dumps({"imageLayoutVersion": "1.0.0"}))
EOF

out="${PODSET_IMAGE_DIR:-$target_dir/images}"
mkdir -p "$out"
archive="$out/$image.oci.tar"
det_tar --owner=0 --group=0 -C "$layout" -cf "$archive.tmp" oci-layout index.json blobs
mv "$archive.tmp" "$archive"
echo "hack/build-image.sh: docker.io/library/$image:$tag ($(sha256sum "$archive" | cut -c1-12)) in $archive" >&2
echo "$archive"
