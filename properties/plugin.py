"""The `shardcheck` pytest plugin (entry point `pytest11`): `pytest properties/ --protocol MOD:ATTR --client NAME`.

Options: `--protocol` (a short name or MOD:ATTR; default the reference `PaperProtocol`), `--client` (a name of
the catalogue's client table or MOD:ATTR; default `model`), `--found-dir` (where failing runs are written as
traces; default `<rootdir>/counterexamples/found`), `--op-timeout` (seconds a store call may take),
`--minimise-seconds` (how long a failing run is minimised on fresh stores before its trace is written),
`--retention` (the least age a value nobody deleted is read back at), `--stall-seconds` (seconds one protocol
method may run without returning; every property test runs under
`runtime.watchdog.watching`, so a blocking protocol fails with a termination violation instead of hanging),
`--client-option KEY=VALUE` (the factory's options, as for `check`), `--max-ranks` and `--setup-timeout`. A real
client whose tier cannot be reached ends the session at once with exit 2 and one line; a test the machine starved
past its reruns is skipped as `undecided` (`model.timing`), never failed.
The Hypothesis profile comes from `HYPOTHESIS_PROFILE` (dev, ci, nightly; default dev) unless
`--hypothesis-profile` is given. The stores a client factory made are closed at the end of the session.

The names `--client`, `--engine` and `--nemesis` resolve in are not this layer's to know (the real clients and
engines are the adapters'): the plugin asks for them through its hook `pytest_shardcheck_catalogue()`, which
`shardcheck.pytest_catalogue` answers with `adapters.catalogue.CATALOGUE` (registered by its `pytest11` entry
point, and by `-p` in the repository's pytest options and in `shardcheck campaign`). With no answer, only the
model's own names resolve (`runtime.registry.MODEL_CATALOGUE`), and a client named otherwise is a usage error
saying so.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from checking.retention import DEFAULT_RETENTION
from model.calls import DEFAULT_OP_TIMEOUT
from model.timing import HarnessOutcome
from runtime import starvation
from runtime.options import ENGINE_FLAGS, HARNESS_FLAGS, NEMESIS_FLAGS, add_options
from runtime.watchdog import STALL_SECONDS, watching
from properties import config as run_config
from properties import profiles
from runtime.registry import (MODEL_CATALOGUE, PROTOCOLS, Catalogue, ResolveError, parse_options, resolve_client,
                              resolve_protocol)

#: pytest's exit code for a tier that cannot be reached (the command line's "unusable input").
EXIT_UNUSABLE = 2

__all__ = ["CatalogueHook", "catalogue_of", "pytest_addhooks", "pytest_addoption", "pytest_configure",
           "pytest_report_header", "pytest_sessionstart", "pytest_runtest_call", "pytest_sessionfinish",
           "EXIT_UNUSABLE"]


class CatalogueHook:
    """The hook through which the plugin is handed the names it resolves (see the module doc)."""

    @pytest.hookspec(firstresult=True)
    def pytest_shardcheck_catalogue(self) -> Catalogue | None:
        """The `runtime.registry.Catalogue` that `--client`, `--engine` and `--nemesis` resolve in (the first
        answer counts; `shardcheck.pytest_catalogue` gives `adapters.catalogue.CATALOGUE`)."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(CatalogueHook)


