# syntax=docker/dockerfile:1
# podset-apiserver's image: a static binary on gcr.io/distroless/static (no shell, no libc, user 65532).
#
#   docker build -t podset-apiserver:dev \
#     --build-arg PODSET_GIT_COMMIT="$(git rev-parse HEAD)" \
#     --build-arg SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)" .
#
# Why static rather than distroless/cc (which carries glibc): one file, and nothing in the image for it to break on.
# hack/build-static.sh links glibc into the binary (+crt-static); tests/static_binary.rs builds it the same way and
# starts it in an empty root, as user 65532, with only its certificate files and data directory. Host names still
# resolve: glibc >= 2.34 (bookworm has 2.36) does its "files" and "dns" lookups inside libc itself, reading
# /etc/hosts and /etc/resolv.conf, which the kubelet mounts; in a cluster the main API server is reached at the IP in
# KUBERNETES_SERVICE_HOST anyway. The builder is Debian bookworm, the glibc the tests run with.
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
    bin="$(hack/build-static.sh release)" && cp "$bin" /podset-apiserver && /podset-apiserver --version

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /podset-apiserver /podset-apiserver
# distroless "nonroot"; numeric, so that runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
# The data directory (--data-dir) is a volume; the root filesystem can stay read-only.
ENTRYPOINT ["/podset-apiserver"]
