# syntax=docker/dockerfile:1
# podset-apiserver's image for those who build with Docker: the same files, user, entrypoint and labels (but
# `version` and `created`) as hack/build-image.sh's OCI archive, which needs no container engine (docs/install.md).
#
#   docker build -t podset-apiserver:dev \
#     --build-arg PODSET_GIT_COMMIT="$(git rev-parse HEAD)" \
#     --build-arg SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)" .
#
# One static binary (hack/build-static.sh links glibc in, +crt-static) on an empty base: no shell, no libc, user
# 65532 (distroless's "nonroot"). tests/static_binary.rs starts that binary in an empty root; tests/image.rs runs
# the archive under runc. Host names still resolve: glibc >= 2.34 (bookworm has 2.36) does its "files" and "dns"
# lookups inside libc itself, reading /etc/hosts and /etc/resolv.conf, which the kubelet mounts; in a cluster the
# main API server is reached at the IP in KUBERNETES_SERVICE_HOST anyway. The builder is Debian bookworm, the glibc
# the tests run with.
#
# .dockerignore leaves .git out, so the commit comes from PODSET_GIT_COMMIT (empty if not given: /version then says
# gitTreeState "unknown" rather than guess). The build date is SOURCE_DATE_EPOCH if given, else the build's time.

ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN hack/install-build-deps.sh
ARG PODSET_GIT_COMMIT=""
ARG PODSET_GIT_TREE_STATE=""
ARG SOURCE_DATE_EPOCH=""
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    hack/build-image.sh --rootfs /rootfs podset-apiserver release && /rootfs/podset-apiserver --version

FROM scratch
COPY --from=build /rootfs/ /
ARG PODSET_GIT_COMMIT=""
LABEL org.opencontainers.image.title="podset-apiserver" \
      org.opencontainers.image.description="An aggregated Kubernetes API server serving PodSet (demo.k8s.io/v1beta1 and v1alpha1) from its own storage" \
      org.opencontainers.image.revision="${PODSET_GIT_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/usr/local/bin:/usr/bin:/bin
# Numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
# The data directory (--data-dir) is a volume; the root filesystem can stay read-only.
ENTRYPOINT ["/podset-apiserver"]
