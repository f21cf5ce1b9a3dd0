"""With `--json`, stdout carries the JSON alone.

Dependencies write to stdout on their own: valkey-glide's Rust core logs its connection warnings there, Ray prints
its start-up lines, a C library may print anything, and child processes (rank processes, servers, Ray workers)
inherit it. So `json_stdout()` moves file descriptor 1 onto stderr for the whole command (everything a dependency
or child writes to stdout lands on stderr), and `print_json` writes the result to the original stdout, which only
it holds (the adapters also keep LMCache's and glide's own logging to errors).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Iterator, TextIO

__all__ = ["json_stdout", "print_json"]

_json_out: TextIO | None = None


@contextlib.contextmanager
def json_stdout(enabled: bool) -> Iterator[None]:
    """Within it (when `enabled`), fd 1 is stderr and only `print_json` reaches the real stdout. A `sys.stdout`
    that is not fd 1 (a caller's capture) keeps the JSON, and Python-level prints go to `sys.stderr` meanwhile."""
    global _json_out
    if not enabled or _json_out is not None:
        yield
        return
    stream = sys.stdout
    try:
        on_fd1 = stream.fileno() == 1
    except (AttributeError, OSError, ValueError):
        on_fd1 = False
    if not on_fd1:
        _json_out, sys.stdout = stream, sys.stderr
        try:
            yield
        finally:
            _json_out, sys.stdout = None, stream
        return
    stream.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    _json_out = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    try:
        yield
    finally:
        out, _json_out = _json_out, None
        with contextlib.suppress(OSError, ValueError):
            out.close()
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
        os.dup2(saved, 1)
        os.close(saved)


def print_json(data: Any) -> None:
    """The command's JSON result, on the real stdout (also outside `json_stdout`)."""
    out = _json_out or sys.stdout
    out.write(json.dumps(data, indent=2) + "\n")
    out.flush()
