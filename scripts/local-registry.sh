#!/usr/bin/env bash
# Two real OCI registries on this machine (Debian's docker-registry: the CNCF distribution registry),
# for the registry tier (tests/registry) and for trying `stackgate build --push` by hand:
#   127.0.0.1:5050  no authentication
#   127.0.0.1:5051  htpasswd authentication (user stackgate, a random password in $STATE/auth/password)
# Docker treats 127.0.0.0/8 registries as insecure-allowed, so no TLS is needed on loopback. Needs
# Debian's docker-registry and apache2-utils (htpasswd).
#
#   scripts/local-registry.sh start   # (re)starts both; writes $STATE/registry.env for the tests
#   scripts/local-registry.sh stop
set -euo pipefail

STATE=${STACKGATE_REGISTRY_STATE:-/var/lib/stackgate-registry}
PLAIN=127.0.0.1:5050
AUTH=127.0.0.1:5051

stop() {
    for name in plain auth; do
        if [ -s "$STATE/$name.pid" ]; then
            kill "$(cat "$STATE/$name.pid")" 2>/dev/null || true
            rm -f "$STATE/$name.pid"
        fi
    done
}

config() {  # name addr [auth block]
    cat > "$STATE/$1.yml" <<CONF
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $STATE/$1-data}
  delete: {enabled: true}
http: {addr: "$2"}
$3
CONF
}

serve() {  # name addr
    mkdir -p "$STATE/$1-data"
    (docker-registry serve "$STATE/$1.yml" >"$STATE/$1.log" 2>&1 & echo $! >"$STATE/$1.pid")
    for _ in $(seq 1 50); do
        code=$(curl -s -o /dev/null -w '%{http_code}' "http://$2/v2/" || true)
        [[ $code == 200 || $code == 401 ]] && return 0
        sleep 0.2
    done
    echo "registry $1 on $2 did not answer; its log:" >&2
    cat "$STATE/$1.log" >&2
    return 1
}

start() {
    command -v docker-registry >/dev/null || { echo "apt-get install -y docker-registry apache2-utils" >&2; exit 1; }
    stop
    mkdir -p "$STATE/auth"
    [ -s "$STATE/auth/password" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$STATE/auth/password"
    chmod 600 "$STATE/auth/password"
    htpasswd -Bbn stackgate "$(cat "$STATE/auth/password")" > "$STATE/auth/htpasswd"
    config plain "$PLAIN" ""
    config auth "$AUTH" "auth: {htpasswd: {realm: stackgate-test, path: $STATE/auth/htpasswd}}"
    serve plain "$PLAIN"
    serve auth "$AUTH"
    cat > "$STATE/registry.env" <<ENV
STACKGATE_TEST_REGISTRY=$PLAIN
STACKGATE_TEST_AUTH_REGISTRY=$AUTH
STACKGATE_TEST_AUTH_USER=stackgate
STACKGATE_TEST_AUTH_PASSWORD_FILE=$STATE/auth/password
ENV
    echo "registries: $PLAIN (no auth), $AUTH (htpasswd, user stackgate); $STATE/registry.env"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
