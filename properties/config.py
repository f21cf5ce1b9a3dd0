"""What the property machines run against: the protocol, the client, where counterexamples go.

The pytest plugin fills `CURRENT` from the command line; tests and `properties.bench` swap it with `using()`.
Stores are shared for a whole session (a real client's factory starts Valkey servers) and closed by `close()`;
the machines clean up the keys they wrote and `discard()` the stores after a failure.
"""
from __future__ import annotations

import atexit
import contextlib
from pathlib import Path
from typing import Any, Iterator

import attrs

from model.calls import DEFAULT_OP_TIMEOUT
from runtime.registry import Client, Protocol, resolve_client, resolve_protocol

__all__ = ["MAX_RANKS", "RunConfig", "CURRENT", "current", "using"]

#: The most ranks any machine uses; the session's stores are one list of this many.
MAX_RANKS = 4


@attrs.define
class RunConfig:
    """One run's choices; `protocol`/`client` are specs (`--protocol`, `--client`) or ready objects."""

    protocol: Any = None
    client: Any = None
    found_dir: Path = attrs.field(default=Path("counterexamples/found"), converter=Path)
    op_timeout: float = DEFAULT_OP_TIMEOUT
    write_traces: bool = True
    minimise_seconds: float = 30.0
    #: Failures' traces collected in memory instead of written (`properties.reporting.write_found`), or None.
    found: list | None = None
    _protocol: Protocol | None = attrs.field(default=None, init=False)
    _client: Client | None = attrs.field(default=None, init=False)
    _stores: list | None = attrs.field(default=None, init=False)

    def resolved_protocol(self) -> Protocol:
        if self._protocol is None:
            self._protocol = resolve_protocol(self.protocol)
        return self._protocol

    def protocol_object(self) -> Any:
        return self.resolved_protocol().obj

    def protocol_ref(self) -> str:
        """The `MOD:ATTR` that re-creates the protocol, for traces (as the CLI records it)."""
        return self.resolved_protocol().ref

    def resolved_client(self) -> Client:
        if self._client is None:
            self._client = resolve_client(self.client)
        return self._client

    def client_label(self) -> str:
        return self.resolved_client().name

    def in_memory(self) -> bool:
        """Whether the client is in memory (calls cannot block: no bounding, no thread hop)."""
        return self.resolved_client().in_memory

    def stores(self, n_ranks: int) -> list:
        """The first `n_ranks` of the session's stores (created on first use, validated)."""
        if self._stores is None:
            self._stores = self.resolved_client().stores(MAX_RANKS, op_timeout=self.op_timeout)
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
                                                              "write_traces", "minimise_seconds", "found")}, **changes})
    try:
        yield CURRENT
    finally:
        CURRENT.close()
        CURRENT = saved
