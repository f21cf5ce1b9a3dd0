"""Rank-program tries: a deterministic rank program's state is the sequence of results it received.

Rank programs are generators and cannot be copied. But a deterministic program's state is determined by the
results it received, so each rank has a trie per `planned` value, keyed by that history; a node memoises the
next effect (or the return value / the exception). A generator is re-created and replayed only when a trie
node is first created (a program that replays differently is not deterministic: `ExploreError`). The step
count of a rank is its node's depth (+1 when it waits in a collective or hangs), and the keys it read are the
reads along the path.
"""
from __future__ import annotations

from typing import Any

from model.calls import ProtocolRaised, Stalled, protocol_call
from model.effects import COLLECTIVES, Get, GetAsync, Handle, Put, TIMED_OUT, Wait
from model.interpreter import not_an_effect, program_failed, rank_failed
from model.outcome import Violation

from checking.explore.result import ExploreError

__all__ = ["Node", "Tries", "freeze", "thaw", "same_effect", "PUT", "GET", "GETASYNC", "WAIT", "COLL", "DONE", "RAISED", "BAD"]

# node kinds
PUT, GET, GETASYNC, WAIT, COLL, DONE, RAISED, BAD = range(8)


# -- hashable snapshots of results (trie edge keys) ------------------------------------------------
def freeze(v: Any) -> Any:
    t = type(v)
    if t is int or t is bytes or t is str or v is None or v is TIMED_OUT or t is Handle:
        return v
    if t is dict:
        return ("d", tuple((freeze(k), freeze(x)) for k, x in v.items()))
    if t is list:
        return ("l", tuple(freeze(x) for x in v))
    if t is tuple:
        return ("t", tuple(freeze(x) for x in v))
    if t is bool:
        return ("b", v)
    if t is float:
        return ("f", v)
    if t is bytearray:
        return ("ba", bytes(v))
    try:
        hash(v)
    except TypeError:
        raise ExploreError(f"cannot snapshot a result of type {t.__name__} for the explorer's trie") from None
    return ("o", v)


def thaw(v: Any) -> Any:
    if type(v) is not tuple:
        return v
    tag, body = v
    if tag == "d":
        return {thaw(k): thaw(x) for k, x in body}
    if tag == "l":
        return [thaw(x) for x in body]
    if tag == "t":
        return tuple(thaw(x) for x in body)
    if tag == "ba":
        return bytearray(body)
    return body


def same_effect(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an effect whose comparison raises: trust the type
        return type(a) is type(b)


# -- the rank tries -----------------------------------------------------------------------------------
class Node:
    """A rank-local program state, named by the results the rank received so far. `n_collectives`: the collectives
    it completed (the index of the one it enters, when `kind` is COLL); `failure`: the termination violation of a
    RAISED node (the program raised or stalled) or a BAD one (it yielded a non-effect)."""

    __slots__ = ("rank", "planned", "parent", "edge", "depth", "kind", "effect", "children", "gen",
                 "reads", "n_collectives", "failure", "ret", "_steps")

    def __init__(self, rank: int, planned: Any, parent: "Node | None", edge: Any, depth: int,
                 reads: tuple, n_collectives: int) -> None:
        self.rank, self.planned, self.parent, self.edge, self.depth = rank, planned, parent, edge, depth
        self.reads, self.n_collectives = reads, n_collectives
        self.children: dict = {}
        self.gen = None
        self.kind = DONE
        self.effect = None
        self.failure: Violation | None = None
        self.ret = None
        self._steps: tuple | None = None

    def steps(self) -> tuple:
        """((effect, result), ...) the rank program went through to reach this node (memoised)."""
        got = self._steps
        if got is None:
            got = () if self.parent is None else self.parent.steps() + ((self.parent.effect, thaw(self.edge)),)
            self._steps = got
        return got

    def history(self) -> list:
        out, node = [], self
        while node.parent is not None:
            out.append(node.edge)
            node = node.parent
        out.reverse()
        return out


class Tries:
    """Per (rank, planned) tries of rank load programs, expanded on demand."""

    def __init__(self, protocol: Any, n: int, hashes: list[str]) -> None:
        self.protocol, self.n, self.hashes = protocol, n, hashes
        self.roots: dict[tuple[int, Any], Node] = {}
        self.count = 0

    def root(self, rank: int, planned: Any) -> Node:
        node = self.roots.get((rank, planned))
        if node is None:
            node = Node(rank, planned, None, None, 0, (), 0)
            gen = self.protocol.rank_load(rank, self.n, self.hashes, planned)
            self._advance(node, gen, None, first=True)
            self.roots[(rank, planned)] = node
            self.count += 1
        return node

    def child(self, node: Node, result: Any, key: Any = None) -> Node:
        """`node`'s child for `result` (`key`: its `freeze`, when the caller has it), created on first use."""
        if key is None:
            key = freeze(result)
        got = node.children.get(key)
        if got is not None:
            return got
        eff = node.effect
        reads = node.reads + (eff.key,) if node.kind in (GET, GETASYNC) else node.reads
        new = Node(node.rank, node.planned, node, key, node.depth + 1, reads, node.n_collectives + (node.kind == COLL))
        gen, node.gen = node.gen, None
        try:
            if gen is None:  # re-create and replay the history
                gen = self._replay(node)
        except Stalled as exc:  # replaying a step that returned before: the same violation as in _advance
            new.kind, new.failure = RAISED, program_failed(node.rank, exc)
        else:
            self._advance(new, gen, thaw(key))
        node.children[key] = new
        self.count += 1
        return new

    def _replay(self, node: Node) -> Any:
        """A fresh generator of `node`'s rank program, fed `node`'s history (it must yield `node.effect`)."""
        gen = self.protocol.rank_load(node.rank, self.n, self.hashes, node.planned)
        try:
            with protocol_call(node.rank, "rank_load"):
                eff = next(gen)
            for edge in node.history():
                with protocol_call(node.rank, "rank_load"):
                    eff = gen.send(thaw(edge))
        except ProtocolRaised as exc:
            raise ExploreError(f"rank {node.rank}'s load program is not deterministic: replaying its history "
                               f"raised {type(exc.error).__name__}: {exc.error}") from None
        if not same_effect(eff, node.effect):
            raise ExploreError(f"rank {node.rank}'s load program is not deterministic: replaying its history "
                               f"yielded {eff!r}, not {node.effect!r}")
        return gen

    @staticmethod
    def _advance(node: Node, gen: Any, value: Any, first: bool = False) -> None:
        done = False
        try:
            with protocol_call(node.rank, "rank_load"):
                try:
                    eff = next(gen) if first else gen.send(value)
                except StopIteration as stop:
                    done, ret = True, stop.value
        except (ProtocolRaised, Stalled) as exc:  # raised, or did not return (see runtime.watchdog): termination
            node.kind, node.failure = RAISED, program_failed(node.rank, exc)
            return
        if done:
            node.kind, node.ret = DONE, ret
            return
        node.effect, node.gen = eff, gen
        if isinstance(eff, COLLECTIVES):
            node.kind = COLL
        elif isinstance(eff, Put):
            node.kind = PUT
        elif isinstance(eff, Get):
            node.kind = GET
        elif isinstance(eff, GetAsync):
            node.kind = GETASYNC
        elif isinstance(eff, Wait):
            node.kind = WAIT
        else:
            node.kind, node.failure = BAD, rank_failed(node.rank, not_an_effect(node.rank, eff))