def catalogue_of(pluginmanager: pytest.PytestPluginManager) -> Catalogue | None:
    """The catalogue the session was handed, or None (nobody answered the hook)."""
    return pluginmanager.hook.pytest_shardcheck_catalogue()


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("shardcheck", "shardcheck property layers")
    clients = (catalogue_of(pluginmanager) or MODEL_CATALOGUE).clients
    group.addoption("--protocol", default=None, metavar="MOD:ATTR",
                    help=f"sharding protocol to check: {', '.join(PROTOCOLS)} or MOD:ATTR (default: paper)")
    group.addoption("--client", default=None, metavar="NAME|MOD:ATTR",
                    help=f"store client to check: {', '.join(clients)} or MOD:ATTR naming a factory (default: model)")
    group.addoption("--found-dir", default=None, metavar="DIR",
                    help="where failing runs are written as traces (default: <rootdir>/counterexamples/found)")
    group.addoption("--op-timeout", default=DEFAULT_OP_TIMEOUT, type=float, metavar="SECONDS",
                    help=f"how long one store-client call may take before it counts as a hang "
                         f"(default: {DEFAULT_OP_TIMEOUT:g})")
    group.addoption("--stall-seconds", default=STALL_SECONDS, type=float, metavar="SECONDS",
                    help="how long one protocol method (rank_lookup, a step of rank_load, ...) may run without "
                         f"returning before it counts as stalled (default: {STALL_SECONDS:g})")
    group.addoption("--minimise-seconds", default=30.0, type=float, metavar="SECONDS",
                    help="how long a failing run of a non-model client may be minimised on fresh stores (store ops "
                         "dropped, ranks/chunks/faults shrunk, while it still fails) before its trace is written "
                         "(default: 30; 0: write it as found)")
    add_options(group.addoption, "--client-option")
    group.addoption("--max-ranks", default=None, type=int, metavar="N",
                    help="no machine uses more than N ranks (default: as many as --client-option urls names, else 4)")
    add_options(group.addoption, *ENGINE_FLAGS, *NEMESIS_FLAGS, *HARNESS_FLAGS)
    group.addoption("--retention", default=DEFAULT_RETENTION, type=float, metavar="SECONDS",
                    help="the least age a value put and never deleted is read back at (a client's own `retention` "
                         f"member lowers it; 0: not tested) (default: {DEFAULT_RETENTION:g})")
    group.addoption("--shrink-real", action="store_true",
                    help="let Hypothesis shrink failures of a real (non-model) client or engine too; off by default "
                         "because every shrink step of a hanging client costs a timeout and a server restart (minutes)")


