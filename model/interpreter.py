"""The one meaning of the effects (CONTRACT.md): how a `Wait` ends in logical time, how a collective completes,
which handle a rank may wait on, and the one wording of every violation a run of rank programs can end in (desync,
deadlock, hang, termination).

Pure functions over small values: the simulator (`model.sim`), the exhaustive explorer (`checking.explore`) and the
rank processes (`adapters.rank_process`) each keep their own state (a generator per rank, an interned trie node, an
OS process) and ask this module what an effect means and how to say what went wrong.
"""
from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import networkx as nx

from model.calls import ProtocolRaised, Stalled
from model.effects import AllGather, AllReduceMin, Broadcast, Handle, TIMED_OUT, collective_signature
from model.outcome import Violation

__all__ = ["LATE", "WAITS_FOREVER", "ARRIVE_NOTE", "WAITS_FOREVER_NOTE", "completed_note", "wait_outcome", "handle_problem", "timeout_problem", "collective_results",
           "sig_text", "desync", "bad_root", "deadlock", "stuck", "hang", "client_hang", "step_bound", "not_an_effect",
           "rank_failed", "program_failed", "store_call_failed"]

#: `wait_outcome` results other than "the completion's value".
LATE, WAITS_FOREVER = "late", "waits-forever"
#: The notes of a run's events: a rank arrives at a collective, a rank waits forever (see `completed_note`).
ARRIVE_NOTE, WAITS_FOREVER_NOTE = "arrive", "waits forever"


def completed_note(k: int) -> str:
    """The note of a rank's event when collective #`k` completes (its result is the event's)."""
    return f"collective #{k}"


def wait_outcome(clock: float, issued: float, delay: float, lost: bool, timeout: float | None) -> tuple[Any, float]:
    """A `Wait(handle, timeout)` at logical time `clock` on a completion issued at `issued` that arrives `delay`
    seconds later (never when `lost`): (`TIMED_OUT`, clock + timeout) when the timeout passes first,
    (`WAITS_FOREVER`, clock) when there is no timeout and it never arrives, else (None, the arrival or `clock` if
    later): the caller then takes the completion's value."""
    arrival = issued + delay
    late = lost or (timeout is not None and arrival > clock + timeout)
    if not late:
        return None, max(clock, arrival)
    if timeout is None:
        return WAITS_FOREVER, clock
    return TIMED_OUT, clock + timeout


def handle_problem(rank: int, handle: Any, issued: int) -> str | None:
    """Why rank `rank` may not wait on `handle` (it issued `issued` `GetAsync`s), or None."""
    if not isinstance(handle, Handle) or handle.rank != rank or not isinstance(handle.seq, int) \
            or not 0 <= handle.seq < issued:
        return f"rank {rank} waited on {handle!r}, which is not a handle of its own GetAsync"
    return None


def timeout_problem(rank: int, timeout: Any) -> str | None:
    """Why `timeout` is not a timeout a `Wait` may carry, or None."""
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout >= 0):
        return f"rank {rank} waited with timeout {timeout!r}; a timeout is >= 0 seconds or None"
    return None


def collective_results(effects: Sequence[Any], k: int) -> list[Any] | Violation:
    """Every rank's result of collective #`k`, given each rank's effect (index = rank, all of one signature), or the
    desync of a `Broadcast` from a root that is no rank."""
    n, first = len(effects), effects[0]
    if isinstance(first, AllReduceMin):
        return [min(e.value for e in effects)] * n
    if isinstance(first, AllGather):
        return [[e.value for e in effects] for _ in range(n)]
    if isinstance(first, Broadcast):
        if not (type(first.root) is int and 0 <= first.root < n):
            return bad_root(k, first.root, n)
        return [effects[first.root].value] * n
    raise TypeError(f"{first!r} is not a collective")


def sig_text(effect_or_sig: Any) -> str:
    """A collective's signature in words: `AllGather`, `Broadcast(root=0)`."""
    name, root = effect_or_sig if isinstance(effect_or_sig, tuple) else collective_signature(effect_or_sig)
    return f"{name}(root={root})" if root is not None else name


