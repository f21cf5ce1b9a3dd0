#!/usr/bin/env bash
# Install the Mooncake store client and master (requirements/mooncake.txt) into the venv given as $1, with the venv's
# uv (requirements/bootstrap.txt), after requirements/base.txt and requirements/lmcache.txt.
#
#   bash requirements/install-mooncake.sh .venv
#
# Optional: Mooncake is one of the systems checked, not a dependency of shardcheck. So this script never fails the
# set-up: when something is missing (the three Debian libraries and no root to apt-get them, no wheel) it says so in
# ONE line and exits 0; `--client mooncake` and `--engine vllm --connector mooncake` then answer that reason
# (adapters.mooncake_servers.unavailable) and their tests skip with it. Idempotent: with everything in place it
# checks and exits in about a second.
set -uo pipefail

VENV="${1:?usage: install-mooncake.sh VENV}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REQS="$HERE/mooncake.txt"
PY="$VENV/bin/python"
UV="$VENV/bin/uv"
LIBS=(libibverbs1 libnl-3-200 libnl-route-3-200)

skip() { echo "install-mooncake.sh: Mooncake skipped: $*"; exit 0; }

[ -x "$PY" ] || { echo "install-mooncake.sh: no python at $PY (create the venv first)" >&2; exit 2; }
[ -x "$UV" ] || { echo "install-mooncake.sh: no uv at $UV (pip install -r requirements/bootstrap.txt first)" >&2; exit 2; }

verify() {
  "$PY" - <<'PYEOF'
import os
import mooncake
from mooncake.store import MooncakeDistributedStore  # noqa: F401  (loads store.so: the Debian libraries)
master = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
assert os.access(master, os.X_OK), f"no mooncake_master binary at {master}"
print("install-mooncake.sh: mooncake-transfer-engine-non-cuda OK")
PYEOF
}

# 1. The Debian libraries the wheel's ELFs link (only when missing; only as root).
missing=()
for lib in "${LIBS[@]}"; do
  dpkg-query -W -f='${Status}' "$lib" 2>/dev/null | grep -q "install ok installed" || missing+=("$lib")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    skip "not root, cannot apt-get ${missing[*]} (run: sudo apt-get install -y ${missing[*]})"
  fi
  if ! (apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 || \
        { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null 2>&1; }); then
    skip "apt-get install ${missing[*]} failed"
  fi
fi

# 2. Fast path: every pin installed and the client loads.
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
        if have.get(norm(name)) != version:
            sys.exit(1)
PYEOF
then
  if verify >/dev/null 2>&1; then
    echo "install-mooncake.sh: mooncake-transfer-engine-non-cuda==0.3.13.post1 already installed in $VENV"
    exit 0
  fi
fi

# 3. The wheel, without dependency resolution, under every project pin (nothing of the project's moves).
FIND_LINKS=()
while read -r dir; do FIND_LINKS+=(--find-links "$dir"); done < <(
  "$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p" | tr ' ' '\n' | sed '/^$/d')
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
{ sed 's/#.*//;/^[[:space:]]*$/d' "$HERE/base.txt" "$HERE/lmcache.txt"; echo "torch==2.13.0"; } > "$CONSTRAINTS"
if ! "$UV" pip install --quiet --compile-bytecode --python "$PY" "${FIND_LINKS[@]}" --no-deps -c "$CONSTRAINTS" \
    -r "$REQS" 2>/dev/null; then
  skip "uv could not install requirements/mooncake.txt (no network or no wheel?)"
fi
if ! out="$(verify 2>&1)"; then
  skip "the Mooncake client does not load: $(echo "$out" | tail -n 1)"
fi
echo "$out" | tail -n 1
