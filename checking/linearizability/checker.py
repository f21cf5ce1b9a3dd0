"""Linearizability of a concurrent history against a sequential specification (a `model.history.Model`; by
default `KV_MODEL`, the key-value register per key).

The history is cut into independent parts (P-compositionality: a history is linearizable iff the sub-history
of every part is). A model that is one object per key (`Model.split`) has every multi-key read split into what
it says about each key over its own interval, and every key is a part; with `snapshot=True` a multi-key read
must instead see one instant of all its keys, and it joins them into one part.

Each part is decided by one of two paths, after first tries that can only say "linearizable": a replay of its ops
in the order of their midpoints, repaired locally where the model refuses one (`checking.linearizability.midpoints`),
and for a one-key part of a model with a `register_view`, a greedy pass (`checking.linearizability.greedy`: reads as
early as the model accepts them, writes as late as real time and the reads allow); each order either gets to the
end and is a linearization (the model's `step` accepted every op, real time kept), or gives up. The replay goes
first, unless the greedy pass was the first try that linearized the part before (a history's parts are alike: on
dense one-key parts the replay gives up where the greedy pass gets through). Then:
- the register path (`checking.linearizability.register`), for a model with a `register_view`: when every put
  of the key writes its own value, the part is decided by an exact sweep over the writes' instants
  (`checking.linearizability.sweep`, where the argument is), misses, `contains` reads, deletes and writes that
  never completed included, whose answer is checked against the model before "linearizable" is given;
  otherwise it only simplifies the part (exactly) for the search;
- the search: Wing & Gong's, with Lowe's memo of (set of linearized ops, model state) pairs already tried.
  Call and return events sit in one doubly linked list ordered by time (a call before a return at equal
  times: they overlap); the search linearizes the first call it can, removes that op's two events, and
  backtracks when it reaches the return of an op it has not placed. Every step is constant-time: the set of
  linearized ops is kept as a 128-bit Zobrist hash (XOR of a random word per op), and the stack is a chain of
  frames, so the longest linearizable prefix is one reference until it is reported. Two different sets share
  a hash with probability 2^-128 per pair.

An op that never completed returns at +infinity: it may take effect at any point after its call, or never
(a read that never answered constrains nothing and is dropped). A write that raised is treated the same way.
The search and the sweep are bounded by memory (`max_states` memo entries per part) and optionally by time
(`seconds` in all); when a bound stops one the verdict is undecided (`linearizable` None), says why, and names
the parts left undecided.
"""
from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable, Iterator, Sequence

from checking.linearizability.greedy import greedy_linearizes
from checking.linearizability.register import decide_register
from checking.linearizability.midpoints import replay_order
from checking.linearizability.wing_gong import DEFAULT_MAX_STATES, SearchStopped, Verdict, search_part
from model.history import KV_MODEL, History, Model, Op, split_per_key

__all__ = ["Verdict", "check", "partitions", "split_parts", "per_key", "search_part", "DEFAULT_MAX_STATES"]

#: Kept as the name it always had: the KV model's split of multi-key reads.
per_key = split_per_key


def partitions(ops: Sequence[Op]) -> list[tuple[tuple[str, ...], list[Op]]]:
    """The independent parts of `ops`: (keys, ops touching them), keys joined by multi-key ops."""
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        keys = op.keys
        if len(keys) != 1:
            break
        part = by_key.get(keys[0])
        if part is None:
            by_key[keys[0]] = [op]
        else:
            part.append(op)
    else:  # every op of one key (the common case): no joining
        return [((k,), by_key[k]) for k in sorted(by_key)]
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        while parent.setdefault(k, k) != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for op in ops:
        root = find(op.keys[0])
        for k in op.keys[1:]:
            other = find(k)
            if other != root:
                parent[other] = root
    groups: dict[str, list[Op]] = {}
    for op in ops:
        groups.setdefault(find(op.keys[0]), []).append(op)
    keys_of: dict[str, list[str]] = {}
    for k in parent:
        keys_of.setdefault(find(k), []).append(k)
    return [(tuple(sorted(keys_of[r])), groups[r]) for r in sorted(groups)]


