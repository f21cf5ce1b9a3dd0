"""What the property machines run against: the protocol, the client, where counterexamples go.

The pytest plugin fills `CURRENT` from the command line; tests and `properties.bench` swap it with `using()`.
Stores are shared for a whole session (a real client's factory starts Valkey servers) and closed by `close()`;
the machines clean up the keys they wrote and `discard()` the stores after a failure.
"""
from __future__ import annotations

import atexit
import contextlib
from pathlib import Path
from typing import Any, Callable, Iterator

import attrs

from runtime.registry import DEFAULT_PROTOCOL, PROTOCOLS, client_name, resolve_client, resolve_protocol

#: The most ranks any machine uses; the session's stores are one list of this many.
MAX_RANKS = 4


@attrs.define
class RunConfig:
    """One run's choices; `protocol`/`client` are specs (`--protocol`, `--client`) or ready objects."""

    protocol: Any = None
    client: Any = None
    found_dir: Path = attrs.field(default=Path("counterexamples/found"), converter=Path)
    op_timeout: float = 2.0
    write_traces: bool = True
    minimise_seconds: float = 30.0
    _protocol_obj: Any = attrs.field(default=None, init=False)
    _factory: Callable[..., list] | None = attrs.field(default=None, init=False)
    _stores: list | None = attrs.field(default=None, init=False)

    def protocol_object(self) -> Any:
        if self._protocol_obj is None:
            is_spec = self.protocol is None or isinstance(self.protocol, str)
            self._protocol_obj = resolve_protocol(self.protocol) if is_spec else self.protocol
        return self._protocol_obj

    def protocol_ref(self) -> str:
        """The `MOD:ATTR` that re-creates the protocol, for traces (as the CLI records it)."""
        if self.protocol is None or isinstance(self.protocol, str):
            spec = self.protocol or DEFAULT_PROTOCOL
            return PROTOCOLS.get(spec, spec)
        cls = type(self.protocol)
        return f"{cls.__module__}:{cls.__qualname__}"

    def client_label(self) -> str:
        if self.client is None or isinstance(self.client, str):
            return client_name(self.client)
        return f"{getattr(self.client, '__module__', '?')}:{getattr(self.client, '__qualname__', repr(self.client))}"

    def factory(self) -> Callable[..., list]:
        if self._factory is None:
            self._factory = resolve_client(self.client) if self.client is None or isinstance(self.client, str) \
                else self.client
        return self._factory

    def stores(self, n_ranks: int) -> list:
        """The first `n_ranks` of the session's stores (created on first use)."""
        if self._stores is None:
            stores = list(self.factory()(MAX_RANKS))
            if len(stores) != MAX_RANKS:
                raise ValueError(f"client {self.client_label()}: factory({MAX_RANKS}) returned {len(stores)} stores")
            self._stores = stores
        return self._stores[:n_ranks]

    def discard(self) -> None:
        """Close the session's stores (after a failure they may be unusable); the next use makes new ones."""
        stores, self._stores = self._stores, None
        for s in stores or ():
            with contextlib.suppress(Exception):
                s.close()

    close = discard


CURRENT = RunConfig()
atexit.register(lambda: CURRENT.close())


def current() -> RunConfig:
    return CURRENT


@contextlib.contextmanager
def using(**changes: Any) -> Iterator[RunConfig]:
    """Run the machines with `changes` to the current config (fresh stores), restoring it afterwards."""
    global CURRENT
    saved = CURRENT
    CURRENT = RunConfig(**{**{f: getattr(saved, f) for f in ("protocol", "client", "found_dir", "op_timeout",
                                                              "write_traces", "minimise_seconds")}, **changes})
    try:
        yield CURRENT
    finally:
        CURRENT.close()
        CURRENT = saved
