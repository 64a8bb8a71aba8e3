#!/usr/bin/env bash
# Make sure the loopback services the test suite talks to are installed and answering.
# Every machine here already runs them; a fresh Debian machine may not, so install what is
# missing from Debian's packages and start it. Idempotent; prints one line per service.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" = 0 ]; then $SUDO apt-get update -qq; APT_UPDATED=1; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
port_open() {  # host port
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}
wait_port() {  # name port
    for _ in $(seq 1 60); do
        if port_open 127.0.0.1 "$2"; then echo "services: $1 answers on 127.0.0.1:$2"; return 0; fi
        sleep 1
    done
    echo "services: $1 did not come up on 127.0.0.1:$2" >&2
    return 1
}

# PostgreSQL: the storage conformance suite runs on it (trust auth on loopback, database test).
if ! port_open 127.0.0.1 5432; then
    command -v pg_ctlcluster >/dev/null 2>&1 || apt_install postgresql
    hba=$(ls /etc/postgresql/*/main/pg_hba.conf | head -n1)
    if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
        $SUDO sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    fi
    ver=$(basename "$(dirname "$(dirname "$hba")")")
    $SUDO pg_ctlcluster "$ver" main start || $SUDO pg_ctlcluster "$ver" main restart
    wait_port postgresql 5432
    as_pg() { if [ "$(id -u)" = "0" ]; then runuser -u postgres -- "$@"; else sudo -u postgres "$@"; fi; }
    as_pg psql -tAc "SELECT 1 FROM pg_database WHERE datname='test'" | grep -q 1 || as_pg createdb test
else
    echo "services: postgresql answers on 127.0.0.1:5432"
fi

# NATS with JetStream: the online-training stream tests (coadapt.sparse.stream) use it.
if ! port_open 127.0.0.1 4222; then
    command -v nats-server >/dev/null 2>&1 || apt_install nats-server
    nats_dir="${TMPDIR:-/tmp}/coadapt-nats"
    mkdir -p "$nats_dir"
    setsid nohup nats-server -a 127.0.0.1 -p 4222 -js -sd "$nats_dir" \
        >"$nats_dir/nats-server.log" 2>&1 < /dev/null &
    wait_port nats 4222
else
    echo "services: nats answers on 127.0.0.1:4222"
fi

# Redis: the Redis Streams source of coadapt.sparse.stream. No persistence: tests only.
if ! port_open 127.0.0.1 6379; then
    command -v redis-server >/dev/null 2>&1 || apt_install redis-server
    # The Debian package may have started its own service on install; only start one if not.
    if ! port_open 127.0.0.1 6379; then
        redis-server --bind 127.0.0.1 --port 6379 --save "" --appendonly no --daemonize yes \
            --logfile "${TMPDIR:-/tmp}/coadapt-redis.log" >/dev/null
    fi
    wait_port redis 6379
else
    echo "services: redis answers on 127.0.0.1:6379"
fi
