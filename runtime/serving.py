"""Resolving a serving engine (`--engine`): a name of the table handed down (name -> `ServingEngineEntry`, the
named ones are `adapters.catalogue.SERVING_ENGINES`) or `MOD:ATTR` naming a factory.

A serving engine is driven through one of two seams (`ServingEngineEntry.seam`): `deployment` (a real engine's own
lookup-and-load path called call by call: `factory(n_ranks, *, lookup, models, **options) -> EngineDeployment`) or
`stack` (a whole serving stack served request by request: `factory(n_ranks, *, connector, **options) ->
ServingStack`; `model.contract`). `--engine-patch MOD:ATTR` functions are applied (`apply_engine_patches`) once per
process before the first deployment or stack is built. Anything unusable raises `runtime.registry.ResolveError`.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs

from model.contract import DEPLOYMENT_METHODS, missing_members
from runtime.registry import ResolveError, load_attr, options_for_ranks, ref_of

__all__ = ["ServingEngine", "ServingEngineEntry", "resolve_serving_engine", "apply_engine_patches"]


# -- serving engines (--engine) ------------------------------------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ServingEngineEntry:
    """A named serving engine (`--engine`): where its factory is and what it can do: `lookups` (the lookup modes it offers) and
    `options` (the factory options it accepts besides `lookup` and `models`; None: any)."""

    ref: str
    about: str
    lookups: tuple[str, ...] = ("sync", "async")
    options: tuple[str, ...] | None = None
    #: What `check --engine NAME` is expected to give: "violated" (stock: its findings are searched for on it) or
    #: "held" (fixed: the findings are judged on it, the engine demos patched into it), as `ClientEntry.expect`.
    expect: str = "violated"
    #: The seam it is driven through: "deployment" (`model.contract.EngineDeployment`, call by call) or "stack"
    #: (`model.contract.ServingStack`, request by request; its factory takes `connector`, one of `connectors` or a
    #: `MOD:ATTR`).
    seam: str = "deployment"
    connectors: tuple[str, ...] = ()
    #: A stack's expectation per connector where they differ (`expect` for the rest): verify checks each.
    connector_expect: dict[str, str] = attrs.field(factory=dict)

    def expected(self, connector: str | None = None) -> str:
        """What `check` is expected to give on `connector` (the first connector by default)."""
        name = connector or (self.connectors[0] if self.connectors else "")
        return self.connector_expect.get(name, self.expect)
    #: A stack's ranks when `--engine-option tp=N` does not say (two for a stack whose subject is an agreement
    #: across ranks: one rank has nobody to agree with).
    ranks: int = 1
    #: Whether the catalog's `--engine-patch` demos of a stack's own agreement (`model.checks.Property.patches`) are
    #: this stack's (verify checks each on it).
    patch_demos: bool = False


_APPLIED_PATCHES: list[str] = []


def apply_engine_patches(specs: Any) -> list[str]:
    """Call every `--engine-patch MOD:ATTR` function (no arguments) once in this process, in order; the specs
    applied so far. A spec that cannot be loaded or raises is a `ResolveError`."""
    for spec in specs or ():
        if spec in _APPLIED_PATCHES:
            continue
        fn = load_attr(spec, "engine patch")
        if not callable(fn):
            raise ResolveError(f"engine patch {spec!r}: {type(fn).__name__} is not a function")
        try:
            fn()
        except Exception as exc:
            raise ResolveError(f"engine patch {spec!r} raised {type(exc).__name__}: {exc}") from None
        _APPLIED_PATCHES.append(spec)
    return list(_APPLIED_PATCHES)


@attrs.frozen(kw_only=True)
class ServingEngine:
    """A resolved serving engine: the name a trace records, its factory, its capabilities and the patches applied first."""

    name: str
    factory: Callable[..., Any]
    lookups: tuple[str, ...] = ("sync", "async")
    options: tuple[str, ...] | None = None
    patches: tuple[str, ...] = ()
    seam: str = "deployment"
    connectors: tuple[str, ...] = ()
    ranks: int = 1

    def stack(self, n_ranks: int, *, connector: str, **options: Any) -> Any:
        """A serving stack of `n_ranks` ranks with `connector` (the patches applied first; `seam` "stack"; and handed
        to a factory that takes `patches`, for the processes it starts to apply them too)."""
        apply_engine_patches(self.patches)
        if self.patches and self.options is not None and "patches" in self.options:
            options = {**options, "patches": tuple(self.patches)}
        return self.factory(n_ranks, connector=connector, **options)

    def accepted(self, options: dict) -> dict:
        """The subset of `options` this engine's factory accepts."""
        if self.options is None:
            return dict(options)
        return {k: v for k, v in options.items() if k in self.options}

    def deployment(self, n_ranks: int, **options: Any) -> Any:
        """A fresh deployment (the patches applied first), validated against `model.contract.EngineDeployment`
        (`ResolveError` otherwise; what was made is closed); `urls` are those of these ranks (`options_for_ranks`)."""
        apply_engine_patches(self.patches)
        lookup, models = options.pop("lookup", "sync"), options.pop("models", ("m",))
        made = self.factory(n_ranks, lookup=lookup, models=tuple(models),
                            **self.accepted(options_for_ranks(options, n_ranks)))
        lacking = missing_members(made, DEPLOYMENT_METHODS)
        attrs_missing = [a for a in ("n_ranks", "deployments", "chunk_size", "chunk_bytes", "lookup_mode",
                                     "lookup_timeout") if not hasattr(made, a)]
        if lacking or attrs_missing:
            if callable(getattr(made, "close", None)):
                try:
                    made.close()
                except Exception:  # noqa: BLE001 - closing what a broken factory made is best effort
                    pass
            raise ResolveError(f"engine {self.name!r}: {type(made).__name__} lacks the EngineDeployment member(s) "
                               f"{', '.join(lacking + attrs_missing)} (CONTRACT.md, \"Engines\")")
        return made


