"""Minimising a serving-layer case (an engine case or a stack case: the same prompts, steps of the same fields):
fewest ranks, then fewest steps (delta debugging, `checking.minimise.ddmin`), then fewest chunks, then fewer prompts and
deployments, every candidate a consistent case (`problems()` empty)."""
from __future__ import annotations

from typing import Any, Callable

import attrs

from checking.minimise import ddmin
from model.cases import CODECS

__all__ = ["minimise_case"]


def minimise_case(fails: Callable[[Any], bool], case: Any, stop: Callable[[], bool], *, kind: str,
                  ranks: bool = True) -> Any:
    """Fewest ranks (unless not `ranks`), then fewest steps (delta debugging over the parts of `kind`'s codec,
    `model.cases.CODECS`), then fewest chunks, then fewer prompts
    and deployments, keeping `fails(candidate)` true; every candidate is a consistent case (an engine or a stack
    case: the same prompts, steps of the same fields)."""
    current = case
    while ranks and current.n_ranks > 1 and not stop():
        smaller = _fewer_ranks(current)
        if smaller is None or not fails(smaller):
            break
        current = smaller

    codec = CODECS[kind]

    def still(steps: list) -> bool:
        candidate = codec.rebuild(current, steps)
        return not candidate.problems() and fails(candidate)

    steps, _ = ddmin(codec.parts(current), still, should_stop=stop)
    current = codec.rebuild(current, steps)
    for i in range(len(current.prompts)):
        while not stop():
            smaller = _fewer_chunks(current, i)
            if smaller is None or not fails(smaller):
                break
            current = smaller
    return _drop_unused(current, fails, stop)


def _fewer_ranks(case: Any) -> Any | None:
    n = case.n_ranks - 1
    if any(s.kind in ("evict", "fault") and s.rank >= n for s in case.steps):
        steps = tuple(attrs.evolve(s, rank=min(s.rank, n - 1)) for s in case.steps)
        candidate = attrs.evolve(case, n_ranks=n, steps=steps)
    else:
        candidate = attrs.evolve(case, n_ranks=n)
    return None if candidate.problems() else candidate


def _fewer_chunks(case: Any, i: int) -> Any | None:
    p = case.prompts[i]
    if p.chunks <= 1:
        return None
    smaller = attrs.evolve(p, chunks=p.chunks - 1, shared=min(p.shared, p.chunks - 1))
    prompts = case.prompts[:i] + (smaller,) + case.prompts[i + 1:]
    prompts = tuple(attrs.evolve(q, shared=min(q.shared, smaller.chunks)) if q.stem == p.name else q for q in prompts)
    candidate = attrs.evolve(case, prompts=prompts)
    return None if candidate.problems() else candidate


def _drop_unused(case: Any, fails: Callable[[Any], bool], stop: Callable[[], bool]) -> Any:
    used = {s.prompt for s in case.steps if s.prompt}
    stems = {p.stem for p in case.prompts if p.name in used and p.stem}
    keep = tuple(p for p in case.prompts if p.name in used | stems)
    candidate = attrs.evolve(case, prompts=keep)
    if keep != case.prompts and not candidate.problems() and not stop() and fails(candidate):
        case = candidate
    if len(case.models) > 1 and all(p.deployment == 0 for p in case.prompts):
        candidate = attrs.evolve(case, models=case.models[:1])
        if not stop() and fails(candidate):
            case = candidate
    return case
