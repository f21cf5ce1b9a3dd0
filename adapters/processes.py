"""The process runner: each rank of a case in its own OS process, collectives through torch.distributed (gloo).

`ProcessRunner(client).run(protocol, case) -> Outcome` is another `run(protocol, case)`: the same harness steps
as `model.harness.run_case` (store, evict, every rank looks up, the scheduler combines, evict, load), judged by
`model.checks.check_outcome`, so its outcomes save as the same `protocol` traces. The rank programs run in
`adapters.rank_process`; this parent plays the scheduler (`combine`) and the harness's oracle of what is cached.

A case's `schedule` and `seed` are the simulator's: here the OS interleaves the ranks. An eviction during the
load happens in the evicted rank's process before its own load step `step` (there is no global step order).

Bounds: starting the processes, their rendezvous and their stores is the harness's own work, bounded by
`--setup-timeout` (`model.timing.SetupTimeout`, never a property); every phase after it has a bound (`timeout`, the
gloo collective timeout; the load twice that), judged as every timing is (`model.timing`): a rank that has not
reported within it is a `termination` violation, a rank process that dies is one too, and every process is killed
and reaped when the case ends, whatever happens (also on KeyboardInterrupt).
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection as mpc
import os
import time
from typing import Any

import attrs

from adapters.children import reap
from model.calls import DEFAULT_OP_TIMEOUT, ProtocolRaised, Stalled, protocol_call
from model.checks import check_outcome
from model.harness import chunk_hashes, kv_bytes
from model.outcome import Case, Event, Outcome, SimResult, Violation, leading_run
from model.timing import SetupTimeout, overran
from runtime import reaper, starvation

__all__ = ["ProcessRunner", "RunnerError", "DEFAULT_TIMEOUT"]

#: Seconds one gloo collective (and each phase past process start) may take: the in-memory client, and a real
#: one (whose ranks may spend several bounded store calls between two collectives).
DEFAULT_TIMEOUT = 5.0
REAL_CLIENT_TIMEOUT = 15.0
_CTX: Any = None


class RunnerError(RuntimeError):
    """The runner itself could not run a case (the rendezvous failed, a store could not be made)."""


def _context(client: Any) -> Any:
    """A forkserver context that has imported torch (and the first real client's adapter) once: each rank
    process then starts in milliseconds."""
    global _CTX
    if _CTX is None:
        _CTX = multiprocessing.get_context("forkserver")
        preload = ["adapters.processes", "adapters.rank_process", "model.protocols", "runtime.registry"]
        module = getattr(client.factory, "__module__", "") or ""
        if module.startswith("adapters."):  # the real clients' adapter, imported once in the forkserver
            preload.append(module)
        _CTX.set_forkserver_preload(preload)
    return _CTX


class ProcessRunner:
    """`run(protocol, case)` with one OS process per rank; `client` is a resolved `runtime.registry.Client` (or a name
    of `adapters.catalogue.CLIENTS` or `MOD:ATTR` of one; None: the default client), handed whole to every rank
    process."""

    def __init__(self, client: Any = None, *, options: dict | None = None, timeout: float | None = None,
                 op_timeout: float = DEFAULT_OP_TIMEOUT) -> None:
        from adapters.catalogue import CLIENTS
        from runtime.registry import resolve_client
        self.client, self.options = resolve_client(client, CLIENTS), dict(options or {})
        self.in_memory = self.client.in_memory
        if timeout is None:
            timeout = DEFAULT_TIMEOUT if self.in_memory else REAL_CLIENT_TIMEOUT
        self.timeout, self.op_timeout = float(timeout), float(op_timeout)
        self.runs = 0
        self._dir: str | None = None
        #: The OS pids of the last case's rank processes (all reaped when `run` returns).
        self.last_pids: list[int] = []

    def run(self, protocol: Any, case: Case) -> Outcome:
        """Run `case` under `protocol`, every rank its own process, and check the outcome."""
        if case.others:
            raise RunnerError("cases with other prompts in the tier (config.others) run in the simulator only "
                              "(--runner sim)")
        if not self.in_memory and not case.salt.startswith("proc"):  # a real store keeps earlier runs' keys
            case = attrs.evolve(case, salt=f"proc{os.getpid()}-{self.runs}-{case.salt}")
        self.runs += 1
        if self._dir is None:
            self._dir = reaper.temp_dir("shardcheck-ranks-")
        return _Case(self, protocol, case, os.path.join(self._dir, f"case{self.runs}")).run()

    def close(self) -> None:
        """Remove the rendezvous files (each case starts and reaps its own processes)."""
        if self._dir is not None:
            reaper.remove_dir(self._dir)
            self._dir = None

    def __enter__(self) -> "ProcessRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Case:
    """One case: its processes, their pipes, the outcome being built."""

    def __init__(self, runner: ProcessRunner, protocol: Any, case: Case, rendezvous: str) -> None:
        self.runner, self.protocol, self.case, self.rendezvous = runner, protocol, case, rendezvous
        self.n = case.n_ranks
        self.hashes, self.kv = chunk_hashes(case.n_chunks, case.salt), kv_bytes(case.n_chunks, case.salt)
        self.procs: list[Any] = []
        self.conns: list[Any] = []

    def run(self) -> Outcome:
        ctx = _context(self.runner.client)
        r = self.runner
        try:
            for rank in range(self.n):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_rank_entry, name=f"shardcheck-rank{rank}", daemon=True, kwargs=dict(
                    conn=theirs, rank=rank, n=self.n, rendezvous=self.rendezvous, protocol=self.protocol, client=r.client,
                    options=r.options, case=self.case, hashes=self.hashes, kv=self.kv, timeout=r.timeout,
                    op_timeout=r.op_timeout, parent_pid=os.getpid()))
                p.start()
                theirs.close()
                self.procs.append(p)
                self.conns.append(mine)
            return self._phases()
        finally:
            self._reap()
            r.last_pids = [p.pid for p in self.procs if p.pid is not None]

    # -- talking to the ranks ----------------------------------------------------------------------
    def _collect(self, phase: str, seconds: float) -> tuple[dict[int, tuple], dict[int, str]]:
        """Each rank's next message, or why it has none (died, silent past the deadline, a gloo error)."""
        got: dict[int, tuple] = {}
        lost: dict[int, str] = {}
        t0 = time.monotonic()
        while len(got) + len(lost) < self.n:
            waiting = [r for r in range(self.n) if r not in got and r not in lost]
            over = overran(seconds, t0, time.monotonic(), f"the {phase} phase")
            if over is not None:
                for q in waiting:
                    lost[q] = (f"rank {q} did not finish the {phase} phase within {over} (stuck in its own "
                               f"code or its store, never reaching its next collective)")
                break
            ready = mpc.wait([self.conns[q] for q in waiting], timeout=0.2)
            for q in waiting:
                if self.conns[q] in ready:
                    try:
                        msg = self.conns[q].recv()
                    except (EOFError, OSError):
                        self.procs[q].join(1.0)
                        lost[q] = f"rank {q}'s process died in the {phase} phase (exit code {self.procs[q].exitcode})"
                        continue
                    if msg[0] == "error":
                        raise RunnerError(msg[1])
                    if msg[0] == "gloo":
                        lost[q] = msg[1]
                        continue
                    got[q] = msg
        return got, lost

    def _started(self) -> None:
        """Every rank process started, met the others and made its store: the harness's own work, within
        `--setup-timeout` (`SetupTimeout` otherwise; a rank that died or failed there is a `RunnerError`)."""
        seconds = starvation.setup_timeout()
        got, lost = self._collect("start", seconds)
        if lost:
            q, why = min(lost.items())
            if self.procs[q].is_alive():
                raise SetupTimeout(f"starting rank {q}'s process, its rendezvous and its store (the harness's own "
                                   f"work) did not finish within --setup-timeout of {seconds:g} s (+ grace)")
            raise RunnerError(why)

    def _dead(self, lost: dict[int, str], phase: str) -> Violation:
        """One violation for ranks that did not report: the dead or stuck rank first, gloo's view after."""
        silent = {q: why for q, why in lost.items() if not why.startswith(f"rank {q}: ")}
        q, why = min((silent or lost).items())
        others = sorted(set(lost) - {q})
        more = f"; ranks {others} could not complete their collectives either" if others else ""
        return Violation("termination", why + more, {"rank": q, "phase": phase, "ranks": sorted(lost),
                                                     "exitcode": self.procs[q].exitcode})

    def _send_all(self, msg: tuple) -> None:
        for c in self.conns:
            try:
                c.send(msg)
            except (BrokenPipeError, OSError):
                pass

    def _phases(self) -> Outcome:
        case, n, k = self.case, self.n, self.case.n_chunks
        name = str(getattr(self.protocol, "name", type(self.protocol).__name__))
        out = Outcome(case, name, self.hashes, self.kv, {r: {} for r in range(n)}, frozenset(), 0)
        self._started()
        got, lost = self._collect("store", self.runner.timeout)
        for r in sorted(got):
            out.written[r] = dict(got[r][1])
            out.events.extend(got[r][2])
        bad = next((m[3] for _, m in sorted(got.items()) if m[3] is not None), None)
        if lost or bad is not None:
            v = self._dead(lost, "store") if lost else bad
            out.violations = [attrs.evolve(v, summary=f"store phase: {v.summary}")]
            return self._finish(out)
        self._send_all(("lookup",))
        got, lost = self._collect("lookup", self.runner.timeout)
        if lost:
            out.violations = [self._dead(lost, "lookup")]
            return self._finish(out)
        out.cached = frozenset(c for r, m in got.items() for key in m[1] if (c := out.written[r].get(key)) is not None)
        out.lcp = leading_run(out.cached, k)
        for r in range(n):
            out.events.extend(got[r][3])
        raised = next((m[4] for _, m in sorted(got.items()) if m[4] is not None), None)
        if raised is not None:
            out.violations = [Violation("termination", f"lookup: {raised}")]
            return self._finish(out)
        out.reports = [got[r][2] for r in range(n)]
        try:
            with protocol_call(None, "combine"):
                out.planned = self.protocol.combine(list(out.reports), k)
        except (ProtocolRaised, Stalled) as exc:
            out.violations = [Violation("termination", f"lookup: {exc}")]
            return self._finish(out)
        out.events.append(Event(0, None, 0.0, "lookup", "combine", out.planned, note=f"reports {out.reports}"))
        if not isinstance(out.planned, int) or isinstance(out.planned, bool):
            out.violations = [Violation("soundness", f"combine returned {out.planned!r}, not a chunk count")]
            return self._finish(out)
        self._send_all(("load", out.planned))
        got, lost = self._collect("load", self.runner.timeout * 2)
        events = [e for r in sorted(got) for e in got[r][2]]
        violations = []
        if lost:
            violations.append(self._dead(lost, "load"))
        bad = next((m[5] for _, m in sorted(got.items()) if m[5] is not None), None)
        if bad is not None and not lost:
            violations.append(bad)
        events.sort(key=lambda e: (e.time, e.step, -1 if e.rank is None else e.rank))
        out.load = SimResult({r: m[1] for r, m in got.items() if m[5] is None and not lost}, events, [], violations,
                             sum(m[6] for m in got.values()), [x for r in sorted(got) for x in got[r][3]],
                             [list(got[r][4]) if r in got else [] for r in range(n)])
        out.events.extend(events)
        out.violations = check_outcome(out)
        return self._finish(out)

    def _finish(self, out: Outcome) -> Outcome:
        self._send_all(("stop",))
        for i, e in enumerate(out.events):
            e.step = i
        return out

    def _reap(self) -> None:
        """Every rank process ends here: a short join, then kill; none is left behind."""
        for c in self.conns:
            c.close()
        reap(self.procs, seconds=2.0)


def _rank_entry(**kw: Any) -> None:
    from adapters.rank_process import rank_main
    conn = kw.pop("conn")
    rank_main(conn, kw.pop("rank"), kw.pop("n"), kw.pop("rendezvous"), kw.pop("protocol"), kw.pop("client"),
              kw.pop("options"), kw.pop("case"), kw.pop("hashes"), kw.pop("kv"), **kw)
