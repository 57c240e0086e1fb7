#!/usr/bin/env bash
# Redis for the shared rate-limit tests (geo_router/limits.py): Debian's
# redis-server, installed when missing and this user may install packages.
# Tests that need it skip, saying why, where it is absent.
set -euo pipefail
if command -v redis-server >/dev/null; then
    exit 0
fi
if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }
    # Debian's package may start a system daemon on 6379; the tests start their own.
    echo "redis-server: $(redis-server --version | cut -d' ' -f3)"
else
    echo "setup-redis.sh: redis-server missing and cannot install it here; the Redis tests will skip" >&2
fi
