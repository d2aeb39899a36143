#!/usr/bin/env bash
# Makes a CA and a serving certificate for podset-apiserver in the given directory (default: certs/out):
#   ca.crt ca.key   the CA; its base64 goes into the APIService's caBundle (spec.caBundle)
#   tls.crt tls.key the serving certificate for podset-apiserver.<namespace>.svc
# Usage: certs/make-certs.sh [out-dir] [namespace]
set -euo pipefail
trap 'status=$?; echo "certs/make-certs.sh: ERROR: \`$BASH_COMMAND\` failed with exit status $status (line $LINENO)" >&2; cat openssl.log >&2 2>/dev/null || true' ERR
out="${1:-$(dirname "$0")/out}"
ns="${2:-podset-system}"
svc="podset-apiserver"
mkdir -p "$out"
cd "$out"
if [ ! -f ca.key ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=podset-apiserver-ca" \
    -keyout ca.key -out ca.crt 2>openssl.log
fi
cat > tls.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:${svc},DNS:${svc}.${ns},DNS:${svc}.${ns}.svc,DNS:${svc}.${ns}.svc.cluster.local
EXT
openssl req -newkey rsa:2048 -nodes -subj "/CN=${svc}.${ns}.svc" -keyout tls.key -out tls.csr 2>openssl.log
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 -extfile tls.ext -out tls.crt 2>openssl.log
rm -f tls.csr tls.ext ca.srl openssl.log
chmod 600 ca.key tls.key
echo "wrote $(pwd)/{ca.crt,ca.key,tls.crt,tls.key}" >&2
echo "caBundle: $(base64 -w0 ca.crt)"