def split_parts(ops: Sequence[Op], split: Callable[[Sequence[Op]], list[Op]]) -> list[tuple[tuple[str, ...], list[Op]]]:
    """`partitions(split(ops))` in one pass over `ops`, for a model's `split` (which leaves a one-key op as it is and
    cuts each multi-key op on its own): only the multi-key ops are split, one at a time."""
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        keys = op.keys
        if len(keys) == 1:
            part = by_key.get(keys[0])
            if part is None:
                by_key[keys[0]] = [op]
            else:
                part.append(op)
            continue
        for piece in split((op,)):
            if len(piece.keys) != 1:  # a piece of several keys (a multi-key write): the general way
                return partitions(split(ops))
            by_key.setdefault(piece.keys[0], []).append(piece)
    return [((k,), by_key[k]) for k in sorted(by_key)]


def _decide_part(keys: tuple[str, ...], ops: list[Op], model: Model, *, max_states: int, deadline: float | None,
                 fast: bool, greedy_first: bool = False) -> tuple[Verdict, str]:
    """One part's verdict and the path that decided it. `greedy_first`: the greedy pass is tried before the replay
    (both only ever say "linearizable", so their order changes only the time and the method named)."""
    register = fast and model.register_view is not None and len(keys) == 1
    greedy = register and len(ops) <= _GREEDY_AT_MOST
    if greedy and greedy_first and greedy_linearizes(keys, ops, model):
        return _LINEARIZED, "greedy"
    if fast and len(ops) <= _REPLAY_AT_MOST and replay_order(keys, ops, model) is not None:
        return _LINEARIZED, "replay"
    if register:
        if greedy and not greedy_first and greedy_linearizes(keys, ops, model):
            return _LINEARIZED, "greedy"
        return decide_register(keys, ops, model, max_states=max_states, deadline=deadline)
    return search_part(keys, ops, model, max_states=max_states, deadline=deadline), "search"


#: What a first try that linearized a part answers (one record for all: only its `linearizable` and `steps` are read).
_LINEARIZED = Verdict(True, 0)
#: Parts longer than this are not tried greedily: after a failed replay, the greedy pass rarely gets to the end of one.
_GREEDY_AT_MOST = 1024
#: Parts longer than this are not replayed first: on a long part the replay rarely gets to the end, even repaired.
_REPLAY_AT_MOST = 4096


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the duration: the checker makes no reference cycles, but it makes many
    small tuples, and each collection would walk every live op of the history again (about half the time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def check(history: History | Sequence[Op], model: Model = KV_MODEL, *, max_states: int = DEFAULT_MAX_STATES,
          seconds: float | None = None, snapshot: bool = False, fast: bool = True) -> Verdict:
    """Decide whether `history` is linearizable against `model`; the first part that is not is reported (or,
    if none is not and some were left undecided by a bound, the verdict is undecided and names them).
    `max_states`: the search's memory bound per part; `seconds`: a time bound for the whole check (None: none;
    a time bound makes the verdict depend on the machine's load, the memory bound does not). `fast=False`
    decides every part by search (for cross-checks)."""
    with _collector_paused():
        return _check(history, model, max_states=max_states, seconds=seconds, snapshot=snapshot, fast=fast)


def _check(history: History | Sequence[Op], model: Model, *, max_states: int, seconds: float | None, snapshot: bool,
           fast: bool) -> Verdict:
    ops = history.ops if isinstance(history, History) else list(history)
    parts = split_parts(ops, model.split) if not snapshot and model.split is not None else partitions(ops)
    deadline = None if seconds is None else time.monotonic() + seconds
    steps = 0
    undecided: list[tuple[str, ...]] = []
    why = None
    methods: dict[str, int] = {}
    greedy_first = False  # the parts of one history are alike: the first try that worked last goes first
    for index, (keys, part_ops) in enumerate(parts):
        if deadline is not None and time.monotonic() > deadline:
            why = why or "the time bound ran out before every part was decided"
            undecided += [k for k, _ in parts[index:]]
            break
        try:
            v, method = _decide_part(keys, part_ops, model, max_states=max_states, deadline=deadline, fast=fast,
                                     greedy_first=greedy_first)
        except SearchStopped as stop:
            steps += stop.steps
            why = why or stop.why
            undecided.append(keys)
            continue
        steps += v.steps
        methods[method] = methods.get(method, 0) + 1
        if method == "greedy" or method == "replay":  # the first try that linearized this part goes first next
            greedy_first = method == "greedy"
        if v.linearizable is False:
            v.steps, v.parts, v.methods = steps, len(parts), methods
            return v
    if undecided:
        return Verdict(None, steps, undecided[0], parts=len(parts), why=why, undecided=undecided, methods=methods)
    return Verdict(True, steps, parts=len(parts), methods=methods)

