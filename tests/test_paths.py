"""Every public read/lookup operation of shardcheck's own store adapters is declared in `paths`, and every
declared path is one the concurrent layer (and so `properties/test_concurrent_layer.py`) drives."""
from __future__ import annotations

import inspect

import pytest

from adapters import lmcache_native, lmcache_stores, mooncake_store, patched
from model.contract import declared_paths
from model.history import READ_PATHS
from properties import bad_stores

#: Public members that are not read/lookup operations: the contract's writes and close, key naming, diagnostics, the
#: nemesis's wait for a client's connections.
NOT_PATHS = {"put", "delete", "close", "lmcache_key", "key_string", "server_key", "server_keys", "servers",
             "await_connections"}
ADAPTERS = [lmcache_stores.BackendStore, lmcache_stores.ValkeyBackendStore, lmcache_native.NativeStore,
            patched.PatchedBackendStore, patched.PatchedValkeyStore, mooncake_store.MooncakeStore]


def public_operations(cls: type) -> set[str]:
    return {name for name, member in inspect.getmembers(cls)
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))}


def undeclared(cls: type) -> set[str]:
    """Public operations of `cls` that its `paths` does not declare."""
    return public_operations(cls) - NOT_PATHS - set(declared_paths(cls))


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.__name__)
def test_adapter_declares_every_public_read_path(cls):
    """No public read/lookup operation of an adapter is left out of its declared paths (so no property skips it)."""
    assert undeclared(cls) == set()


@pytest.mark.parametrize("cls", ADAPTERS + [bad_stores.JitterStore, bad_stores.LostWakeupStore],
                         ids=lambda c: c.__name__)
def test_every_declared_path_is_driven_by_the_concurrent_layer(cls):
    """Each declared path is one the driver calls and the register model answers, and the class offers it."""
    for path in declared_paths(cls):
        assert path in READ_PATHS, f"{cls.__name__} declares {path!r}, which the concurrent layer cannot drive"
        assert callable(getattr(cls, path, None)), f"{cls.__name__} declares {path!r} but has no such method"


def test_an_undeclared_operation_is_caught():
    """The check itself fails for an adapter that offers a read the declaration omits."""
    class Sneaky(lmcache_native.NativeStore):
        def scan_prefix(self, keys):
            return 0
    assert undeclared(Sneaky) == {"scan_prefix"}
