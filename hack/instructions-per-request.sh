#!/usr/bin/env bash
# Instructions the server executes per create and per get, counted by valgrind's callgrind: unlike a rate, the
# count does not move with the machine's load, so two builds compare on a busy 2-core box. One keep-alive HTTPS
# connection, --insecure-allow-all as in `cargo bench --bench apiserver`.
#
#   hack/instructions-per-request.sh target/release/podset-apiserver [other build ...]
#
# Needs valgrind (Debian `valgrind`) and python3. Prints, per build: instructions per create and per get.
set -Eeuo pipefail
trap 'status=$?; echo "instructions-per-request: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2' ERR
[ $# -ge 1 ] || { echo "usage: $0 BINARY [BINARY ...]" >&2; exit 2; }
command -v callgrind_control >/dev/null || { echo "instructions-per-request: ERROR: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
creates=${CREATES:-300} gets=${GETS:-2000} port=${PORT:-18443}

for bin in "$@"; do
  work=$(mktemp -d)
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$work/cg.out" \
    "$bin" --insecure-allow-all --bind-address 127.0.0.1 --secure-port "$port" --data-dir "$work/data" \
    >"$work/log" 2>&1 &
  pid=$!
  python3 - "$pid" "$port" "$creates" "$gets" <<'EOF'
import http.client, json, ssl, subprocess, sys, time
pid, port, creates, gets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
path = "/apis/demo.k8s.io/v1alpha1/namespaces/bench/podsets"
ctx = ssl._create_unverified_context()
deadline = time.time() + 300
while True:
    try:
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=120)
        c.request("GET", "/readyz"); r = c.getresponse(); r.read()
        if r.status == 200: break
    except OSError:
        pass
    if time.time() > deadline: sys.exit("server not ready")
    time.sleep(1)

def call(method, url, body=None):
    c.request(method, url, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse(); data = r.read()
    if r.status >= 300: sys.exit(f"{method} {url}: {r.status} {data[:200]!r}")

def body(name):
    return json.dumps({"apiVersion": "demo.k8s.io/v1alpha1", "kind": "PodSet",
        "metadata": {"name": name, "labels": {"app": "bench"}}, "spec": {"replicas": 1}})

def counted(what, n, f):
    call("GET", path + "?limit=1")  # warm the connection and the caches
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    for i in range(n): f(i)
    subprocess.run(["callgrind_control", "-d", what, pid], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)

counted("create", creates, lambda i: call("POST", path, body(f"c{i:05}")))
counted("get", gets, lambda i: call("GET", f"{path}/c{i % creates:05}"))
EOF
  kill "$pid"; wait "$pid" 2>/dev/null || true
  for what in create get; do
    n=$([ $what = create ] && echo "$creates" || echo "$gets")
    ir=$(grep -l "Trigger: dump $what" "$work"/cg.out.* | head -1 | xargs grep -h "^totals:" | head -1 | awk "{print \$2}")
    [ -n "$ir" ] || { echo "instructions-per-request: ERROR: no $what dump in $work" >&2; exit 1; }
    printf '%s\t%s\t%d instructions/request\n' "$bin" "$what" $((ir / n))
  done
  [ -n "${KEEP:-}" ] || rm -rf "$work"; [ -z "${KEEP:-}" ] || echo "kept $work" >&2
done
