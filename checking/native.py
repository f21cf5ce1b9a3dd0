"""The compiled hot paths: which modules are compiled, where the build lies, and the choice between it and the
pure Python source at import time. Never compiled itself.

`make venv` compiles the modules of `COMPILED` with mypyc from their own source (`tools/build_native.py`), into
`BUILD_DIR` (inside the venv: the build is for its interpreter), never next to the source: there an extension module
would shadow its `.py` for good. A package of `COMPILED` calls `select(__name__, __path__)` first in its `__init__`,
which puts the build's directory of the package ahead of the source on the package's `__path__`, so each of its
compiled modules is imported from the build, the rest from the source. The pure source runs instead when:
- `SHARDCHECK_PURE=1` is set (tests force the pure path this way, in a process of its own);
- there is no build (it failed, or was never made): silently, `make venv` said so when it failed;
- a compiled module's source changed since the build (its SHA-256 is not the one the build recorded): with a
  one-line notice on stderr, once per package, as stale code must never run silently (`make venv` rebuilds).
`status()` says, per package, whether its compiled modules are the ones running (`shardcheck bench --json`)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from typing import Any, MutableSequence

__all__ = ["COMPILED", "BUILD_DIR", "MANIFEST", "SHARED_LIB", "ENV_PURE", "select", "status", "pure_requested",
           "source_digest"]

#: Per package, the modules compiled (every one of a package, or none, is chosen).
COMPILED: dict[str, tuple[str, ...]] = {
    "checking.linearizability": ("checker", "midpoints", "greedy", "register", "sweep", "zones", "wing_gong"),
    "checking.explore": ("expand", "halves", "slow"),
}
#: Where the build lies: the venv's own directory (`sys.prefix`), as the build is for its interpreter.
BUILD_DIR = os.environ.get("SHARDCHECK_NATIVE_DIR") or os.path.join(sys.prefix, "shardcheck-native")
#: The build's record: {"modules": {module: sha256 of its source}, "shared_lib": file name}.
MANIFEST = "manifest.json"
#: The module name of the one shared library mypyc builds for every compiled module (the group's).
SHARED_LIB = "shardcheck_native__mypyc"
#: Set to 1 (or anything but 0 or empty): the pure Python source runs, whatever is built.
ENV_PURE = "SHARDCHECK_PURE"

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_chosen: dict[str, str] = {}  # package -> "compiled" | why the source runs


def pure_requested() -> bool:
    return os.environ.get(ENV_PURE, "") not in ("", "0")


def source_digest(module: str) -> str:
    """The SHA-256 of a module's source file (module: dotted name, a file under the repository's root)."""
    with open(os.path.join(_ROOT, *module.split(".")) + ".py", "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _manifest() -> dict[str, Any] | None:
    try:
        with open(os.path.join(BUILD_DIR, MANIFEST)) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) and isinstance(got.get("modules"), dict) else None


def _load_shared_lib(manifest: dict[str, Any]) -> None:
    """The group's shared library, loaded once under its module name (each compiled module's shim imports it)."""
    if SHARED_LIB in sys.modules:
        return
    path = os.path.join(BUILD_DIR, str(manifest.get("shared_lib", "")))
    spec = importlib.util.spec_from_file_location(SHARED_LIB, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no shared library at {path}")
    lib = importlib.util.module_from_spec(spec)
    sys.modules[SHARED_LIB] = lib
    try:
        spec.loader.exec_module(lib)
    except BaseException:
        del sys.modules[SHARED_LIB]
        raise


def _why_not(package: str) -> tuple[str, bool]:
    """(why the source runs, whether to say so), or ("", False) when the build can run."""
    if pure_requested():
        return f"{ENV_PURE} is set", False
    manifest = _manifest()
    if manifest is None:
        return f"no build in {BUILD_DIR}", False
    for name in COMPILED[package]:
        module = f"{package}.{name}"
        want = manifest["modules"].get(module)
        if want is None:
            return f"{module} is not in the build", True
        if want != source_digest(module):
            return f"{module}'s source changed since the build (`make venv` rebuilds)", True
    try:
        _load_shared_lib(manifest)
    except Exception as exc:  # noqa: BLE001 -- any failure to load means the source runs
        return f"the build does not load ({type(exc).__name__}: {exc})", True
    return "", False


def select(package: str, path: MutableSequence[str]) -> bool:
    """Put the build of `package` (a key of `COMPILED`) ahead of its source on its `__path__` when it can run;
    whether it does."""
    why, say = _why_not(package)
    if why:
        _chosen[package] = why
        if say:
            print(f"shardcheck: {package} runs as pure Python: {why}", file=sys.stderr)
        return False
    path.insert(0, os.path.join(BUILD_DIR, *package.split(".")))
    _chosen[package] = "compiled"
    return True


def status() -> dict[str, dict[str, Any]]:
    """Per package of `COMPILED` imported so far: whether its compiled modules are the ones running (each imported
    here if it was not yet), and if not why."""
    out = {}
    for package, names in COMPILED.items():
        if package not in sys.modules:
            continue
        files = [getattr(importlib.import_module(f"{package}.{n}"), "__file__", None) or "" for n in names]
        compiled = all(f.startswith(BUILD_DIR) and not f.endswith(".py") for f in files)
        out[package] = {"compiled": compiled, **({} if compiled else {"why": _chosen.get(package, "not chosen")})}
    return out
