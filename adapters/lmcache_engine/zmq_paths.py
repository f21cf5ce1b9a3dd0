"""LMCache's ZMQ environment in one shardcheck process: where its ipc socket files go (and their removal after
every case), and one ZMQ context per scheduler-side lookup client.

LMCache names its lookup sockets `<base>/engine_<engine id>_service_<service>_lmcache_rpc_port_<n>`, with `<base>`
from vLLM's `VLLM_RPC_BASE_PATH` or, without vLLM, `/tmp/vllm_rpc`. shardcheck gives the lookup modules a
`<base>` of its own (a private temp dir, the knob vLLM's variable sets in production): `use_private_rpc_dir()`
passes it as LMCache's own `base_url` argument in the two modules that name lookup sockets. The files of one
deployment are removed by `remove_case_sockets(engine_id)`; the directory itself at exit (`runtime.reaper`).

LMCache's lookup clients take the process's global ZMQ context (`zmq.Context.instance()`) and terminate it on
close: in production there is one scheduler per process. A case with two deployments runs two schedulers in one
process, where one client's close would terminate the other's context (and two closes at once abort the process
in `zmq_ctx_term`). `own_context()` gives the client built inside it a context of its own, as its own process
would have.
"""
from __future__ import annotations

import contextlib
import functools
import glob
import os
import tempfile
import threading

from runtime import reaper

__all__ = ["use_private_rpc_dir", "remove_case_sockets", "rpc_dir", "own_context", "DIR_ENV"]

_DIR: str | None = None
_LOCK = threading.Lock()
_CLIENT_CONTEXT = threading.local()


#: A rank process of `--runner processes` is handed its parent's directory here (the scheduler's client and the
#: rank's lookup server must name the same socket files).
DIR_ENV = "SHARDCHECK_LMCACHE_RPC_DIR"


def rpc_dir() -> str:
    """This process's socket directory (a rank process uses its parent's), made on first use by `runtime.reaper`,
    which removes it at exit (`reap()`, also run by a child that ends with `os._exit`). Once the exit began it is
    never made again: an LMCache close still running on a daemon thread names its sockets here after the exit began
    (then they cannot be made, and nothing is left behind)."""
    global _DIR
    with _LOCK:
        if reaper.REAPER.exiting() and _DIR is not None:
            return _DIR
        inherited = os.environ.get(DIR_ENV)
        if inherited and os.path.isdir(inherited):
            _DIR = inherited
        if _DIR is None or not os.path.isdir(_DIR):
            _check_short_enough(tempfile.gettempdir())
            _DIR = reaper.temp_dir("shardcheck-zmq-")
        return _DIR


#: The longest socket file name LMCache falls back to (`lmcache_rpc_<16 hex>`), and the temp dir's suffix.
_SHORTEST_NAME = len("/shardcheck-zmq-12345678/lmcache_rpc_") + 16


def _check_short_enough(base: str) -> None:
    """`ResolveError` (one line, exit 2) when even LMCache's shortened socket names under `base` exceed the
    `sockaddr_un` limit: LMCache itself would raise deep inside a deployment's build."""
    from lmcache.v1.rpc_utils import IPC_SOCKET_PATH_MAX_LEN

    from runtime.registry import ResolveError
    if len(os.fsencode(base)) + _SHORTEST_NAME > IPC_SOCKET_PATH_MAX_LEN:
        raise ResolveError(f"TMPDIR {base!r} is too long for LMCache's ZMQ socket files (at most "
                           f"{IPC_SOCKET_PATH_MAX_LEN - _SHORTEST_NAME} bytes): point TMPDIR at a shorter directory")


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
    from lmcache.v1.rpc import zmq_transport

    context_of = rpc_utils.get_zmq_context
    for module in (zmq_transport, lmcache_async_lookup_client):
        if getattr(module.get_zmq_context, "_shardcheck", False):
            continue

        @functools.wraps(context_of)
        def context(use_asyncio: bool = True) -> object:
            own = getattr(_CLIENT_CONTEXT, "ctx", None)
            return own if own is not None and not use_asyncio else context_of(use_asyncio)

        context._shardcheck = True  # type: ignore[attr-defined]
        module.get_zmq_context = context


@contextlib.contextmanager
def own_context():  # noqa: ANN201 - a context manager
    """A lookup client built inside takes a ZMQ context of its own (see the module docstring)."""
    import zmq

    _CLIENT_CONTEXT.ctx = zmq.Context()
    try:
        yield _CLIENT_CONTEXT.ctx
    finally:
        _CLIENT_CONTEXT.ctx = None


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
