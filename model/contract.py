"""The public plug-in contract: `ShardingProtocol` and `RankStore` (see CONTRACT.md)."""
from __future__ import annotations

import concurrent.futures
import typing
from typing import Any, Callable, Generator, Mapping, Sequence

import attrs

from model.effects import Effect
from model.timing import over_text

__all__ = ["ShardingProtocol", "RankStore", "PROTOCOL_METHODS", "STORE_METHODS",
           "StoreCallTimeout", "missing_members", "declared_paths", "DEFAULT_PATHS", "EngineRequest", "EngineRetrieve",
           "EngineDeployment", "DEPLOYMENT_METHODS", "StackRequest", "StackResult", "ServingStack", "STACK_METHODS"]


@typing.runtime_checkable
class ShardingProtocol(typing.Protocol):
    """A sharding protocol: ownership, keys, and the per-rank store, lookup and load programs."""

    name: str

    def owner(self, chunk: int, n_ranks: int) -> int: ...

    def key(self, chunk: int, chunk_hash: str, rank: int, n_ranks: int) -> str: ...

    def rank_store(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                   kv: Sequence[bytes]) -> Generator[Effect, Any, None]: ...

    def rank_lookup(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                    contains: Callable[[str], bool]) -> int: ...

    def combine(self, reports: Sequence[int], n_chunks: int) -> int: ...

    def rank_load(self, rank: int, n_ranks: int, chunk_hashes: Sequence[str],
                  planned: int) -> Generator[Effect, Any, Mapping[int, bytes]]: ...


