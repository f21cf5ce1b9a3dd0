"""Where LMCache's ZMQ ipc socket files go, and their removal after every case.

LMCache names its lookup sockets `<base>/engine_<engine id>_service_<service>_lmcache_rpc_port_<n>`, with `<base>`
from vLLM's `VLLM_RPC_BASE_PATH` or, without vLLM, `/tmp/vllm_rpc`. shardcheck gives the lookup modules a
`<base>` of its own (a private temp dir, the knob vLLM's variable sets in production): `use_private_rpc_dir()`
passes it as LMCache's own `base_url` argument in the two modules that name lookup sockets. The files of one
deployment are removed by `remove_case_sockets(engine_id)`; the directory itself at exit.
"""
from __future__ import annotations

import atexit
import functools
import glob
import os
import shutil
import tempfile
import threading

__all__ = ["use_private_rpc_dir", "remove_case_sockets", "rpc_dir"]

_DIR: str | None = None
_LOCK = threading.Lock()


def rpc_dir() -> str:
    """This process's socket directory (created on first use, removed at exit)."""
    global _DIR
    with _LOCK:
        if _DIR is None or not os.path.isdir(_DIR):
            _DIR = tempfile.mkdtemp(prefix="shardcheck-zmq-")
            atexit.register(shutil.rmtree, _DIR, True)
        return _DIR


def use_private_rpc_dir() -> None:
    """Make LMCache's lookup client and servers put their socket files under `rpc_dir()` (idempotent)."""
    from lmcache.v1 import rpc_utils
    from lmcache.v1.lookup_client import factory, lmcache_async_lookup_client

    original = rpc_utils.get_zmq_rpc_path_lmcache
    for module in (factory, lmcache_async_lookup_client):
        if getattr(module.get_zmq_rpc_path_lmcache, "_shardcheck", False):
            continue

        @functools.wraps(original)
        def path(engine_id: str, service_name: str = "lookup", rpc_port: int = 0, rank: int = 0,
                 base_url: str | None = None) -> str:
            return original(engine_id, service_name, rpc_port, rank, base_url if base_url is not None else rpc_dir())

        path._shardcheck = True  # type: ignore[attr-defined]
        module.get_zmq_rpc_path_lmcache = path


def remove_case_sockets(engine_id: str) -> list[str]:
    """Remove the socket files of one engine id (any service, any rank); returns what was removed."""
    removed = []
    for base in {rpc_dir(), "/tmp/vllm_rpc"}:
        for path in glob.glob(os.path.join(base, f"engine_{glob.escape(engine_id)}_*")):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed
