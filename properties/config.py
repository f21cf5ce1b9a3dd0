"""What the property machines run against: the protocol, the client, where counterexamples go.

The pytest plugin fills `CURRENT` from the command line, with the catalogue the names resolve in (the model's own,
`runtime.registry.MODEL_CATALOGUE`, when none was handed down); tests and `properties.layer_rates` swap it with
`using()`.
Stores are shared for a whole session (a real client's factory starts Valkey servers) and closed by `close()`;
the machines clean up the keys they wrote and `discard()` the stores after a failure.
"""
from __future__ import annotations

import atexit
import contextlib
from pathlib import Path
from typing import Any, Iterator

import attrs

from checking.retention import DEFAULT_RETENTION
from model.calls import DEFAULT_OP_TIMEOUT
from runtime.registry import MODEL_CATALOGUE, Catalogue, Client, Protocol, resolve_client, resolve_protocol
from runtime.tier import NotShared, open_shared

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
    #: The latest (monotonic seconds) a failure may be minimised and measured to (`check`'s `finish_by`).
    finish_by: float = float("inf")
    #: Failures' traces collected in memory instead of written (`properties.reporting.write_found`), or None.
    found: list | None = None
    #: The user's options of the client's factory (`--client-option`), and the most ranks a machine may use.
    client_options: dict = attrs.field(factory=dict)
    max_ranks: int | None = None
    #: The serving engine under test (`--engine`: a `checking.serving.engine_search.EngineTarget`), or None.
    engine: Any = None
    #: `--nemesis`: the spec (None: every kind on servers shardcheck started) and `--recovery-seconds`.
    nemesis_spec: str | None = None
    recovery_seconds: float | None = None
    #: What `client` and the nemesis resolve in (`runtime.registry.Catalogue`, handed down to the plugin).
    catalogue: Catalogue = MODEL_CATALOGUE
    _protocol: Protocol | None = attrs.field(default=None, init=False)
    _client: Client | None = attrs.field(default=None, init=False)
    #: Whether the store layer runs two clients of the same servers when the client can share them.
    shared: bool = True
    #: The least age (seconds) a value nobody deleted is read back at (`checking.retention`; 0: not tested).
    retention: float = DEFAULT_RETENTION
    _stores: list | None = attrs.field(default=None, init=False)
    _shared: Any = attrs.field(default=None, init=False)
    shared_note: str = attrs.field(default="", init=False)

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
            self._client = resolve_client(self.client, self.catalogue.clients)
        return self._client

    def client_label(self) -> str:
        return self.resolved_client().name

    def in_memory(self) -> bool:
        """Whether the client is in memory (calls cannot block: no bounding, no thread hop)."""
        return self.resolved_client().in_memory

    def nemesis(self) -> Any:
        """The run's real faults (`checking.nemesis_strategy.NemesisPlan`), or None."""
        from checking.nemesis_strategy import plan_for
        return plan_for(self.resolved_client(), self.client_options, self.nemesis_spec,
                        recovery_seconds=self.recovery_seconds, nemesis=self.catalogue.nemesis)

    def factory_options(self) -> dict:
        """The options of a factory call: the user's, and the op timeout where the client takes it."""
        return {**self.resolved_client().accepted({"op_timeout": self.op_timeout}), **self.client_options}

    def rank_cap(self, n_ranks: int) -> int:
        """`n_ranks`, or fewer when the user keeps the machines within fewer servers (`--max-ranks`)."""
        return min(n_ranks, self.max_ranks or MAX_RANKS)

    def stores(self, n_ranks: int) -> list:
        """The first `n_ranks` of the session's stores (created on first use, validated)."""
        if self._stores is None:
            self._stores = self.resolved_client().stores(self.rank_cap(MAX_RANKS), **self.factory_options())
        if n_ranks > len(self._stores):
            raise ValueError(f"{n_ranks} ranks asked for, but the session has {len(self._stores)} stores "
                             "(--max-ranks); use rank_cap()")
        return self._stores[:n_ranks]

    def store_clients(self, n_ranks: int) -> tuple[list[list], Any]:
        """The store layer's clients: two clients of the same servers (`runtime.tier.open_shared`, the session's,
        made on first use) and their `SharedStores`; or, for a client that cannot share servers, the session's
        stores alone and None (`shared_note` says why)."""
        if not self.shared:
            return [self.stores(n_ranks)], None
        if self._shared is None and not self.shared_note:
            try:
                self._shared = open_shared(self.resolved_client(), self.rank_cap(MAX_RANKS), **self.factory_options())
            except NotShared as exc:
                self.shared_note = f"shared-tier checks did not run: {exc}"
        if self._shared is None:
            return [self.stores(n_ranks)], None
        if n_ranks > len(self._shared.clients[0]):
            raise ValueError(f"{n_ranks} ranks asked for, but the session has {len(self._shared.clients[0])} "
                             "stores (--max-ranks); use rank_cap()")
        return [stores[:n_ranks] for stores in self._shared.clients], self._shared

    def discard(self) -> None:
        """Close the session's stores (after a failure they may be unusable); the next use makes new ones."""
        stores, self._stores = self._stores, None
        shared, self._shared = self._shared, None
        for s in stores or ():
            with contextlib.suppress(Exception):
                s.close()
        if shared is not None:
            shared.close()

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
                                                              "write_traces", "minimise_seconds", "found", "client_options",
                                                              "max_ranks", "shared", "retention", "engine", "nemesis_spec",
                                                              "recovery_seconds", "finish_by", "catalogue")},
                           **changes})
    try:
        yield CURRENT
    finally:
        CURRENT.close()
        CURRENT = saved