@typing.runtime_checkable
class RankStore(typing.Protocol):
    """One rank's remote store client.

    Optional members shardcheck uses when present: `paths` (CONTRACT.md: every public read/lookup operation,
    sync, async and batch, e.g. `("get", "get_async", "get_batch", "contains_batch")`; every store layer
    drives each, see `declared_paths`), `thread_safe` (False: reported, not driven concurrently; default True),
    `retention` (seconds the client keeps a value nobody deleted), `get_batch(keys)`, and `max_value_bytes`
    (the largest value the client stores; the properties keep values within it).
    """

    def put(self, key: str, value: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def contains(self, key: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def get_async(self, key: str) -> concurrent.futures.Future: ...

    def close(self) -> None: ...


PROTOCOL_METHODS = ("owner", "key", "rank_store", "rank_lookup", "combine", "rank_load")
STORE_METHODS = ("put", "get", "contains", "delete", "get_async", "close")


class StoreCallTimeout(Exception):
    """A bounded store client call did not return within `seconds`: the outcome 'hang'."""

    def __init__(self, op: str, key: str, seconds: float, waited: float | None = None, taken: float = 0.0) -> None:
        within = over_text(seconds, waited, taken) if waited is not None else f"{seconds:g} s"
        super().__init__(f"store call {op}({key!r}) did not return within {within}")
        self.op = op
        self.key = key
        self.seconds = seconds
        self.waited = waited


#: The paths of a client that declares none: the contract's own reads.
DEFAULT_PATHS = ("get", "get_async", "contains")


def declared_paths(store: Any) -> tuple[str, ...]:
    """Every read/lookup path a store (or its class) declares in `paths` (CONTRACT.md), with `contains` (a
    contract method) always included; `DEFAULT_PATHS` when it declares none. `read_paths`, the older name,
    is still read from a user's client that has no `paths` (docs/CONTRACT.md says so); shardcheck's own
    clients declare `paths` only."""
    declared = getattr(store, "paths", None)
    if declared is None:
        declared = getattr(store, "read_paths", None)
    out = tuple(dict.fromkeys(declared or DEFAULT_PATHS))
    return out if "contains" in out else out + ("contains",)


def missing_members(obj: Any, names: Sequence[str]) -> list[str]:
    """The names of `names` that `obj` lacks or has as non-callables (except `name`)."""
    return [n for n in names if not callable(getattr(obj, n, None))]


# -- engines (CONTRACT.md, "Engines") ------------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class EngineRequest:
    """One request as the serving engine's integration sees it: its id (vLLM's request id, LMCache's lookup id),
    its token ids, and what else its KV depends on: the tenant, the LoRA adapter, an image (its hash) whose
    placeholder span is token positions 1..chunk_size-2."""

    id: str
    tokens: tuple[int, ...] = attrs.field(converter=tuple)
    tenant: str = ""
    adapter: str = ""
    image: str = ""


@attrs.frozen(kw_only=True)
class EngineRetrieve:
    """What one rank's retrieve produced: `retrieved` tokens (the engine's own mask), the bytes that landed in the
    request's KV buffer per full chunk (None: not retrieved), and the memory the engine handed over after freeing
    it (`{"chunk": c, "bytes": what was at its address}`)."""

    retrieved: int
    chunks: list = attrs.field(factory=list)
    freed: list = attrs.field(factory=list)


@typing.runtime_checkable
class EngineDeployment(typing.Protocol):
    """A real serving engine's lookup-and-load path: `deployments` deployments (one model each) of `n_ranks` ranks
    on one shared tier, one scheduler-side lookup client each. `d` indexes the deployment, `rank` the rank.

    The calls the engine offers its serving framework, called in vLLM's order by `checking.serving.engine_run` (every
    call bounded there): `lookup_cache(d, req) -> int | None` (-1: no result yet; None: in flight; else hit tokens),
    `lookup(d, req) -> int | None` (sync: hit tokens; async: None, the answer comes through `lookup_cache`),
    `clear_lookup_status(d, req)` (the request was scheduled), `store(d, rank, req, kv)` (the rank's KV of every full
    chunk after prefill; returns once stored), `retrieve(d, rank, req, n_tokens) -> EngineRetrieve`,
    `lookup_unpin(d, rank, req)`, `close()`. What the checks observe: `chunk_keys(d, rank, req)` (the engine's own key
    of each full chunk), `holdings(d, rank, keys) -> (local, remote)` (which of `keys` the rank holds in each tier, a
    list of bools each; `remote` None when its server cannot be reached), `pins(d, rank)` (lookup pins held), and
    optionally `facts() -> dict[str, int]` (counts the engine keeps of what it did that no observation shows, e.g. how
    often a fix's own path ran; recorded in the run's last event). Faults: `evict(d, rank, req, chunk, tier)` (tier
    `local`, `remote` or `both`), `fault(rank, action)` (the rank's server: `pause`, `resume`, `kill`, `restart`),
    `reachable(rank)`.
    Members: `n_ranks`, `deployments`, `chunk_size` (tokens), `chunk_bytes` (KV bytes of one chunk on one rank),
    `lookup_mode` (`sync` or `async`), `lookup_timeout` (seconds), `faults` (None when servers cannot be faulted).
    """

    n_ranks: int
    deployments: int
    chunk_size: int
    chunk_bytes: int
    lookup_mode: str
    lookup_timeout: float

    def lookup_cache(self, d: int, request: EngineRequest) -> int | None: ...

    def lookup(self, d: int, request: EngineRequest) -> int | None: ...

    def clear_lookup_status(self, d: int, request: EngineRequest) -> None: ...

    def store(self, d: int, rank: int, request: EngineRequest, kv: Sequence[bytes]) -> None: ...

    def retrieve(self, d: int, rank: int, request: EngineRequest, n_tokens: int) -> EngineRetrieve: ...

    def lookup_unpin(self, d: int, rank: int, request: EngineRequest) -> None: ...

    def chunk_keys(self, d: int, rank: int, request: EngineRequest) -> list[str]: ...

    def holdings(self, d: int, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]: ...

    def pins(self, d: int, rank: int) -> int: ...

    def evict(self, d: int, rank: int, request: EngineRequest, chunk: int, tier: str) -> None: ...

    def fault(self, rank: int, action: str) -> None: ...

    def reachable(self, rank: int) -> bool: ...

    def close(self) -> list[str]: ...


#: The methods of an `EngineDeployment` (what `factory(n_ranks, *, lookup, models, **options)` returns).
DEPLOYMENT_METHODS = ("lookup_cache", "lookup", "clear_lookup_status", "store", "retrieve", "lookup_unpin",
                      "chunk_keys", "holdings", "pins", "evict", "fault", "reachable", "close")


# -- serving stacks (CONTRACT.md, "Serving stacks") ----------------------------------------------------------------
@attrs.frozen(kw_only=True)
class StackRequest:
    """One request to a serving stack: its id, its prompt's token ids, its tenant (vLLM's `cache_salt`: another
    tenant's KV must never serve it), and how many tokens to generate (greedy)."""

    id: str
    tokens: tuple[int, ...] = attrs.field(converter=tuple)
    tenant: str = ""
    max_tokens: int = 4


@attrs.frozen(kw_only=True)
class StackResult:
    """What a serving stack observed of one request once it ended: `status` (`finished`, `aborted`), the greedy
    `output` tokens and, per output position, the log-probabilities of the chosen token and of the runner-up
    (`top2`: ties are told apart from wrong KV); `reported`, the tokens the KV connector last answered as held
    outside (its `get_num_new_matched_tokens` before the request was scheduled; None if it never answered a
    number); `external`, the tokens vLLM took from the connector; `preemptions`; `seconds` from submission to the
    end and `first_token_seconds` to the first output token."""

    id: str
    status: str
    output: tuple[int, ...] = attrs.field(converter=tuple, default=())
    top2: tuple[tuple[float, float], ...] = attrs.field(converter=lambda xs: tuple(tuple(x) for x in xs), default=())
    reported: int | None = None
    external: int = 0
    preemptions: int = 0
    seconds: float = 0.0
    first_token_seconds: float | None = None


@typing.runtime_checkable
class ServingStack(typing.Protocol):
    """A real serving stack (vLLM with a KV connector, SGLang HiCache...) over a tier of `n_ranks` ranks, each rank
    with its own server. Requests go in, the stack serves them in its own order, observations come out:

    `submit(request, reference=False)` queues a request (`reference`: served with no KV cache at all, the connector
    left out: recompute, the oracle of `output-equality`); `step()` runs one scheduler step and returns the results
    of the requests that ended in it; `abort(id)`; `pending()` (ids not ended). What the checks observe:
    `chunk_keys(rank, request)` (the stack's own key of each full chunk of `chunk_size` tokens on that rank),
    `holdings(rank, keys) -> (local, remote)` (which keys the rank holds in its local tier and on its server, a list
    of bools each; `remote` None when the server cannot be reached), `leaks()` (`{"pins": [per rank], "pinned":
    [request ids still pinned], "free_blocks": int, "total_blocks": int}`: the KV blocks free and the blocks requests
    can hold, vLLM's null block excluded, so the pool is whole when they are equal). Faults:
    `evict(rank, key, tier)` (`local`, `remote`), `fault(rank, action)` (`pause`, `resume`, `kill`, `restart` of
    the rank's server), `reachable(rank)`. `reset()` empties every tier and the stack's own prefix cache (a fresh
    case on the same process: a stack start costs a minute); `close()` stops everything, returning what did not.
    Members: `n_ranks`, `chunk_size` (tokens of one stored chunk), `block_size` (tokens of one KV block),
    `connector` (the KV connector's name), `lookup_timeout` (seconds the stack gives a lookup before it recomputes);
    optional `recovery_seconds` (after a fault, how long the stack may still recompute what its tier holds, and
    still hold KV blocks for work the fault caught; default twice `lookup_timeout`), `store_lag` (seconds after a
    request ended within which its stores may still land; 1 s), `hit_granule` (tokens a reported hit is rounded down
    to, e.g. a page; 1), `vocab` (token ids drawn below it; 1024)."""

    n_ranks: int
    chunk_size: int
    block_size: int
    connector: str
    lookup_timeout: float

    def submit(self, request: StackRequest, *, reference: bool = False) -> None: ...

    def step(self) -> list[StackResult]: ...

    def abort(self, request_id: str) -> None: ...

    def pending(self) -> list[str]: ...

    def chunk_keys(self, rank: int, request: StackRequest) -> list[str]: ...

    def holdings(self, rank: int, keys: Sequence[str]) -> tuple[list[bool], list[bool] | None]: ...

    def leaks(self) -> dict: ...

    def evict(self, rank: int, key: str, tier: str) -> None: ...

    def fault(self, rank: int, action: str) -> None: ...

    def reachable(self, rank: int) -> bool: ...

    def reset(self) -> None: ...

    def close(self) -> list[str]: ...


#: The methods of a `ServingStack`.
STACK_METHODS = ("submit", "step", "abort", "pending", "chunk_keys", "holdings", "leaks", "evict", "fault",
                 "reachable", "reset", "close")
