"""Resolving `--protocol` and `--client` specs: short names, or `MOD:ATTR` of a class, instance or factory.

The one name table of shardcheck: the pytest plugin and the command line both use it.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from model.contract import PROTOCOL_METHODS, missing_members

PROTOCOLS = {
    "paper": "model.protocols:PaperProtocol",
    "paper-async": "model.protocols:PaperProtocolAsync",
    "rank0-single-writer": "model.protocols:Rank0SingleWriter",
}
CLIENTS = {
    "model": "model.store:memory_factory",
    "lmcache": "adapters.lmcache_stores:resp_factory",
    "lmcache-native": "adapters.lmcache_stores:native_factory",
    "lmcache-valkey": "adapters.lmcache_stores:valkey_factory",
    "lmcache-patched": "adapters.patched:patched_factory",
}
DEFAULT_PROTOCOL = "paper"
DEFAULT_CLIENT = "model"


class SpecError(Exception):
    """A `--protocol`/`--client` value that cannot be used; the message says which and why."""


def load_attr(spec: str, what: str) -> Any:
    """Import `MOD:ATTR` (ATTR may be dotted)."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise SpecError(f"{what} {spec!r}: expected a known name or MOD:ATTR (e.g. mypkg.protocols:MyProtocol)")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:  # any import-time failure of user code is a usage error
        raise SpecError(f"{what} {spec!r}: cannot import module {mod_name!r}: {type(exc).__name__}: {exc} "
                        "(is it on PYTHONPATH?)") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecError(f"{what} {spec!r}: module {mod_name!r} has no attribute {attr!r}") from None
    return obj


def resolve_protocol(spec: str | None) -> tuple[Any, str]:
    """The protocol object for `spec` and its canonical `MOD:ATTR` reference."""
    spec = spec or DEFAULT_PROTOCOL
    ref = PROTOCOLS.get(spec, spec)
    obj = load_attr(ref, "--protocol")
    if isinstance(obj, type):
        try:
            obj = obj()
        except Exception as exc:
            raise SpecError(f"--protocol {spec!r}: {ref} cannot be instantiated with no arguments: {exc}") from None
    missing = missing_members(obj, PROTOCOL_METHODS)
    if missing:
        raise SpecError(f"--protocol {spec!r}: {ref} is not a ShardingProtocol: it lacks {', '.join(missing)} "
                        "(see CONTRACT.md)")
    if not isinstance(getattr(obj, "name", None), str):
        raise SpecError(f"--protocol {spec!r}: {ref} has no string attribute 'name'")
    return obj, ref


def resolve_client(spec: str | None) -> tuple[Callable[..., list[Any]], str]:
    """The client factory for `spec` and its name (a known name, or the `MOD:ATTR` given)."""
    spec = spec or DEFAULT_CLIENT
    ref = CLIENTS.get(spec, spec)
    if spec not in CLIENTS and ":" not in spec:
        raise SpecError(f"--client {spec!r}: unknown client; known: {', '.join(CLIENTS)}, or MOD:ATTR of a factory")
    factory = load_attr(ref, "--client")
    if not callable(factory):
        raise SpecError(f"--client {spec!r}: {ref} is not callable; expected factory(n_ranks, **options)")
    return factory, spec
