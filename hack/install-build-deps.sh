#!/usr/bin/env bash
# What building podset-apiserver needs beyond Rust: protoc and the well-known .proto files, for the etcd client's
# gRPC code (etcd-client compiles etcd's .proto files at build time), and make and a C compiler for jemalloc.
# Debian packages; needs root the first time.
set -Eeuo pipefail
trap 'status=$?; echo "install-build-deps: ERROR: \`$BASH_COMMAND\` failed with exit status $status (hack/install-build-deps.sh line $LINENO)" >&2' ERR

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
# jemalloc (tikv-jemalloc-sys) is built from its C sources with make and a C compiler.
command -v make >/dev/null || need+=(make)
command -v cc >/dev/null || need+=(gcc)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "install-build-deps: ERROR: installing ${need[*]} needs root (apt-get)" >&2
  exit 1
fi
echo "install-build-deps: installing ${need[*]}" >&2
DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
