"""The options `shardcheck check`/`replay` and the pytest plugin share, one spec each: the flag and the keyword
arguments both `argparse`'s `add_argument` and pytest's `addoption` take, so a help text or a default has one home."""
from __future__ import annotations

import math
from typing import Any, Callable

from model.faults import SERVER_KIND_NAMES
from runtime.registry import ResolveError

__all__ = ["SHARED_OPTIONS", "ENGINE_FLAGS", "NEMESIS_FLAGS", "HARNESS_FLAGS", "add_options",
           "ENGINE_OPTION_VALUES", "check_engine_options"]

#: flag -> keyword arguments of `add_argument` / `addoption`.
SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "--client-option": dict(
        action="append", default=[], metavar="KEY=VALUE",
        help="an option of the client's factory, repeatable (urls=a,b; password=...; a value that parses as JSON is "
             "taken as JSON) (default: none)"),
    "--engine": dict(
        default=None, metavar="NAME|MOD:ATTR",
        help="a serving engine whose own lookup-and-load path is checked: lmcache, lmcache-patched or MOD:ATTR of a "
             "deployment factory; or a serving stack served requests: vllm, memory-stack (default: none; check and replay then check a protocol and a client, pytest runs "
             "no engine layer)"),
    "--connector": dict(
        default=None, metavar="NAME|MOD:ATTR",
        help="the KV connector of a serving stack (--engine vllm): lmcache, lmcache-patched, or MOD:ATTR of a "
             "KVConnectorBase_V1 subclass (default: the stack's first)"),
    "--lookup": dict(
        choices=("sync", "async", "both"), default="both",
        help="the engine's scheduler-side lookup clients to drive (default: both)"),
    "--engine-option": dict(
        action="append", default=[], metavar="KEY=VALUE",
        help="an option of the engine's factory (urls=a,b; lookup_timeout_ms=...) or ranks=N (the most ranks of a "
             "case), repeatable (default: none)"),
    "--engine-patch": dict(
        action="append", default=[], metavar="MOD:ATTR",
        help="a function with no arguments called in every process before any engine is built, which may patch the "
             "engine's classes (a fork or a fix), repeatable (default: none)"),
    "--nemesis": dict(
        default=None, metavar="KINDS|all|none",
        help="real faults on the servers: all, none, or a comma-separated list of "
             f"{', '.join(SERVER_KIND_NAMES)} (default: all on servers shardcheck started, none on servers passed "
             "with urls; given explicitly it faults those too: DESTRUCTIVE, they are paused, their connections "
             "killed, their memory filled and their keys evicted -- process faults need servers shardcheck "
             "started)"),
    "--recovery-seconds": dict(
        type=float, default=None, metavar="SECONDS",
        help="once a faulted server is back, the client's calls must succeed again within this bound (default: "
             "twice the op timeout)"),
    "--setup-timeout": dict(
        type=float, default=None, metavar="SECONDS",
        help="seconds the harness's own set-up (a deployment, its servers, rank processes) may take; never a "
             "property of the subject: past it the case runs again, then the verdict is undecided (exit 4) "
             "(default: 60 s scaled by the machine's measured speed, at most 300)"),
}

ENGINE_FLAGS = ("--engine", "--connector", "--lookup", "--engine-option", "--engine-patch")
#: The harness's own bounds (`runtime.starvation`).
HARNESS_FLAGS = ("--setup-timeout",)
NEMESIS_FLAGS = ("--nemesis", "--recovery-seconds")


def add_options(add: Callable[..., Any], *flags: str) -> None:
    """Add each of `flags` through `add` (a parser's `add_argument` or a pytest group's `addoption`)."""
    for flag in flags:
        add(flag, **SHARED_OPTIONS[flag])


def _url_ok(url: Any) -> bool:
    from urllib.parse import urlparse
    if not isinstance(url, str) or not url.strip():
        return False
    p = urlparse(url if "://" in url else f"resp://{url}")
    try:
        return bool(p.hostname) and p.port is not None
    except ValueError:  # a port that is not a number, or out of range
        return False


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


#: What the value of each engine option shardcheck gives a meaning to must be (any engine that takes the option,
#: a `MOD:ATTR` one included: a trace's options are its case's conditions on whichever engine replays it); checked
#: when the options are parsed (`check_engine_options`), so a bad value is one line and exit 2 before anything runs.
ENGINE_OPTION_VALUES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "urls": ("a comma-separated list of HOST:PORT or SCHEME://[:PASSWORD@]HOST:PORT, one per rank",
             lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_url_ok(u) for u in v)),
    "lookup_timeout_ms": ("a whole number of milliseconds, at least 1", lambda v: _whole(v) and v >= 1),
    "close_timeout": ("a number of seconds above 0", lambda v: _seconds(v) and v > 0),
}


def check_engine_options(options: dict, flag: str = "--engine-option") -> None:
    """`ResolveError` naming the first option of `options` whose value `ENGINE_OPTION_VALUES` refuses."""
    for key, value in options.items():
        want = ENGINE_OPTION_VALUES.get(key)
        if want is not None and not want[1](value):
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            raise ResolveError(f"{flag} {key}={shown!r}: expected {want[0]}")
