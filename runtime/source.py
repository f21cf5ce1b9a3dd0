"""The source a subject runs: a digest of the files of the modules that define it (a client's factory, a protocol's
class, a serving engine's factory and its `--engine-patch` modules), recorded in a trace when it is saved
(`config.source`). A replay on the recorded subject compares it with the source there now: the same digest says the
subject is unchanged, so a race it does not show is the machine's doing, never a fix (`checking.replay.judge`).

It covers the defining modules only: a change to a module they import leaves the digest as it was (a replay then
answers `undecided` where `fixed` may have been true, never the other way round).
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Iterable

__all__ = ["source_digest", "module_file"]


def module_file(obj: Any) -> Path | None:
    """The source file of the module defining `obj` (a `MOD:ATTR` string: MOD's, found without importing it); None
    when there is none (a built-in, a module made at run time)."""
    try:
        if isinstance(obj, str):
            spec = importlib.util.find_spec(obj.split(":", 1)[0])
            origin = spec.origin if spec is not None else None
        else:
            module = inspect.getmodule(obj)
            origin = inspect.getsourcefile(module) if module is not None else None
    except (ImportError, TypeError, ValueError):
        return None
    return Path(origin) if origin and origin.endswith(".py") and Path(origin).is_file() else None


def source_digest(objs: Iterable[Any]) -> str | None:
    """A digest of the defining modules' files of `objs` (each file once); None when one of them has no file (the
    subject's source cannot be told: no claim is made on it)."""
    files = set()
    for obj in objs:
        path = module_file(obj)
        if path is None:
            return None
        files.add(path.resolve())
    if not files:
        return None
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
