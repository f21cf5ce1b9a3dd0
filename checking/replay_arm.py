"""An engine replay's runs in a fresh process of their own: what makes replays hermetic.

An `--engine-patch` function patches the engine's classes for the whole process it runs in, and for good (a user's
fork or fix: `runtime.serving.apply_engine_patches`). So the runs of an engine trace on an engine with patches, or
in a process where some patch was applied already, are made in a fresh process (`arm_session`, through
`checking.layers.LAYERS`): one per trace and arm (a controlled replay's candidate and control may differ in their
patches), spawned (no state of this process inherited), which builds the serving engine with its patches and runs
the trace's case on a fresh deployment each time it is asked (`checking.serving.engine_search.engine_session`). Nothing a
patch did outlives the trace's replay, and no other trace's patch reaches its runs.

Every wait is bounded: the process's start (`START_SECONDS`: it imports torch and LMCache) and each run
(`RUN_SECONDS`: a run's own calls are bounded inside it; this bounds the process as a whole). A process that does
not answer in time, or dies, is killed and the replay is a `ReplayError` saying so. The process dies with this one
(PR_SET_PDEATHSIG), ends when its pipe closes, and is killed and reaped when the session ends, whatever happened
(an error, Ctrl-C: a SIGINT to the process group also reaches it, and it closes its deployment and exits), and
registered with `runtime.reaper`, whose `atexit` hook kills any left (none starts once the exit began).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import signal
from typing import Any, Callable, Iterator

from runtime import reaper
from runtime.tie import tie_to_parent

__all__ = ["arm_session", "arm_spec", "START_SECONDS", "RUN_SECONDS", "STOP_SECONDS"]

#: Seconds a fresh process may take to import the engine and say it is ready (torch and LMCache: about 5 s of CPU).
START_SECONDS = 180.0
#: Seconds one run may take in it (the engine run bounds each of its calls; this bounds the process itself).
RUN_SECONDS = 300.0
#: Seconds it may take to close its last deployment and exit once asked to stop.
STOP_SECONDS = 30.0


def arm_spec(target: Any) -> dict:
    """What a fresh process needs to build `target` (a `checking.serving.engine_search.EngineTarget`) again: the
    resolved serving engine (`runtime.serving.ServingEngine`: its name, patches and capabilities as data, its factory by
    reference, imported there; no table of names is needed to build it again) and plain data."""
    return {"engine": target.engine, "options": dict(target.options),
            "lookup": "both" if len(target.lookups) > 1 else target.lookups[0], "runner": target.runner}


@contextlib.contextmanager
def arm_session(trace: Any, target: Any, error: type[Exception]) -> Iterator[Callable[[], tuple[list, str]]]:
    """`once() -> (violations, note)`: one run of the engine trace `trace` on a fresh deployment of `target`, made in
    a fresh process of this session's own (see the module docstring); what stops it raises `error` (the replay's
    `ReplayError`) saying why."""
    from model.outcome import Violation
    spec = arm_spec(target)
    what = spec["engine"].name + "".join(f"+{p}" for p in spec["engine"].patches)
    ctx = multiprocessing.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, trace.to_json(), spec, error), name="shardcheck-replay-arm",
                       daemon=False)  # (not a daemon: its deployment may start rank processes of its own)
    proc.start()
    reaper.own_process(proc)
    child.close()

    def answer(seconds: float, doing: str) -> Any:
        if not conn.poll(seconds):
            reaper.kill_process(proc)
            raise error(f"the process replaying on {what} did not {doing} within {seconds:g} s (killed)")
        try:
            return conn.recv()
        except (EOFError, OSError):
            proc.join(1.0)
            code = proc.exitcode
            how = "still running" if code is None else (
                f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")
            raise error(f"the process replaying on {what} died while it should {doing} ({how})") from None

    try:
        state, detail = answer(START_SECONDS, "start")
        if state != "ready":
            raise error(detail)

        def once() -> tuple[list, str]:
            conn.send("run")
            status, value = answer(RUN_SECONDS, "finish a run")
            if status != "ok":
                raise error(value)
            violations, note = value
            return [Violation.from_json(v) for v in violations], note
        yield once
    finally:
        with contextlib.suppress(OSError, ValueError, BrokenPipeError):
            conn.send("stop")
        proc.join(STOP_SECONDS)
        reaper.kill_process(proc)
        conn.close()


def _serve(conn: Any, trace_json: dict, spec: dict, error: type[Exception]) -> None:
    """The fresh process: build the engine (its patches are applied by its first deployment, here only), say
    `("ready", None)` or `("failed", why)`, then answer each "run" with `("ok", (violations as JSON, note))` or
    `("err", why)` until "stop" or the pipe's end."""
    tie_to_parent()
    from checking.serving.engine_search import engine_session, engine_target
    from model.trace import Trace
    try:
        trace = Trace.from_json(trace_json)
        target = engine_target(spec["engine"], lookup=spec["lookup"], options=spec["options"],
                               runner=spec["runner"])
        session = engine_session(trace, target.make)
        once = session.__enter__()
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        reaper.exit_now(1)
    conn.send(("ready", None))
    try:
        while True:
            try:
                order = conn.recv()
            except (EOFError, OSError):
                break
            if order != "run":
                break
            try:
                violations, note = once()
                conn.send(("ok", ([v.to_json() for v in violations], note)))
            except error as exc:
                conn.send(("err", str(exc)))
            except Exception as exc:  # noqa: BLE001 - this run's error, the parent's to report
                conn.send(("err", f"{type(exc).__name__}: {exc}"))
    except KeyboardInterrupt:  # (Ctrl-C reaches the whole process group: close, then go)
        pass
    finally:
        with contextlib.suppress(BaseException):
            session.__exit__(None, None, None)
        reaper.exit_now(0)
