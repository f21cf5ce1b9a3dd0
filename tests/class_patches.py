"""Class attributes put back after a test that patches classes process-wide (engine demos, `--engine-patch` unfixes)."""
from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def classes_restored(*classes: type) -> Iterator[None]:
    """Every attribute of `classes` as it was before: added ones removed, changed ones set back."""
    saved = [(c, dict(c.__dict__)) for c in classes]
    try:
        yield
    finally:
        for cls, kept in saved:
            for name in set(cls.__dict__) - set(kept):
                delattr(cls, name)
            for name, value in kept.items():
                if cls.__dict__.get(name) is not value and name not in ("__dict__", "__weakref__"):
                    setattr(cls, name, value)
