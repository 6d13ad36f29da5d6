#!/usr/bin/env bash
# Installs the peers that benchmarks/rsio_throughput.py compares tidewire with, if missing:
#   - Debian's nats-server (apt-get; `apt-get update` only if the first install attempt fails),
#   - nats-py and rsocket-py (PyPI: nats-py, rsocket) into the project's .venv.
# Idempotent and quiet when everything is there. The benchmark runs it first; it starts and
# stops nats-server itself. Nothing here is needed by the test suite.
# Usage: benchmarks/peers.sh [path/to/venv/python]   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}

say() { echo "peers.sh: $*" >&2; }

if ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  [ "$(id -u)" -eq 0 ] && SUDO="" || SUDO="sudo"
  say "installing nats-server (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -q nats-server >/dev/null 2>&1; then
    say "apt-get install failed; running apt-get update first"
    $SUDO apt-get update -q >/dev/null
    $SUDO apt-get install -y -q nats-server >/dev/null
  fi
fi
# The Debian package registers a system service; the benchmark runs its own server on a free
# port, so a running service does not disturb it (and none runs where there is no systemd).

[ -x "$PY" ] || { say "no Python at $PY (run ./tw test first to create .venv)"; exit 1; }
if ! "$PY" -c 'import nats, rsocket' >/dev/null 2>&1; then
  say "installing nats-py and rsocket-py into $(dirname "$(dirname "$PY")")"
  "$PY" -m pip install --quiet --disable-pip-version-check nats-py rsocket
fi
