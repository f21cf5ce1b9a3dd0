"""Turning `--protocol` and `--client` values into objects: the one table of names (the CLI imports it too).

- `resolve_protocol(spec)`: a short name of `model.protocols.REFERENCE_PROTOCOLS` (`paper`, `paper-async`,
  `rank0-single-writer`) or `MOD:ATTR` naming a class (instantiated with no arguments), an instance, or a
  zero-argument factory of one.
- `resolve_client(spec)`: a name of `CLIENTS` or `MOD:ATTR` naming a factory
  `factory(n_ranks, **options) -> list[RankStore]` (or a `RankStore` class, one instance per rank).

Anything unusable raises `ResolveError` (a `ValueError`) whose message names the spec and what is wrong.
Modules are imported lazily, when a name is resolved, so a missing optional adapter only matters when used.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from model.contract import PROTOCOL_METHODS, STORE_METHODS, missing_members

DEFAULT_PROTOCOL = "model.protocols:PaperProtocol"
DEFAULT_CLIENT = "model"

#: Short protocol names accepted by `--protocol` (the reference protocols of `model.protocols`).
PROTOCOLS: dict[str, str] = {
    "paper": "model.protocols:PaperProtocol",
    "paper-async": "model.protocols:PaperProtocolAsync",
    "rank0-single-writer": "model.protocols:Rank0SingleWriter",
}

#: Client names accepted by `--client`, each the `MOD:ATTR` of its factory.
CLIENTS: dict[str, str] = {
    "model": "model.store:memory_factory",
    "lmcache": "adapters.lmcache_stores:resp_factory",
    "lmcache-native": "adapters.lmcache_stores:native_factory",
    "lmcache-valkey": "adapters.lmcache_stores:valkey_factory",
    "lmcache-patched": "adapters.patched:patched_factory",
}


class ResolveError(ValueError):
    """A `--protocol`/`--client` value that cannot be used; the message names it and the problem."""


def load_attr(spec: str, what: str) -> Any:
    """The object `MOD:ATTR` names (`ATTR` may be dotted)."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        known = ", ".join(PROTOCOLS if what == "protocol" else CLIENTS)
        raise ResolveError(f"{what} {spec!r}: expected one of {known}, or MOD:ATTR")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ResolveError(f"{what} {spec!r}: cannot import module {mod_name!r} ({type(exc).__name__}: {exc})") from None
    except Exception as exc:  # importing user code may fail in any way; report it as unusable input
        raise ResolveError(f"{what} {spec!r}: importing module {mod_name!r} raised {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ResolveError(f"{what} {spec!r}: module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def resolve_protocol(spec: str | None = None) -> Any:
    """The protocol object `spec` names (default: the reference `PaperProtocol`)."""
    spec = spec or DEFAULT_PROTOCOL
    obj = load_attr(PROTOCOLS.get(spec, spec), "protocol")
    if inspect.isclass(obj) or (missing_members(obj, PROTOCOL_METHODS) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise ResolveError(f"protocol {spec!r}: calling {obj!r} with no arguments raised "
                               f"{type(exc).__name__}: {exc}") from None
    missing = missing_members(obj, PROTOCOL_METHODS)
    if missing:
        raise ResolveError(f"protocol {spec!r}: {type(obj).__name__} lacks the ShardingProtocol method(s) "
                           f"{', '.join(missing)}")
    if not isinstance(getattr(obj, "name", None), str):
        raise ResolveError(f"protocol {spec!r}: {type(obj).__name__} has no string attribute 'name' (CONTRACT.md)")
    return obj


def resolve_client(spec: str | None = None) -> Callable[..., list]:
    """The store factory `spec` names: `factory(n_ranks, **options) -> list[RankStore]`."""
    spec = spec or DEFAULT_CLIENT
    obj = load_attr(CLIENTS.get(spec, spec), "client")
    if inspect.isclass(obj):
        if not missing_members(obj, STORE_METHODS):
            cls = obj
            return lambda n_ranks, **options: [cls(**options) for _ in range(n_ranks)]
        try:
            obj = obj()
        except Exception as exc:
            raise ResolveError(f"client {spec!r}: calling {obj!r} with no arguments raised "
                               f"{type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise ResolveError(f"client {spec!r}: {type(obj).__name__} is neither a store factory nor a RankStore class")
    return obj


def client_name(spec: str | None) -> str:
    """The name a trace records for the client `spec`."""
    return spec or DEFAULT_CLIENT
