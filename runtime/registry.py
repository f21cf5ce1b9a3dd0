"""The lookups of protocols and store clients: a name (or `MOD:ATTR`) -> the object, plus what it can do.

The tables of names are not all here: each lives in the lowest layer that may import everything it names, and is
handed down to the lookups (`tests/test_architecture.py` checks that no string names a module above its own).
Here are the model's: `PROTOCOLS`, `MEMORY_CLIENTS` (the in-memory client alone), `CHECK_SCHEDULE` (names only).
The real clients and serving engines are `adapters.catalogue`'s (`CLIENTS`, `SERVING_ENGINES`, the nemesis);
`check`'s strategies and the demos' modules are the command line's (`shardcheck.tables`), which assembles them
and passes them down (the pytest plugin has them from `shardcheck.pytest_catalogue`).

- `resolve_protocol(spec) -> Protocol`: a short name of `PROTOCOLS` or `MOD:ATTR` naming a class (instantiated
  with no arguments), an instance, or a zero-argument factory of one; validated against the contract.
- `resolve_client(spec, clients) -> Client`: a name of the `ClientTable` `clients` or `MOD:ATTR` naming a factory
  `factory(n_ranks, **options) -> list[RankStore]` (or a `RankStore` class, one instance per rank).
  `Client.stores(n_ranks, **options)` calls the factory and validates what it returns (count and methods).
- `resolve_strategy(name, strategies)`: a fresh instance of `check`'s strategy `name` of the table `strategies`.
- `demo_refs(prop, demos)`, `patch_refs(prop, demos)`: the `MOD:ATTR` of a catalog property's demos.
- `options_for_ranks(options, n_ranks, first=0)`: a factory call's `urls`, those of its own ranks (the one place).

A client's capabilities decide how the strategies drive it; nothing special-cases a client by name:
`in_memory` (a dict that cannot block: no thread hop, no bounding, fresh stores are free), `self_bounded` (every
call bounds itself with the `op_timeout` option), `thread_safe` (may be driven from several threads at once),
`options` (the factory options it accepts; None: any), `tier` (`MOD:ATTR` of what starts servers that several of
its clients share, `runtime.tier`; None: none known). A `MOD:ATTR` factory may declare them as attributes of the
factory; otherwise it is taken as a real client: not in memory, not self-bounded, thread-safe unless its stores
say `thread_safe = False`, with the servers of its table's `tier` (`adapters.catalogue.CLIENTS`: embedded Valkey
servers for the shared-tier checks).

- The serving engines (`--engine`) are resolved in `runtime.serving`.

Anything unusable raises `ResolveError` (a `ValueError`) whose message names the spec and what is wrong.
Modules are imported when a name is resolved, so a missing optional adapter only matters when it is used.
"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from typing import Any, Callable, Iterable, Mapping

import attrs

from model.contract import PROTOCOL_METHODS, STORE_METHODS, missing_members
from model.store import MEMORY_CLIENT

__all__ = ["Protocol", "Client", "ClientEntry", "ClientTable", "Catalogue", "ResolveError", "PROTOCOLS",
           "MEMORY_CLIENTS", "MODEL_CATALOGUE", "DEFAULT_PROTOCOL", "DEFAULT_CLIENT", "CHECK_SCHEDULE",
           "resolve_protocol", "resolve_client", "resolve_strategy", "parse_options", "corpus_clients",
           "real_clients", "by_verdict", "protocol_bug_expect", "demo_refs", "patch_refs", "load_attr", "ref_of",
           "MEMORY_TIER", "options_for_ranks"]

DEFAULT_PROTOCOL = "paper"
DEFAULT_CLIENT = MEMORY_CLIENT
#: What starts the in-memory servers several clients of `model` share (a real client's: `adapters.catalogue`).
MEMORY_TIER = "model.store:memory_tier"

#: Short protocol names accepted by `--protocol` (the reference protocols of `model.protocols`).
PROTOCOLS: dict[str, str] = {
    "paper": "model.protocols:PaperProtocol",
    "paper-async": "model.protocols:PaperProtocolAsync",
    "rank0-single-writer": "model.protocols:Rank0SingleWriter",
}


@attrs.frozen(kw_only=True)
class ClientEntry:
    """A named client: where its factory is and what it can do (see the module doc)."""

    ref: str
    about: str
    in_memory: bool = False
    self_bounded: bool = False
    thread_safe: bool = True
    options: tuple[str, ...] | None = None
    #: The curated corpus records an expectation on this client, and `verify` replays the corpus on it.
    corpus: bool = False
    #: What starts the servers several of its clients share (None: its table's `tier`, a real client's).
    tier: str | None = None
    #: What `check` of the reference protocol is expected to give on it ("violated": stock, "held": fixed; None:
    #: `verify` does not check it): `verify` asserts it, the findings are judged on the fixed one (`by_verdict`).
    expect: str | None = None


class ClientTable(dict):
    """The named clients (`--client NAME` -> its `ClientEntry`) that `resolve_client` looks names up in, and `tier`:
    the `MOD:ATTR` of what starts the servers of a client that names none (an entry without one, a `MOD:ATTR`
    factory without a `tier` attribute; None: no servers are known to share)."""

    def __init__(self, entries: Mapping[str, ClientEntry] | None = None, *, tier: str | None) -> None:
        super().__init__(entries or {})
        self.tier = tier


#: The in-memory client (`model.store`, the default client) alone: the one entry every client table has, and all
#: that resolves by name where no table was handed down (`MODEL_CATALOGUE`).
MEMORY_CLIENTS = ClientTable({
    MEMORY_CLIENT: ClientEntry(ref="model.store:memory_factory", about="in-memory stores with fault injection",
                               in_memory=True, options=("urls",), corpus=True, tier=MEMORY_TIER),
}, tier=None)


@attrs.frozen(kw_only=True)
class Catalogue:
    """What the names a user gives resolve in, assembled above `runtime/` and handed down to whoever resolves them
    (`adapters.catalogue.CATALOGUE`; the pytest plugin asks `shardcheck.pytest_catalogue` for it): the named clients,
    the named serving engines (name -> `runtime.serving.ServingEngineEntry`) and the nemesis
    (`nemesis(user_servers=...) -> control_for(stores, kind)`, `checking.nemesis_strategy.plan_for`; None: no real
    faults)."""

    clients: ClientTable
    engines: Mapping[str, Any] = attrs.field(factory=dict)
    nemesis: Callable[..., Any] | None = None


#: The model's own catalogue: the in-memory client alone, no serving engine, no nemesis (what resolves where no
#: catalogue was handed down: `python -m properties.layer_rates`, a pytest run without `shardcheck.pytest_catalogue`).
MODEL_CATALOGUE = Catalogue(clients=MEMORY_CLIENTS)


#: `check`'s schedule per kind of target (`checking.api.target_kind`): the strategies in order (names of the table
#: `checking.check.run_check` is handed, `shardcheck.tables.STRATEGIES`), each with its share of the budget
#: (None: runs to its end first, its time counted in the budget; "rest": until the budget ends).
CHECK_SCHEDULE: dict[str, tuple[tuple[str, float | str | None], ...]] = {
    "in-memory": (("scenarios", None), ("retention", None), ("enumerate", 0.4), ("explore", 0.25), ("hypothesis", 0.2), ("random", "rest")),
    "real": (("scenarios", None), ("retention", None), ("nemesis", 0.25), ("concurrency", 0.25), ("hypothesis", 0.15),
             ("enumerate", 0.3), ("random", "rest")),
    "deployment": (("engine-cases", 0.75), ("engine-machine", "rest")),
    "stack": (("stack-cases", "rest"),),
}


class ResolveError(ValueError):
    """A `--protocol`/`--client` value that cannot be used; the message names it and the problem."""


def options_for_ranks(options: dict, n_ranks: int, first: int = 0) -> dict:
    """`options` for one factory call (a client's or a serving engine's) of `n_ranks` ranks from rank `first` on:
    a `urls` list naming more servers is cut to the call's own, `urls[first:first + n_ranks]` (one per rank; a list
    too short for that is handed as given: one shared server, or the factory refuses). Every layer that calls a
    factory goes through here (`Client.stores`, `ServingEngine.deployment`, the preflight, the rank processes)."""
    urls = options.get("urls")
    if not isinstance(urls, (list, tuple)) or len(urls) < first + n_ranks:
        return options
    return {**options, "urls": list(urls[first:first + n_ranks])}


@attrs.frozen(kw_only=True)
class Protocol:
    """A resolved protocol: the object, its contract `name`, and the `MOD:ATTR` a trace records to rebuild it."""

    obj: Any
    name: str
    ref: str


@attrs.frozen(kw_only=True)
class Client:
    """A resolved client: the name a trace records, its factory and its capabilities."""

    name: str
    factory: Callable[..., list]
    in_memory: bool = False
    self_bounded: bool = False
    thread_safe: bool = True
    options: tuple[str, ...] | None = None
    #: What starts the servers several of its clients share (`runtime.tier`; None: none known).
    tier: str | None = None

    def accepted(self, options: dict) -> dict:
        """The subset of `options` this client's factory accepts."""
        if self.options is None:
            return dict(options)
        return {k: v for k, v in options.items() if k in self.options}

    def check_options(self, options: dict) -> None:
        """`ResolveError` naming an option of the user's that this client's factory does not take."""
        if self.options is None:
            return
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            takes = ", ".join(self.options) or "none"
            raise ResolveError(f"client {self.name!r}: unknown option {unknown[0]!r} (it takes: {takes})")

    def takes_urls(self) -> bool:
        """Whether the factory accepts `urls` (declared in `options`, or a parameter named `urls`): then it may be
        called several times with the same servers (CONTRACT.md), and the shared-tier checks run."""
        if self.options is not None:
            return "urls" in self.options
        try:
            params = inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            return False
        return "urls" in params and params["urls"].kind is not inspect.Parameter.POSITIONAL_ONLY

    def stores(self, n_ranks: int, **options: Any) -> list:
        """`n_ranks` fresh stores, validated: one per rank, each with every `RankStore` method (`ResolveError`
        otherwise; what was made is closed). Options the factory does not accept are dropped; `urls` are those of
        these ranks (`options_for_ranks`)."""
        try:
            made = list(self.factory(n_ranks, **self.accepted(options_for_ranks(options, n_ranks))))
        except ResolveError:
            raise
        except Exception as exc:  # noqa: BLE001 - a factory that cannot make stores is unusable input, never a crash
            raise ResolveError(f"client {self.name!r}: factory({n_ranks}) raised {type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:300]}") from None
        lacking = sorted({m for s in made for m in missing_members(s, STORE_METHODS)})
        if len(made) != n_ranks or lacking:
            for s in made:
                if callable(getattr(s, "close", None)):
                    try:
                        s.close()
                    except Exception:  # noqa: BLE001 - closing what a broken factory made is best effort
                        pass
            what = [f"returned {len(made)} stores for {n_ranks} ranks"] if len(made) != n_ranks else []
            if lacking:
                kinds = sorted({type(s).__name__ for s in made})
                what.append(f"{', '.join(kinds)} lacks the RankStore method(s) {', '.join(lacking)} (docs/CONTRACT.md)")
            raise ResolveError(f"client {self.name!r}: factory {'; '.join(what)}")
        return made


