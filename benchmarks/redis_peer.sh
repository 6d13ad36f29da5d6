#!/usr/bin/env bash
# Installs the peer that benchmarks/seguro_save.py compares tidewire with, if missing:
#   - Debian's redis-server (apt-get; `apt-get update` only if the first install attempt fails),
#   - redis-py (PyPI: redis) into the project's .venv.
# Idempotent and quiet when everything is there. The benchmark runs it first; it starts and
# stops its own redis-server. Nothing here is needed by the test suite.
# Usage: benchmarks/redis_peer.sh [path/to/venv/python]   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}

say() { echo "redis_peer.sh: $*" >&2; }

if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  [ "$(id -u)" -eq 0 ] && SUDO="" || SUDO="sudo"
  say "installing redis-server (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q redis-server >/dev/null 2>&1; then
    say "apt-get install failed; running apt-get update first"
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q redis-server >/dev/null
  fi
fi
# The Debian package registers a system service on port 6379 (started only where systemd runs);
# the benchmark runs its own server on a free port with its own configuration, so a running
# service does not disturb it.

[ -x "$PY" ] || { say "no Python at $PY (run ./tw test first to create .venv)"; exit 1; }
if ! "$PY" -c 'import redis' >/dev/null 2>&1; then
  say "installing redis-py into $(dirname "$(dirname "$PY")")"
  "$PY" -m pip install --quiet --disable-pip-version-check redis
fi