def desync(k: int, q: int, q_sig: Any, r: int, r_sig: Any) -> Violation:
    """Ranks `q` and `r` entered different k-th collectives."""
    return Violation("desync", f"collective #{k}: rank {q} entered {sig_text(q_sig)}, rank {r} entered "
                     f"{sig_text(r_sig)}", {"collective": k, "ranks": {q: sig_text(q_sig), r: sig_text(r_sig)}})


def bad_root(k: int, root: Any, n: int) -> Violation:
    return Violation("desync", f"collective #{k}: Broadcast from root {root}, which is not a rank of {n}",
                     {"collective": k})


def deadlock(waiting: dict[int, int], waits_for: dict[int, list[int]], finished: Sequence[int],
             cycle: Sequence[int] = ()) -> Violation:
    """No rank can move: each of `waiting` (rank -> the collective it waits in) waits for the ranks `waits_for`
    names; `finished` ranks ended without entering it."""
    parts = [f"rank {r} waits in collective #{k} for ranks {sorted(waits_for.get(r, []))}"
             for r, k in sorted(waiting.items())]
    if finished:
        parts.append(f"ranks {sorted(finished)} finished without entering it")
    where = sorted(set(waiting.values()))
    return Violation("deadlock", "; ".join(parts) + (f"; cycle {list(cycle)}" if cycle else ""),
                     {"stuck": sorted(waiting), "waits_for": {r: sorted(waits_for.get(r, [])) for r in waiting},
                      "finished": sorted(finished), "cycle": list(cycle),
                      "collective": where[0] if len(where) == 1 else where})


def stuck(n: int, hung: Mapping[int, str], waiting: Mapping[int, int], arrived: Mapping[int, Collection[int]],
          finished: Sequence[int]) -> list[Violation]:
    """Why a run of `n` ranks where no rank can move is stuck: the hang of every `hung` rank (rank -> the key of the
    completion it waits for); else, when some rank is `waiting` (rank -> the collective it waits in; `arrived`:
    collective -> the ranks in it), the deadlock: who waits for whom, and the cycle if there is one."""
    if hung:
        return [hang(r, key) for r, key in sorted(hung.items())]
    if not waiting:
        return []
    graph = nx.DiGraph()
    for r, k in waiting.items():
        for q in range(n):
            if q not in arrived.get(k, ()):
                graph.add_edge(r, q)
    try:
        cycle = [u for u, _ in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:
        cycle = []
    return [deadlock(waiting, {r: list(graph.successors(r)) for r in waiting}, finished, cycle)]


def hang(rank: int, key: str) -> Violation:
    """A rank waits with no timeout on a completion that never comes."""
    return Violation("hang", f"rank {rank} waits forever on the completion of GetAsync({key!r}), which never comes",
                     {"rank": rank, "key": key})


def client_hang(rank: int, op: str, key: str, seconds: float, text: str) -> Violation:
    """A store call of rank `rank` that did not return within its bound (`text`: the timeout's own words)."""
    return Violation("hang", f"rank {rank}: {text}", {"rank": rank, "op": op, "key": key, "seconds": seconds})


def step_bound(ranks: Sequence[int], bound: int) -> Violation:
    return Violation("termination", f"ranks {list(ranks)} still running after the step bound of {bound}",
                     {"ranks": list(ranks), "step_bound": bound})


def not_an_effect(rank: int, effect: Any) -> str:
    return f"rank {rank} yielded {effect!r}, which is not an effect of model.effects"


def rank_failed(rank: int, text: str, **detail: Any) -> Violation:
    """A rank program that cannot go on (`text` says why: it yielded a non-effect or waited on a handle not its own)."""
    return Violation("termination", text, {"rank": rank, **detail})


def program_failed(rank: int, exc: ProtocolRaised | Stalled) -> Violation:
    """A step of rank `rank`'s program that raised, or did not return (`runtime.watchdog`)."""
    if isinstance(exc, Stalled):
        return rank_failed(rank, str(exc), stalled=exc.method, seconds=exc.seconds, provisional=exc.again)
    return rank_failed(rank, str(exc), exception=type(exc.error).__name__, where=exc.where)


def store_call_failed(rank: int, effect: Any, exc: Exception) -> Violation:
    """A store effect the store refused (an unhashable key, a value that is not bytes)."""
    return rank_failed(rank, f"rank {rank}: {effect!r} failed: {exc}")