class PerRank:
    """The factory of a `RankStore` class: one instance per rank (picklable, so the client travels to rank processes)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.thread_safe = getattr(cls, "thread_safe", True)

    def __call__(self, n_ranks: int, **options: Any) -> list:
        return [self.cls(**options) for _ in range(n_ranks)]


def _importable_cwd() -> None:
    """`MOD:ATTR` names modules of the directory shardcheck runs from, as `python -m` would (README promise)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def load_attr(spec: str, what: str, known: Iterable[str] | None = None) -> Any:
    """The object `MOD:ATTR` names (`ATTR` may be dotted); a spec that is no `MOD:ATTR` is refused naming the names
    `known` instead (default: `PROTOCOLS` for a protocol)."""
    mod_name, sep, attr = spec.partition(":")
    if (not sep or not mod_name or not attr) and what == "engine patch":
        raise ResolveError(f"{what} {spec!r}: expected MOD:ATTR naming a function")
    if not sep or not mod_name or not attr:
        names = ", ".join(PROTOCOLS if known is None and what == "protocol" else known or ())
        raise ResolveError(f"{what} {spec!r}: expected " + (f"one of {names}, or MOD:ATTR" if names else "MOD:ATTR"))
    _importable_cwd()
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


def ref_of(obj: Any) -> str:
    """The `MOD:ATTR` of an object's class (or of a function), for traces of objects handed over directly."""
    target = obj if inspect.isclass(obj) or inspect.isfunction(obj) else type(obj)
    return f"{target.__module__}:{target.__qualname__}"


