#!/usr/bin/env bash
# Install lmcache==0.5.6 and its CPU runtime dependencies into the venv given as $1.
#
#   bash requirements/install-lmcache.sh .venv
#
# Order matters: the CPU torch==2.13.0 wheel is installed FIRST and explicitly (with its own
# small dependency set), then lmcache and the pinned list in requirements/lmcache.txt with
# --no-deps, so pip can never resolve lmcache's "torch" requirement to a CUDA build or upgrade
# torch. A torch constraint guards both steps. Idempotent: when every pin is already satisfied
# it checks and exits in about a second.
set -euo pipefail

VENV="${1:?usage: install-lmcache.sh VENV}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/lmcache.txt"
PY="$VENV/bin/python"
TORCH_PIN="torch==2.13.0"

[ -x "$PY" ] || { echo "install-lmcache.sh: no python at $PY (create the venv first)" >&2; exit 2; }

PIP=("$PY" -m pip --disable-pip-version-check --quiet)
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "$TORCH_PIN" > "$CONSTRAINTS"

verify() {
  "$PY" - <<'PYEOF'
import torch
assert torch.version.cuda is None, torch.__version__
import lmcache, lmcache.lmcache_redis  # noqa: F401  (native RESP client)
from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: F401
from lmcache.v1.storage_backend.connector.redis_connector import RESPConnector  # noqa: F401
from lmcache.v1.storage_backend.connector.valkey_connector import ValkeyConnector  # noqa: F401
from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient  # noqa: F401
import glide_sync  # noqa: F401
print(f"install-lmcache.sh: lmcache {lmcache.__version__} on torch {torch.__version__} OK")
PYEOF
}

# Fast path: everything pinned is already there and lmcache imports.
if "$PY" - "$REQS" "$TORCH_PIN" <<'PYEOF' 2>/dev/null
import sys
from importlib import metadata
from pathlib import Path

def norm(n):
    return n.lower().replace("_", "-").replace(".", "-")

pins = [l.split("#")[0].strip() for l in Path(sys.argv[1]).read_text().splitlines()]
pins = [p for p in pins if p] + [sys.argv[2]]
have = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
for p in pins:
    name, ver = p.split("==")
    got = have.get(norm(name))
    if got is None or got.split("+")[0] != ver:
        sys.exit(1)
if "+cpu" not in metadata.version("torch"):
    sys.exit(1)
PYEOF
then
  if verify >/dev/null 2>&1; then
    echo "install-lmcache.sh: lmcache==0.5.6 and its CPU dependencies already installed in $VENV"
    exit 0
  fi
fi

# 1. CPU torch, explicitly and first (a CPU wheel of it is available locally).
"${PIP[@]}" install -c "$CONSTRAINTS" "$TORCH_PIN"
if ! "$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)' 2>/dev/null; then
  echo "install-lmcache.sh: torch does not import as a CPU build (a CUDA build?); refusing to continue" >&2
  exit 1
fi

# 2. lmcache + its pinned runtime deps, without dependency resolution (cannot touch torch).
"${PIP[@]}" install --no-deps -c "$CONSTRAINTS" -r "$REQS"

# 3. Check: the client classes the adapters use import on CPU.
if ! out="$(verify 2>&1)"; then
  echo "$out" >&2
  echo "install-lmcache.sh: lmcache does not import in $VENV" >&2
  exit 1
fi
echo "$out" | tail -n 1
