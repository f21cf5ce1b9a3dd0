"""The options `shardcheck check`/`replay` and the pytest plugin share, one spec each: the flag and the keyword
arguments both `argparse`'s `add_argument` and pytest's `addoption` take, so a help text or a default has one home."""
from __future__ import annotations

from typing import Any, Callable

from model.faults import SERVER_KIND_NAMES

__all__ = ["SHARED_OPTIONS", "ENGINE_FLAGS", "NEMESIS_FLAGS", "HARNESS_FLAGS", "add_options"]

#: flag -> keyword arguments of `add_argument` / `addoption`.
SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "--client-option": dict(
        action="append", default=[], metavar="KEY=VALUE",
        help="an option of the client's factory, repeatable (urls=a,b; password=...; a value that parses as JSON is "
             "taken as JSON) (default: none)"),
    "--engine": dict(
        default=None, metavar="NAME|MOD:ATTR",
        help="a serving engine whose own lookup-and-load path is checked: lmcache, lmcache-patched or MOD:ATTR of a "
             "deployment factory (default: none; check and replay then check a protocol and a client, pytest runs "
             "no engine layer)"),
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

ENGINE_FLAGS = ("--engine", "--lookup", "--engine-option", "--engine-patch")
#: The harness's own bounds (`runtime.starvation`).
HARNESS_FLAGS = ("--setup-timeout",)
NEMESIS_FLAGS = ("--nemesis", "--recovery-seconds")


def add_options(add: Callable[..., Any], *flags: str) -> None:
    """Add each of `flags` through `add` (a parser's `add_argument` or a pytest group's `addoption`)."""
    for flag in flags:
        add(flag, **SHARED_OPTIONS[flag])