def pytest_configure(config: pytest.Config) -> None:
    try:
        profiles.register(config.rootpath)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    from hypothesis import settings

    if not config.getoption("hypothesis_profile", None):
        try:
            settings.load_profile(profiles.chosen())
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    protocol, client = config.getoption("protocol"), config.getoption("client")
    try:
        starvation.set_setup_timeout(config.getoption("setup_timeout"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    starvation.start()
    stall, op = config.getoption("stall_seconds"), config.getoption("op_timeout")
    if not stall > 0 or not op > 0:
        raise pytest.UsageError(f"--stall-seconds and --op-timeout must be > 0, got {stall} and {op}")
    if not config.getoption("retention") >= 0:
        raise pytest.UsageError(f"--retention must be >= 0 seconds, got {config.getoption('retention')}")
    catalogue = catalogue_of(config.pluginmanager)
    if catalogue is None:
        for what, spec, known in (("client", client, MODEL_CATALOGUE.clients),
                                  ("engine", config.getoption("engine"), MODEL_CATALOGUE.engines)):
            if isinstance(spec, str) and ":" not in spec and spec not in known:
                raise pytest.UsageError(f"{what} {spec!r}: the named {what}s come from shardcheck's catalogue, which "
                                        "no plugin gave (load it with -p shardcheck.pytest_catalogue), or give MOD:ATTR")
        catalogue = MODEL_CATALOGUE
    try:
        resolve_protocol(protocol)
        resolved = resolve_client(client, catalogue.clients)
        in_memory = resolved.in_memory
        options = parse_options(config.getoption("client_option"))
        resolved.check_options(options)
    except (ResolveError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    max_ranks = config.getoption("max_ranks")
    if max_ranks is not None and max_ranks < 1:
        raise pytest.UsageError(f"--max-ranks must be at least 1, got {max_ranks}")
    if max_ranks is None and options.get("urls") and options.get("topology") != "shared":
        max_ranks = len(options["urls"])
    if not in_memory and stall <= op:
        raise pytest.UsageError(f"--stall-seconds ({stall:g}) must exceed --op-timeout ({op:g}): the time a protocol "
                                "call spends in store calls counts towards its stall limit")
    if (not in_memory or config.getoption("engine")) and not config.getoption("shrink_real"):
        from hypothesis import Phase
        current = settings.get_current_profile_name()
        settings.register_profile(f"{current}-real-client", settings.get_profile(current),
                                  phases=tuple(p for p in settings.get_profile(current).phases if p is not Phase.shrink))
        settings.load_profile(f"{current}-real-client")
    found = config.getoption("found_dir") or config.rootpath / "counterexamples" / "found"
    engine = _engine_target(config, max_ranks, catalogue)
    run_config.CURRENT = run_config.RunConfig(protocol=protocol, client=client, found_dir=found, catalogue=catalogue,
                                              op_timeout=config.getoption("op_timeout"),
                                              minimise_seconds=config.getoption("minimise_seconds"),
                                              retention=config.getoption("retention"),
                                              client_options=options, max_ranks=max_ranks, engine=engine,
                                              nemesis_spec=config.getoption("nemesis"),
                                              recovery_seconds=config.getoption("recovery_seconds"))
    try:
        run_config.CURRENT.nemesis()
    except ValueError as exc:
        raise pytest.UsageError(f"--nemesis: {exc}") from None


def _engine_target(config: pytest.Config, max_ranks: int | None, catalogue: Catalogue) -> object:
    """The serving engine of `--engine` (with `--lookup`, `--engine-option`, `--engine-patch`) named in `catalogue`,
    or None."""
    spec = config.getoption("engine")
    if spec is None:
        if config.getoption("engine_option") or config.getoption("engine_patch"):
            raise pytest.UsageError("--engine-option and --engine-patch need --engine")
        return None
    from checking.serving.engine_search import engine_target
    try:
        return engine_target(spec, lookup=config.getoption("lookup"), max_ranks=max_ranks,
                             options=parse_options(config.getoption("engine_option"), flag="--engine-option"),
                             patches=config.getoption("engine_patch"), engines=catalogue.engines)
    except (ResolveError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_sessionstart(session: pytest.Session) -> None:
    """A tier that cannot be reached is unusable input: exit 2 with one line, before any property runs."""
    cur = run_config.current()
    if cur.in_memory() or session.config.getoption("collectonly"):
        return
    from runtime.preflight import TierUnreachable, reach
    try:
        reach(cur.resolved_client(), cur.factory_options(), n_ranks=1, op_timeout=cur.op_timeout)
    except (TierUnreachable, ResolveError) as exc:
        pytest.exit(f"shardcheck: {exc}", returncode=EXIT_UNUSABLE)


def pytest_report_header(config: pytest.Config) -> str:
    from hypothesis import settings

    cur = run_config.current()
    return (f"shardcheck: protocol {cur.protocol_ref()}, client {cur.client_label()}, "
            f"hypothesis profile {settings.get_current_profile_name()}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """shardcheck's own property tests run under the watchdog (a blocking protocol fails, never hangs); no other. A
    test the machine starved past its reruns (`model.timing.HarnessOutcome`) judged nothing: it is skipped as
    undecided, with the reason, never failed."""
    if not _ours(item):
        return (yield)
    with watching(item.config.getoption("stall_seconds")):
        try:
            return (yield)
        except HarnessOutcome as exc:
            pytest.skip(f"undecided: {exc.reason}")


_PROPERTIES_DIR = Path(__file__).resolve().parent


def _ours(item: pytest.Item) -> bool:
    """Whether `item` is one of shardcheck's property tests (a module of the `properties` package)."""
    try:
        return Path(str(item.path)).resolve().parent == _PROPERTIES_DIR
    except (OSError, ValueError):
        return False


def pytest_sessionfinish(session: pytest.Session) -> None:
    run_config.current().close()
