#!/usr/bin/env bash
# Makes tests/fixtures/v1alpha1-release/: the stores a build serving only demo.k8s.io/v1alpha1 leaves behind (a sled
# data directory, and etcd's keys), and what that build served from them. tests/versions.rs starts the current build on
# them. Run once with the old build's binary, e.g. for the last build before v1beta1:
#   git worktree add /tmp/old 1e229b9 && (cd /tmp/old && cargo build --release --bin podset-apiserver)
#   hack/make-upgrade-fixture.sh /tmp/old/target/release/podset-apiserver
set -euo pipefail
trap 'status=$?; echo "make-upgrade-fixture.sh: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2' ERR
cd "$(dirname "$0")/.."
old=$(realpath "${1:?usage: hack/make-upgrade-fixture.sh OLD_PODSET_APISERVER_BINARY}")
out=tests/fixtures/v1alpha1-release
assets=$(hack/install-test-assets.sh)
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# Starts the old server with "$@", waits until it serves, and sets $base.
start_old() {
    local log=$work/server.log
    : >"$log"
    "$old" --bind-address 127.0.0.1 --secure-port 0 --log-format json --insecure-allow-all "$@" 2>"$log" &
    server=$!
    pids+=("$server")
    for _ in $(seq 100); do
        addr=$(grep -o '"address":"[^"]*"' "$log" | head -1 | cut -d'"' -f4 || true)
        [ -n "$addr" ] && break
        sleep 0.1
    done
    [ -n "$addr" ] || { cat "$log" >&2; exit 1; }
    base="https://$addr/apis/demo.k8s.io/v1alpha1"
}

stop_old() {
    kill -TERM "$server"
    wait "$server" || true
}

call() { # METHOD PATH CONTENT-TYPE BODY
    local code
    code=$(curl -sk -o "$work/answer" -w '%{http_code}' -X "$1" -H "content-type: $3" --data-binary "$4" "$base$2")
    case "$code" in 2*) ;; *) echo "$1 $2: $code $(cat "$work/answer")" >&2; exit 1 ;; esac
}

# What users of the old build had: plain objects, one applied and then scaled by another manager, status written,
# one waiting on a finalizer, the annotation v1beta1 reads as spec.minReadySeconds (and one it cannot read so).
write_objects() {
    local tmpl='"template":{"metadata":{"labels":{"app":"APP"}},"spec":{"containers":[{"name":"main","image":"busybox"}]}}'
    local ps='{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","metadata":{"name":"NAME"META},"spec":{"replicas":2,'"$tmpl"'}}'
    body() { local b=${ps//NAME/$1}; b=${b//APP/$1}; echo "${b//META/$2}"; }
    call POST /namespaces/default/podsets application/json "$(body plain '')"
    call POST /namespaces/default/podsets application/json \
        "$(body slow ',"annotations":{"demo.k8s.io/v1beta1-min-ready-seconds":"30","team":"a"}')"
    call PATCH '/namespaces/default/podsets/applied?fieldManager=gitops' application/apply-patch+yaml "$(body applied ',"labels":{"tier":"web"}')"
    call PATCH '/namespaces/default/podsets/applied?fieldManager=scaler' application/merge-patch+json '{"spec":{"replicas":4}}'
    call POST /namespaces/default/podsets application/json "$(body counted '')"
    call PATCH /namespaces/default/podsets/counted/status application/merge-patch+json \
        '{"status":{"replicas":2,"readyReplicas":1,"observedGeneration":1}}'
    call POST /namespaces/default/podsets application/json "$(body held ',"finalizers":["example.com/hold"]')"
    call DELETE /namespaces/default/podsets/held application/json ''
    call POST /namespaces/other/podsets application/json \
        '{"apiVersion":"demo.k8s.io/v1alpha1","kind":"PodSet","metadata":{"name":"bare","labels":{"app":"bare"}},"spec":{"replicas":0}}'
    call POST /namespaces/other/podsets application/json \
        "$(body odd ',"annotations":{"demo.k8s.io/v1beta1-min-ready-seconds":"soon"}')"
    curl -sfk "$base/podsets" | python3 -m json.tool --sort-keys >"$work/served.json"
}

rm -rf "$out"
mkdir -p "$out"

# sled: the data directory as the old build left it (its self-signed certificates left out).
start_old --data-dir "$work/sled"
write_objects
stop_old
mv "$work/served.json" "$out/served-sled.json"
rm -rf "$work/sled/certs"
tar -C "$work/sled" -czf "$out/sled.tar.gz" .

# etcd: every key the old build wrote, with its value, in the order etcd holds them.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_port=$(free_port)
peer_port=$(free_port)
"$assets/etcd" --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
    >"$work/etcd.log" 2>&1 &
pids+=("$!")
until curl -sf "http://127.0.0.1:$etcd_port/health" >/dev/null; do sleep 0.2; done
start_old --data-dir "$work/etcd-replica" --storage-backend etcd --etcd-servers "http://127.0.0.1:$etcd_port"
write_objects
stop_old
mv "$work/served.json" "$out/served-etcd.json"
curl -sf "http://127.0.0.1:$etcd_port/v3/kv/range" -d '{"key":"AA==","range_end":"AA==","sort_target":"MOD"}' |
    python3 -c '
import base64, json, sys
kvs = json.load(sys.stdin).get("kvs", [])
print(json.dumps([{"key": base64.b64decode(kv["key"]).decode(), "value": base64.b64decode(kv.get("value", "")).decode()}
                  for kv in kvs], indent=1))' >"$out/etcd.json"

"$old" --version >"$out/VERSION" 2>&1 || true
echo "$out: $(ls "$out" | tr '\n' ' ')"
