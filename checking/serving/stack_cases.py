"""The stack cases the search runs: an enumeration of small request streams, then seeded random ones.

Recurring prompts are the norm, as a serving stack's tier sees a system prompt again and again.

- `stack_enumeration(max_ranks)`: for every rank count in turn, the recurring stream (p0 served, p1 served, p0 served
  again: a hit), the last rank short of a chunk in both tiers (n > 1), a shared prefix, the same tokens from another tenant, two requests of one prompt in flight at once,
  a request aborted in flight and its prompt served again; then the recurring stream with one disturbance at every
  position: a chunk evicted (each rank, the first and the last chunk, each tier), a rank's server paused across a
  request (past the lookup timeout), killed, or restarted;
- `stack_random_case(rng, n_ranks)`: 2-3 prompts (shared prefixes, tenants) and 4-12 weighted steps.
"""
from __future__ import annotations

import random
from typing import Iterator

from model.engine_case import EnginePrompt
from model.stack_case import StackCase, StackStep

__all__ = ["stack_enumeration", "stack_random_case", "recurring_stream"]

_P0 = EnginePrompt(name="p0", chunks=2, tail=5)
_P1 = EnginePrompt(name="p1", chunks=2, tail=3)


def _serve(rid: str, prompt: str) -> StackStep:
    return StackStep(kind="serve", request=rid, prompt=prompt)


def recurring_stream(n_ranks: int) -> StackCase:
    """p0 served, p1 served, p0 served again."""
    return StackCase(n_ranks=n_ranks, prompts=(_P0, _P1), steps=(_serve("q1", "p0"), _serve("q2", "p1"),
                                                                  _serve("q3", "p0")))


def _shapes(n: int) -> Iterator[tuple[str, StackCase]]:
    yield "recurring", recurring_stream(n)
    if n > 1:  # (a rank that lost a chunk from both tiers: the prefix every rank holds is shorter than one rank's)
        evicted = [StackStep(kind="evict", prompt="p0", rank=n - 1, chunk=_P0.chunks - 1, tier=t)
                   for t in ("remote", "local")]
        yield "one-rank-short", StackCase(n_ranks=n, prompts=(_P0,), steps=(_serve("q1", "p0"), *evicted,
                                                                            _serve("q2", "p0")))
    yield "shared-prefix", StackCase(n_ranks=n, prompts=(_P0, EnginePrompt(name="p1", chunks=2, tail=2, stem="p0",
                                                                           shared=1)),
                                     steps=(_serve("q1", "p0"), _serve("q2", "p1")))
    yield "isolation-tenant", StackCase(n_ranks=n, prompts=(
        EnginePrompt(name="p0", chunks=2, tail=5, tenant="t1"),
        EnginePrompt(name="p1", chunks=2, tail=5, stem="p0", shared=2, tenant="t2")),
        steps=(_serve("q1", "p0"), _serve("q2", "p1")))
    yield "concurrent", StackCase(n_ranks=n, prompts=(_P0,), steps=(
        _serve("q1", "p0"), StackStep(kind="submit", request="q2", prompt="p0"),
        StackStep(kind="submit", request="q3", prompt="p0"), StackStep(kind="drain")))
    yield "abort", StackCase(n_ranks=n, prompts=(_P0,), steps=(
        _serve("q1", "p0"), StackStep(kind="submit", request="q2", prompt="p0"), StackStep(kind="step", count=1),
        StackStep(kind="abort", request="q2"), _serve("q3", "p0")))
    yield "abort-waiting", StackCase(n_ranks=n, prompts=(_P0,), steps=(
        _serve("q1", "p0"), StackStep(kind="submit", request="q2", prompt="p0"),
        StackStep(kind="abort", request="q2"), _serve("q3", "p0")))


def _disturbed(base: StackCase) -> Iterator[tuple[str, StackCase]]:
    """The stream with one disturbance at every position, the kinds taken in turn."""
    kinds = [list(_kind(base, k)) for k in ("evict", "pause", "restart", "kill")]
    while any(kinds):
        for variants in kinds:
            if variants:
                yield variants.pop(0)


