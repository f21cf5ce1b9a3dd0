#!/usr/bin/env bash
# Install sglang==0.5.23 (its HiCache controller and storage backends, for `--engine sglang-hicache`) into the venv
# given as $1, next to LMCache and under every pin of the project:
#
#   bash requirements/install-sglang.sh .venv
#
# SGLang declares torch==2.14.1 and CUDA kernels; it is installed with --no-deps, with the pure-Python modules the
# adapter's imports need (requirements/sglang.txt, every one pinned, also --no-deps), under a torch==2.13.0
# constraint, so torch 2.13.0+cpu (installed first by install-lmcache.sh) is never touched. Then SGLang's native page
# hash (a C++ torch extension, g++ and libssl's headers) is built once into $VENV/shardcheck-cache/torch_extensions,
# where the rank processes find it (TORCH_EXTENSIONS_DIR). Idempotent: when every pin is there and the extension is
# built it checks and exits in about a second.
set -euo pipefail

VENV="${1:?usage: install-sglang.sh VENV}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
REQS="$HERE/sglang.txt"
PY="$VENV/bin/python"
UV="$VENV/bin/uv"
EXT_DIR="$VENV/shardcheck-cache/torch_extensions"
[ -x "$PY" ] || { echo "install-sglang.sh: no python at $PY (create the venv first)" >&2; exit 2; }
[ -x "$UV" ] || { echo "install-sglang.sh: no uv at $UV (pip install -r requirements/bootstrap.txt first)" >&2; exit 2; }

pins_ok() {
  "$PY" - "$REQS" <<'PYEOF' 2>/dev/null
import sys
from importlib import metadata
from pathlib import Path

def norm(n):
    return n.lower().replace("_", "-").replace(".", "-")

pins = [l.split("#")[0].strip() for l in Path(sys.argv[1]).read_text().splitlines()]
have = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
for p in filter(None, pins):
    name, ver = p.split("==")
    if have.get(norm(name)) != ver:
        sys.exit(1)
if "+cpu" not in metadata.version("torch"):
    sys.exit(1)
PYEOF
}

built() { ls "$EXT_DIR"/hicache_hash_cpp/hicache_hash_cpp*.so >/dev/null 2>&1; }

if pins_ok && built; then
  echo "install-sglang.sh: sglang==0.5.23 and its CPU dependencies already installed in $VENV"
  exit 0
fi
start=$SECONDS

# g++ and libssl's headers build SGLang's native page hash (Debian packages; installed here when missing and root).
if ! command -v g++ >/dev/null || [ ! -e /usr/include/openssl/sha.h ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ libssl-dev >/dev/null
  else
    echo "install-sglang.sh: SGLang's native page hash needs g++ and libssl-dev (apt-get install g++ libssl-dev)" >&2
    exit 1
  fi
fi

CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"
if ! pins_ok; then
  "$UV" pip install --quiet --compile-bytecode --python "$PY" --no-deps -c "$CONSTRAINTS" -r "$REQS"
fi

# Check that the modules the adapter drives import on CPU, and build the native page hash once.
mkdir -p "$EXT_DIR"
if ! out="$(cd "$ROOT" && PATH="$VENV/bin:$PATH" TORCH_EXTENSIONS_DIR="$EXT_DIR" "$PY" -W ignore - 2>&1 <<'PYEOF'
import torch
assert torch.version.cuda is None, torch.__version__
from adapters.sglang_hicache import sgl_stubs
sgl_stubs.install()
from sglang.srt.managers.cache_controller import HiCacheController  # noqa: F401
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController  # noqa: F401
from sglang.srt.mem_cache.hicache_storage import HiCacheFile  # noqa: F401
from sglang.srt.mem_cache.utils import get_storage_hash_str
assert len(get_storage_hash_str(list(range(8)), None, page_size=4)) == 2
import sglang.version
print(f"install-sglang.sh: sglang {sglang.version.__version__} on torch {torch.__version__} OK")
PYEOF
)"; then
  echo "$out" >&2
  echo "install-sglang.sh: sglang does not import or its native page hash does not build in $VENV" >&2
  exit 1
fi
echo "$out" | tail -n 1
echo "install-sglang.sh: done in $((SECONDS - start)) s"
