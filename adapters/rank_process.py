"""One rank of a case in its own OS process, its collectives through `torch.distributed` (gloo).

`rank_main` is the body of each rank process `adapters.processes` starts. It runs the contract's
generators unchanged: `rank_store`, its own `rank_lookup`, then `rank_load` (the plan comes from the parent,
which plays the scheduler). Store effects go to this process's own store; collectives go to gloo:
`AllReduceMin` -> `all_reduce(MIN)`, `AllGather` -> `all_gather_object`, `Broadcast` -> `broadcast_object_list`.

Before every collective, and once when its program ends, a rank exchanges the signature of what it is about
to do (kind, root, logical clock) with one `all_gather_object`. Every rank then sees the same list, so a
mismatch (desync), a rank that finished while others wait (deadlock), a hung rank or a raising one are named
identically on every rank and all of them stop together, instead of hanging in gloo. A rank that never reaches
the exchange (dead, or stuck in its own code) is caught by gloo's timeout here and by the parent's deadline.

Faults are those of the simulator: evictions (of this rank's own keys) before and after the lookup and before
a rank-local load step; lost and delayed `GetAsync` completions in logical time (the clock of `Wait`, synced
to the maximum at every collective, as in `model.sim`).
"""
from __future__ import annotations

import datetime
import os
import signal
from typing import Any

import attrs

import torch
import torch.distributed as dist

from adapters.children import die_with_parent
from model.calls import DEFAULT_OP_TIMEOUT, ProtocolRaised, Stalled, protocol_call
from model.effects import AllGather, AllReduceMin, Broadcast, COLLECTIVES, Get, GetAsync, Handle, Put, TIMED_OUT, Wait
from model.faults import NEVER
from model.interpreter import (ARRIVE_NOTE, WAITS_FOREVER, WAITS_FOREVER_NOTE, bad_root, client_hang, completed_note,
                               deadlock, desync, hang, handle_problem, not_an_effect, timeout_problem, wait_outcome)
from model.outcome import Event, Violation

__all__ = ["rank_main", "MAX_LOOKUP_CALLS"]

#: Contains calls of one rank's lookup recorded as events (as in `model.harness`).
MAX_LOOKUP_CALLS = 1000
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