def _kind(base: StackCase, kind: str) -> Iterator[tuple[str, StackCase]]:
    steps, n = list(base.steps), base.n_ranks
    ranks = sorted({n - 1, 0})[::-1]
    for i in range(1, len(steps) + 1):
        if kind == "evict":
            for tier in ("remote", "local"):
                for c in (0, _P0.chunks - 1):
                    for r in ranks:
                        yield (f"evict@{i}", _with(base, steps[:i] + [StackStep(kind="evict", prompt="p0", rank=r,
                                                                                chunk=c, tier=tier)] + steps[i:]))
        elif i < len(steps):
            for r in ranks:
                if kind == "pause":  # across the next request: its lookup waits on the paused server, then resumes
                    around = [StackStep(kind="fault", rank=r, action="pause"), steps[i],
                              StackStep(kind="fault", rank=r, action="resume")]
                else:
                    around = [StackStep(kind="fault", rank=r, action=kind), steps[i]]
                yield f"{kind}@{i}", _with(base, steps[:i] + around + steps[i + 1:])


def _with(base: StackCase, steps: list[StackStep]) -> StackCase:
    return StackCase(n_ranks=base.n_ranks, prompts=base.prompts, steps=tuple(steps), max_tokens=base.max_tokens)


def stack_enumeration(max_ranks: int, counts: tuple[int, ...] | None = None) -> Iterator[tuple[str, StackCase]]:
    """Every shape at every rank count (`counts`, default `max_ranks` and 1, the most first: min-over-ranks needs
    two), then every disturbance."""
    counts = tuple(counts) if counts is not None else tuple(sorted({max_ranks, 1}, reverse=True))
    for n in counts:
        yield from ((f"{what}:{n}", case) for what, case in _shapes(n))
    for n in counts:
        yield from ((f"{what}:{n}", case) for what, case in _disturbed(recurring_stream(n)))


def stack_random_case(rng: random.Random, n_ranks: int) -> StackCase:
    """2-3 prompts and 4-12 steps, weighted towards serving (see the module docstring)."""
    prompts = [EnginePrompt(name="p0", chunks=rng.randint(1, 3), tail=rng.randint(0, 7))]
    for i in range(1, rng.randint(2, 3)):
        stem = rng.choice(prompts)
        shared = rng.randint(0, stem.chunks)
        prompts.append(EnginePrompt(name=f"p{i}", chunks=max(shared, rng.randint(1, 3)), tail=rng.randint(1, 7),
                                    stem=stem.name if shared else "", shared=shared,
                                    tenant=rng.choice(["", "", "t2"])))
    steps: list[StackStep] = []
    submitted: list[str] = []
    for j in range(rng.randint(4, 12)):
        kind = rng.choices(["serve", "submit", "step", "abort", "evict", "fault"], [6, 2, 1, 1, 2, 1])[0]
        if kind in ("serve", "submit"):
            submitted.append(f"q{j}")
            steps.append(StackStep(kind=kind, request=f"q{j}", prompt=rng.choice(prompts).name))
        elif kind == "step":
            steps.append(StackStep(kind="step", count=rng.randint(1, 3)))
        elif kind == "abort" and submitted:
            steps.append(StackStep(kind="abort", request=rng.choice(submitted)))
        elif kind == "evict":
            p = rng.choice([q for q in prompts if q.chunks] or prompts)
            if p.chunks:
                steps.append(StackStep(kind="evict", prompt=p.name, rank=rng.randrange(n_ranks),
                                       chunk=rng.randrange(p.chunks), tier=rng.choice(["remote", "local"])))
        elif kind == "fault":
            r = rng.randrange(n_ranks)
            action = rng.choice(["pause", "kill", "restart"])
            steps.append(StackStep(kind="fault", rank=r, action=action))
            if action == "pause":
                steps.append(StackStep(kind="fault", rank=r, action="resume"))
    return StackCase(n_ranks=n_ranks, prompts=tuple(prompts), steps=tuple(steps) or (_serve("q0", "p0"),))