def resolve_protocol(spec: Any = None) -> Protocol:
    """The protocol `spec` names (default: the reference `PaperProtocol`); an object is taken as it is."""
    if isinstance(spec, Protocol):
        return spec
    if spec is not None and not isinstance(spec, str):
        obj, ref, shown = spec, ref_of(spec), repr(spec)
    else:
        shown = spec = spec or DEFAULT_PROTOCOL
        ref = PROTOCOLS.get(spec, spec)
        obj = load_attr(ref, "protocol")
    if inspect.isclass(obj) or (missing_members(obj, PROTOCOL_METHODS) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise ResolveError(f"protocol {shown!r}: calling {obj!r} with no arguments raised "
                               f"{type(exc).__name__}: {exc}") from None
    missing = missing_members(obj, PROTOCOL_METHODS)
    if missing:
        raise ResolveError(f"protocol {shown!r}: {type(obj).__name__} lacks the ShardingProtocol method(s) "
                           f"{', '.join(missing)}")
    if not isinstance(getattr(obj, "name", None), str):
        raise ResolveError(f"protocol {shown!r}: {type(obj).__name__} has no string attribute 'name' (docs/CONTRACT.md)")
    return Protocol(obj=obj, name=obj.name, ref=ref)


def resolve_client(spec: Any, clients: ClientTable) -> Client:
    """The client `spec` names in the table `clients` (None: `model`) or as `MOD:ATTR`; a factory object is taken as
    it is (the servers it shares: its `tier`, else the table's)."""
    if isinstance(spec, Client):
        return spec
    if spec is not None and not isinstance(spec, str):
        return _client(ref_of(spec), spec, None, clients)
    spec = spec or DEFAULT_CLIENT
    entry = clients.get(spec)
    if entry is not None:
        return _client(spec, load_attr(entry.ref, "client"), entry, clients)
    return _client(spec, load_attr(spec, "client", known=clients), None, clients)


def _client(name: str, obj: Any, entry: ClientEntry | None, clients: ClientTable) -> Client:
    if inspect.isclass(obj):
        if not missing_members(obj, STORE_METHODS):
            obj = PerRank(obj)
        else:
            try:
                obj = obj()
            except Exception as exc:
                raise ResolveError(f"client {name!r}: calling {obj!r} with no arguments raised "
                                   f"{type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise ResolveError(f"client {name!r}: {type(obj).__name__} is neither a store factory nor a RankStore class")
    if entry is not None:
        caps = attrs.asdict(entry, filter=lambda a, _: a.name not in ("ref", "about", "corpus", "expect"))
    else:
        caps = {k: getattr(obj, k) for k in ("in_memory", "self_bounded", "thread_safe", "options", "tier")
                if hasattr(obj, k)}
    if caps.get("tier") is None:
        caps["tier"] = clients.tier
    return Client(name=name, factory=obj, **caps)


def demo_refs(prop: Any, demos: Mapping[str, str]) -> tuple[str, ...]:
    """The `MOD:ATTR` of every demo of a catalog property (`model.checks.Property`), its layer's module found in
    `demos` (layer -> module: `shardcheck.tables.DEMO_MODULES`)."""
    return tuple(f"{demos[prop.layer]}:{name}" for name in prop.demos)


def patch_refs(prop: Any, demos: Mapping[str, str]) -> tuple[str, ...]:
    """The `MOD:ATTR` of every `--engine-patch` demo of a stack's own agreement a catalog property has
    (`model.checks.Property.patches`), in the module `demos["stack-patch"]` names."""
    return tuple(f"{demos['stack-patch']}:{name}" for name in getattr(prop, "patches", ()))


def corpus_clients(clients: Mapping[str, ClientEntry], *, real: bool | None = None) -> tuple[str, ...]:
    """The clients of `clients` the curated corpus records expectations on (`real=True`: only those not in memory)."""
    return tuple(name for name, e in clients.items() if e.corpus and (real is None or real != e.in_memory))


def real_clients(clients: Mapping[str, ClientEntry]) -> tuple[str, ...]:
    """Every client of `clients` that is not in memory (the real ones findings are measured on)."""
    return tuple(name for name, e in clients.items() if not e.in_memory)


def by_verdict(entries: Mapping[str, Any], verdict: str) -> tuple[str, ...]:
    """The names in `entries` (a client table or the serving engines) whose `expect` is `verdict` ("violated",
    "held")."""
    return tuple(name for name, e in entries.items() if e.expect == verdict)


def protocol_bug_expect(clients: Mapping[str, ClientEntry]) -> dict[str, str]:
    """A protocol bug's expectation on every corpus client of `clients`: it reproduces on the in-memory model whatever
    the client; on a real client the expectation is measured (`shardcheck regen` replays there) and replaces this
    one."""
    return {name: "reproduces" for name in corpus_clients(clients)}


def parse_options(items: list[str], flag: str = "--client-option") -> dict:
    """`KEY=VALUE` items (`--client-option`, `--engine-option`) as factory options: JSON values as JSON, `urls` split
    on commas, other text as text; `ResolveError` naming a bad item (and the `flag` it came with)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ResolveError(f"{flag} {item!r}: expected KEY=VALUE")
        if key in out:
            raise ResolveError(f"{flag} {key}: given twice")
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        if key == "urls" and isinstance(parsed, str):
            parsed = [u.strip() for u in parsed.split(",") if u.strip()]
        if key == "urls" and (not isinstance(parsed, list) or not parsed or not all(isinstance(u, str) for u in parsed)):
            raise ResolveError(f"{flag} urls={value!r}: expected a comma-separated list of URLs")
        out[key] = parsed
    return out


def resolve_strategy(name: str, strategies: Mapping[str, str]) -> Any:
    """A fresh instance of `check`'s strategy `name`, whose `MOD:ATTR` the table `strategies` gives
    (`shardcheck.tables.STRATEGIES`)."""
    try:
        ref = strategies[name]
    except KeyError:
        raise ResolveError(f"strategy {name!r}: expected one of {', '.join(strategies)}") from None
    return load_attr(ref, "engine")()
