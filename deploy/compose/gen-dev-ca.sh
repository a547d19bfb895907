#!/bin/sh
# Makes a development CA and a certificate for the control planes, for
# docker-compose.tls.yml (and for trying TLS by hand). Not for production:
# the CA key stays on disk next to the certificates.
#
#   ./gen-dev-ca.sh [DIR]        # default DIR: ./tls
#
# DIR/ca.crt   the CA, which proxies (--controlplane-ca) and rolterctl (--tls-ca) trust
# DIR/ca.key   its key (keep it, or delete it once the certificates are made)
# DIR/tls.crt  the control planes' certificate, for controlplane-1, controlplane-2,
#              localhost and 127.0.0.1 (--tls-cert), valid 825 days
# DIR/tls.key  its key (--tls-key), readable by the containers' nonroot user
#
# Existing files are kept: delete DIR to make new ones.
set -eu
dir=${1:-"$(dirname "$0")/tls"}
mkdir -p "$dir"
cd "$dir"
if [ -e ca.crt ] || [ -e tls.crt ]; then
	echo "gen-dev-ca: $dir already holds certificates; delete it to make new ones" >&2
	exit 1
fi
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
	-subj "/CN=rolter dev CA" -keyout ca.key -out ca.crt \
	-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
	-subj "/CN=rolter-controlplane" -keyout tls.key -out tls.csr 2>/dev/null
cat > tls.ext <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=DNS:controlplane-1,DNS:controlplane-2,DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
	-extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext ca.srl
# The distroless images run as nonroot (65532): the key must be readable.
chmod 644 ca.crt tls.crt tls.key
echo "gen-dev-ca: wrote $(pwd)/ca.crt, tls.crt and tls.key"
