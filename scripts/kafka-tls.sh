#!/usr/bin/env bash
# Test certificates for the broker's SASL_SSL listener (scripts/kafka.sh):
#
#   kafka-tls.sh DIR
#
# writes, with openssl only (no keytool):
#   DIR/ca.pem        a throw-away CA clients trust (ssl.ca.location)
#   DIR/broker.pem    the broker's PEM keystore: its PKCS#8 key, then its
#                     certificate (SAN IP:127.0.0.1, DNS:localhost) and the CA
#   DIR/other-ca.pem  a second CA that signed nothing here: a client trusting
#                     only it must fail the handshake (the untrusted-CA test)
# Keys are unencrypted and valid for 7 days: this is for loopback tests only.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: kafka-tls.sh DIR" >&2; exit 2; }
mkdir -p "$1"; dir=$(cd "$1" && pwd)
cd "$dir"
q() { "$@" >/dev/null 2>&1 || { echo "kafka-tls.sh: $* failed" >&2; "$@" >&2; exit 1; }; }
q openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=moeq-test-ca" -keyout ca.key -out ca.pem
q openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=moeq-untrusted-ca" -keyout other-ca.key -out other-ca.pem
q openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout broker.key -out broker.csr
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >broker.ext
q openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 7 -extfile broker.ext -out broker.crt
q openssl pkcs8 -topk8 -nocrypt -in broker.key -out broker.pk8
cat broker.pk8 broker.crt ca.pem >broker.pem
rm -f broker.csr broker.ext broker.key broker.pk8 other-ca.key ca.srl
chmod 600 ca.key broker.pem