class _Rank:
    """The interpreter of one rank's program: store effects, collectives, faults; events as in `model.sim`."""

    def __init__(self, rank: int, n: int, store: Any, case: Any, written: dict[str, int | None]) -> None:
        self.rank, self.n, self.store, self.case = rank, n, store, case
        self.late = case.faults.late()
        self.written, self.present = written, set()
        self.clock, self.n_async, self.n_coll = 0.0, 0, 0
        self.asyncs: dict[int, tuple[str, float, Any, float]] = {}
        self.events: list[Event] = []
        self.reads: list[tuple[int, str]] = []
        self.sigs: list[tuple[str, int | None]] = []
        self.step = 0

    # -- faults ------------------------------------------------------------------------------------
    def evict(self, e: Any) -> None:
        """Delete this rank's keys of chunk `e.chunk` (when `e.rank` is this rank or None)."""
        if e.rank is not None and e.rank != self.rank:
            return
        for k, c in self.written.items():
            if c == e.chunk and k in self.present:
                self.store.delete(k)
                self.present.discard(k)

    # -- the exchange of signatures -----------------------------------------------------------------
    def exchange(self, payload: tuple) -> list[tuple]:
        out: list[Any] = [None] * self.n
        dist.all_gather_object(out, payload)
        return out

    def judge(self, sigs: list[tuple], phase: str) -> Violation | None:
        """A violation (the same on every rank) when the exchanged signatures do not all name one collective."""
        k = self.n_coll
        bad = {r: s for r, s in enumerate(sigs) if s[0] in ("hang", "raised", "bound")}
        if bad:
            r, s = min(bad.items())
            if s[0] == "hang":  # (s: "hang", op or None for a completion that never comes, text, key, seconds)
                return hang(r, s[3]) if s[1] is None else client_hang(r, s[1], s[3], s[4], s[2])
            return Violation("termination", s[2], {"rank": r})
        kinds = {(s[0], s[1]) for s in sigs}
        if len(kinds) == 1:
            kind, root = next(iter(kinds))
            if kind == "Broadcast" and not (type(root) is int and 0 <= root < self.n):
                return bad_root(k, root, self.n)
            return None
        done = [r for r, s in enumerate(sigs) if s[0] == "done"]
        entered = {r: s for r, s in enumerate(sigs) if s[0] != "done"}
        if done:
            v = deadlock({r: k for r in entered}, {r: done for r in entered}, done)
            return attrs.evolve(v, summary=f"{phase}: {v.summary}")
        first = sigs[0]
        other = next(r for r, s in enumerate(sigs) if (s[0], s[1]) != (first[0], first[1]))
        v = desync(k, 0, (first[0], first[1]), other, (sigs[other][0], sigs[other][1]))
        return attrs.evolve(v, summary=f"{v.summary} (in gloo)")

    def collective(self, effect: Any, phase: str) -> tuple[Any, Violation | None]:
        kind = type(effect).__name__
        root = effect.root if isinstance(effect, Broadcast) else None
        is_int = isinstance(effect, AllReduceMin) and type(effect.value) is int and \
            _INT64[0] <= effect.value <= _INT64[1]
        self.events.append(Event(self.step, self.rank, self.clock, phase, effect, note=ARRIVE_NOTE))
        sigs = self.exchange((kind, root, self.clock, is_int))
        bad = self.judge(sigs, phase)
        if bad is not None:
            return None, bad
        self.sigs.append((kind, root))
        self.clock = max(s[2] for s in sigs)
        if isinstance(effect, AllReduceMin) and all(s[3] for s in sigs):
            t = torch.tensor([effect.value], dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
            value = int(t.item())
        elif isinstance(effect, AllReduceMin):  # not all int64: the simulator's min over the gathered values
            vals: list[Any] = [None] * self.n
            dist.all_gather_object(vals, effect.value)
            value = min(vals)
        elif isinstance(effect, AllGather):
            value = [None] * self.n
            dist.all_gather_object(value, effect.value)
        else:
            box = [effect.value if self.rank == root else None]
            dist.broadcast_object_list(box, src=root)
            value = box[0]
        self.events.append(Event(self.step, self.rank, self.clock, phase, effect, value,
                                 note=completed_note(self.n_coll)))
        self.n_coll += 1
        return value, None

    # -- store effects (as `model.sim.Simulator._store_op`) ----------------------------------------
    def store_op(self, effect: Any) -> Any:
        if isinstance(effect, Put):
            self.store.put(effect.key, effect.value)
            return None
        if isinstance(effect, Get):
            self.reads.append((self.rank, effect.key))
            return self.store.get(effect.key)
        if isinstance(effect, GetAsync):
            i = self.n_async
            self.n_async += 1
            self.reads.append((self.rank, effect.key))
            delay = self.late.get((self.rank, i), 0.0)
            self.asyncs[i] = (effect.key, self.clock, None if delay == NEVER else self.store.get_async(effect.key),
                              delay)
            return Handle(self.rank, i, effect.key)
        if isinstance(effect, Wait):
            h = effect.handle
            problem = handle_problem(self.rank, h, self.n_async) or timeout_problem(self.rank, effect.timeout)
            if problem:
                raise TypeError(problem)
            key, issued, future, delay = self.asyncs[h.seq]
            late, self.clock = wait_outcome(self.clock, issued, delay, future is None, effect.timeout)
            if late is WAITS_FOREVER:
                return _HUNG
            if late is TIMED_OUT:
                return TIMED_OUT
            return future.result(timeout=WAIT_BOUND)
        raise TypeError(not_an_effect(self.rank, effect))

    # -- one program ---------------------------------------------------------------------------------
    def run(self, program: Any, phase: str, method: str, evictions: dict[int, list] | None = None
            ) -> tuple[Any, Violation | None]:
        """Drive `program` to its end; (its return value, the violation that stopped it or None)."""
        from model.contract import StoreCallTimeout
        value, first, bound = None, True, self.case.bound()
        while True:
            try:
                with protocol_call(self.rank, method):
                    effect = next(program) if first else program.send(value)
            except StopIteration as stop:
                return self.finish(phase, stop.value)
            except (ProtocolRaised, Stalled) as exc:
                return self.finish(phase, None, ("raised", None, str(exc)))
            first = False
            if self.step >= bound:
                return self.finish(phase, None, ("bound", None, f"rank {self.rank} still running after the step "
                                                 f"bound of {bound}"))
            for e in (evictions or {}).get(self.step, ()):
                self.evict(e)
                self.events.append(Event(self.step, e.rank, 0.0, phase, e, note="evict"))
            if isinstance(effect, COLLECTIVES):
                value, bad = self.collective(effect, phase)
                if bad is not None:
                    return None, bad
            else:
                try:
                    value = self.store_op(effect)
                except (StoreCallTimeout, TimeoutError) as exc:
                    key = getattr(effect, "key", None) or getattr(getattr(effect, "handle", None), "key", "?")
                    self.events.append(Event(self.step, self.rank, self.clock, phase, effect, note=f"client hang: {exc}"))
                    return self.finish(phase, None, ("hang", getattr(exc, "op", type(effect).__name__), f"{exc}", key,
                                                     getattr(exc, "seconds", DEFAULT_OP_TIMEOUT)))
                except TypeError as exc:
                    return self.finish(phase, None, ("raised", None, str(exc)))
                if value is _HUNG:
                    self.events.append(Event(self.step, self.rank, self.clock, phase, effect, note=WAITS_FOREVER_NOTE))
                    key = effect.handle.key
                    return self.finish(phase, None, ("hang", None, "", key, None))
                self.events.append(Event(self.step, self.rank, self.clock, phase, effect, value))
            self.step += 1

    def finish(self, phase: str, result: Any, why: tuple | None = None) -> tuple[Any, Violation | None]:
        """The closing exchange: every rank learns that this one is done (or hung, or raised)."""
        sigs = self.exchange(why or ("done", None, self.clock))
        if all(s[0] == "done" for s in sigs):
            return result, None
        return result, self.judge(sigs, phase)


#: Seconds a `Wait` on an in-flight completion may take in real time (the simulator's default wait bound).
WAIT_BOUND = DEFAULT_OP_TIMEOUT
_HUNG = object()


def _make_store(client: Any, rank: int, options: dict, op_timeout: float) -> Any:
    """This rank's store of `client` (a resolved `runtime.registry.Client`; on the rank's own server of a user's
    `urls`), bounded unless in memory."""
    from runtime.registry import options_for_ranks
    store = client.stores(1, **options_for_ranks(options, 1, first=rank))[0]
    if client.in_memory:
        return store
    from runtime.bounded import BoundedStore
    return BoundedStore(store, op_timeout)


def _lookup(protocol: Any, rk: _Rank, hashes: list[str]) -> int:
    calls = [0]

    def contains(key: str) -> bool:
        hit = rk.store.contains(key)
        calls[0] += 1
        if calls[0] <= MAX_LOOKUP_CALLS:
            rk.events.append(Event(0, rk.rank, 0.0, "lookup", ("contains", key), hit))
        return hit

    with protocol_call(rk.rank, "rank_lookup"):
        report = protocol.rank_lookup(rk.rank, rk.n, hashes, contains)
    rk.events.append(Event(0, rk.rank, 0.0, "lookup", "report", report))
    return report


def rank_main(conn: Any, rank: int, n: int, rendezvous: str, protocol: Any, client: Any, options: dict, case: Any,
              hashes: list[str], kv: list[bytes], *, timeout: float, op_timeout: float, parent_pid: int) -> None:
    """The body of rank `rank`'s process; talks to the parent over `conn` (see `adapters.processes`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it kills and reaps us
    die_with_parent(parent_pid)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        span = datetime.timedelta(seconds=timeout)
        dist.init_process_group("gloo", store=dist.FileStore(rendezvous, n), rank=rank, world_size=n, timeout=span)
    except Exception as exc:
        conn.send(("error", f"rank {rank}: rendezvous in {rendezvous} failed: {type(exc).__name__}: {exc}"))
        return
    store = None
    try:
        store = _make_store(client, rank, options, op_timeout)
        conn.send(("ready",))
        _phases(conn, rank, n, protocol, store, case, hashes, kv)
    except RuntimeError as exc:  # gloo: a peer that died or did not come within the timeout
        conn.send(("gloo", f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))
    except Exception as exc:
        conn.send(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
    finally:
        if store is not None:
            store.close()
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        conn.close()


def _phases(conn: Any, rank: int, n: int, protocol: Any, store: Any, case: Any, hashes: list[str],
            kv: list[bytes]) -> None:
    chunk_of = {v: c for c, v in enumerate(kv)}
    rk = _Rank(rank, n, store, case, {})
    _, bad = rk.run(protocol.rank_store(rank, n, hashes, kv), "store", "rank_store")
    for ev in rk.events:
        if ev.note == "" and isinstance(ev.effect, Put):
            rk.written[ev.effect.key] = chunk_of.get(ev.effect.value)
    rk.present = set(rk.written)
    conn.send(("stored", rk.written, rk.events, bad))
    if bad is not None or conn.recv()[0] != "lookup":
        return
    for e in case.faults.at("before-lookup"):
        rk.evict(e)
    rk.events, report = [], None
    try:
        report = _lookup(protocol, rk, hashes)
    except (ProtocolRaised, Stalled) as exc:
        conn.send(("looked", sorted(rk.present), None, rk.events, str(exc)))
        return
    conn.send(("looked", sorted(rk.present), report, rk.events, None))
    msg = conn.recv()
    if msg[0] != "load":
        return
    for e in case.faults.at("after-lookup"):
        rk.evict(e)
    during: dict[int, list] = {}
    for e in case.faults.at("during-load"):
        during.setdefault(e.step, []).append(e)
    rk.events, rk.step = [], 0
    result, bad = rk.run(protocol.rank_load(rank, n, hashes, msg[1]), "load", "rank_load", during)
    conn.send(("loaded", result, rk.events, rk.reads, rk.sigs, bad, rk.step))
