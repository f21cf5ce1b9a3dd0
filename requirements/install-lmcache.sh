#!/usr/bin/env bash
# Install lmcache==0.5.6 and its CPU runtime dependencies into the venv given as $1, with the venv's uv
# (requirements/bootstrap.txt).
#
#   bash requirements/install-lmcache.sh .venv
#
# Order matters: the CPU torch wheel (torch==2.13.0+cpu, from pip's configured find-links: this machine
# keeps it on disk) is installed FIRST and explicitly, then lmcache and the pinned list in
# requirements/lmcache.txt with --no-deps, so the installer can never resolve lmcache's "torch"
# requirement to a CUDA build or upgrade torch. A torch constraint guards both steps. Idempotent: when
# every pin is already satisfied it checks and exits in about a second.
set -euo pipefail

VENV="${1:?usage: install-lmcache.sh VENV}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/lmcache.txt"
PY="$VENV/bin/python"
TORCH_PIN="torch==2.13.0"
TORCH_CPU="torch==2.13.0+cpu"

[ -x "$PY" ] || { echo "install-lmcache.sh: no python at $PY (create the venv first)" >&2; exit 2; }

UV="$VENV/bin/uv"
[ -x "$UV" ] || { echo "install-lmcache.sh: no uv at $UV (pip install -r requirements/bootstrap.txt first)" >&2; exit 2; }
# pip's find-links (environment or config files) are where the CPU torch wheel lies; uv does not read pip's config.
FIND_LINKS=()
while read -r dir; do FIND_LINKS+=(--find-links "$dir"); done < <(
  "$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sed '/^$/d')
PIP=("$UV" pip install --quiet --compile-bytecode --python "$PY" "${FIND_LINKS[@]}")
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

# 1. CPU torch, explicitly and first (its +cpu wheel is not on PyPI: it must lie in pip's find-links).
if ! "${PIP[@]}" -c "$CONSTRAINTS" "$TORCH_CPU"; then
  echo "install-lmcache.sh: no $TORCH_CPU wheel in pip's find-links (${FIND_LINKS[*]:-none configured})" >&2
  exit 1
fi
if ! "$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.version.cuda is None else 1)' 2>/dev/null; then
  echo "install-lmcache.sh: torch does not import as a CPU build (a CUDA build?); refusing to continue" >&2
  exit 1
fi

# 2. lmcache + its pinned runtime deps, without dependency resolution (cannot touch torch).
"${PIP[@]}" --no-deps -c "$CONSTRAINTS" -r "$REQS"

# 3. Check: the client classes the adapters use import on CPU.
if ! out="$(verify 2>&1)"; then
  echo "$out" >&2
  echo "install-lmcache.sh: lmcache does not import in $VENV" >&2
  exit 1
fi
echo "$out" | tail -n 1