def resolve_serving_engine(spec: Any, patches: Any = (),
                           engines: Mapping[str, ServingEngineEntry] | None = None) -> ServingEngine:
    """The engine `spec` names: a name of `engines` (the named serving engines, `adapters.catalogue.SERVING_ENGINES`;
    None: none) or `MOD:ATTR` of a factory; a resolved one is taken as it is. `patches` are checked to be loadable
    now (they are applied before the first deployment is built)."""
    engines = engines or {}
    if isinstance(spec, ServingEngine):
        return spec
    for p in patches or ():
        if not callable(load_attr(p, "engine patch")):
            raise ResolveError(f"engine patch {p!r}: not a function")
    if spec is not None and not isinstance(spec, str):
        caps = {k: getattr(spec, k) for k in ("lookups", "options") if hasattr(spec, k)}
        return ServingEngine(name=ref_of(spec), factory=spec, patches=tuple(patches or ()), **caps)
    if not spec:
        raise ResolveError(f"engine: {_expected(engines)}")
    entry = engines.get(spec)
    if entry is not None:
        return ServingEngine(name=spec, factory=load_attr(entry.ref, "serving engine"), lookups=entry.lookups,
                             options=entry.options, patches=tuple(patches or ()), seam=entry.seam,
                             connectors=entry.connectors, ranks=entry.ranks)
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ResolveError(f"engine {spec!r}: {_expected(engines)}")
    obj = load_attr(spec, "serving engine")
    if not callable(obj):
        raise ResolveError(f"engine {spec!r}: {type(obj).__name__} is not a deployment factory")
    caps = {k: tuple(getattr(obj, k)) if k in ("lookups", "connectors") else getattr(obj, k)
            for k in ("lookups", "options", "seam", "connectors", "ranks") if hasattr(obj, k)}
    return ServingEngine(name=spec, factory=obj, patches=tuple(patches or ()), **caps)


def _expected(engines: Mapping[str, ServingEngineEntry]) -> str:
    return f"expected one of {', '.join(engines)}, or MOD:ATTR" if engines else "expected MOD:ATTR"
