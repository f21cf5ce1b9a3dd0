"""The engine cases the search runs: an enumeration of small shapes, then seeded random step sequences.

Recurring prompts are the norm: every case looks a prompt up again after other prompts were stored, as a serving
engine's tier sees a system prompt again and again.

- `enumeration(max_ranks, lookups)`: level by level, every (ranks, lookup mode) in turn: the first cases
  (`first_cases`): the recurring episode (store, look up, retrieve, end; another prompt stored; the first looked up
  again), one request id looked up again after the tier changed under it (`recurring_request`: before and after
  its prompt is stored, and before and after a chunk of it is evicted: vLLM asks about a waiting request at every
  step, and a client that memoises an answer per request id keeps a stale one), and the isolation shapes (a prompt
  with the same tokens from another tenant, adapter, image, model, or another deployment of the same model), then
  the recurring episode with one disturbance at every position: a chunk evicted (each rank, first and last chunk,
  each tier), a rank's server paused across a lookup (past the lookup timeout), restarted or killed, the lookup
  repeated, left unscheduled and asked again, or left in flight while another lookup runs; and with every pair of
  such disturbances around its first lookup (`_AROUND`).
- `random_case(rng, n_ranks, lookup)`: 2-4 prompts (shared prefixes, tenants, adapters, images, a second
  deployment) and 6-24 weighted steps.
"""
from __future__ import annotations

import random
from typing import Iterator

from model.engine_case import EngineCase, EnginePrompt, Step

__all__ = ["enumeration", "random_case", "recurring", "recurring_request", "isolation_cases", "first_cases",
           "FIRST_CASES"]

_P0, _P1 = EnginePrompt(name="p0", chunks=3), EnginePrompt(name="p1", chunks=3)


def recurring(n_ranks: int, lookup: str) -> EngineCase:
    """The recurring episode: p0 stored, looked up, retrieved, ended; p1 stored; p0 again."""
    return EngineCase(n_ranks=n_ranks, lookup=lookup, prompts=(_P0, _P1), steps=(
        Step(kind="store", prompt="p0"), Step(kind="lookup", request="q1", prompt="p0"),
        Step(kind="retrieve", request="q1"), Step(kind="end", request="q1"), Step(kind="store", prompt="p1"),
        Step(kind="lookup", request="q2", prompt="p0"), Step(kind="retrieve", request="q2"),
        Step(kind="end", request="q2")))


def recurring_request(n_ranks: int, lookup: str) -> Iterator[tuple[str, EngineCase]]:
    """One request id looked up again after the tier changed under it: looked up before p0 is stored and again after
    (the answer grows), and looked up, a chunk of p0 evicted from the last rank's tiers, looked up again (it
    shrinks)."""
    q1 = Step(kind="lookup", request="q1", prompt="p0")
    steps = {"grows": (q1, Step(kind="store", prompt="p0"), q1),
             "shrinks": (Step(kind="store", prompt="p0"), q1,
                         Step(kind="evict", prompt="p0", rank=n_ranks - 1, chunk=1, tier="both"), q1)}
    for what, first in steps.items():
        yield f"recurring-request-{what}", EngineCase(n_ranks=n_ranks, lookup=lookup, prompts=(_P0,), steps=first + (
            Step(kind="retrieve", request="q1"), Step(kind="end", request="q1")))


def isolation_cases(n_ranks: int, lookup: str) -> Iterator[tuple[str, EngineCase]]:
    """A prompt with p0's tokens from another tenant, adapter, image, model, or deployment of the same model."""
    steps = (Step(kind="store", prompt="p0"), Step(kind="lookup", request="q1", prompt="p1"),
             Step(kind="retrieve", request="q1"), Step(kind="end", request="q1"))
    variants = {"tenant": ({"tenant": "t1"}, {"tenant": "t2"}, ("m",)), "adapter": ({"adapter": "a1"},
                {"adapter": "a2"}, ("m",)), "image": ({"image": "i1"}, {"image": "i2"}, ("m",)),
                "model": ({}, {"deployment": 1}, ("m", "m2")), "deployment": ({}, {"deployment": 1}, ("m", "m"))}
    for what, (a, b, models) in variants.items():
        prompts = (EnginePrompt(name="p0", chunks=3, **a), EnginePrompt(name="p1", chunks=3, stem="p0", shared=3, **b))
        yield f"isolation-{what}", EngineCase(n_ranks=n_ranks, lookup=lookup, models=models, prompts=prompts,
                                              steps=steps)


def _disturbed(base: EngineCase) -> Iterator[tuple[str, EngineCase]]:
    """The episode with one disturbance at every position, the kinds taken in turn (each kind reaches every
    position early, before any kind has exhausted its variants)."""
    kinds = [list(_kind(base, k)) for k in ("pause", "evict", "again", "restart", "unscheduled", "in-flight", "kill")]
    while any(kinds):
        for variants in kinds:
            if variants:
                yield variants.pop(0)


def _kind(base: EngineCase, kind: str) -> Iterator[tuple[str, EngineCase]]:
    steps, n = list(base.steps), base.n_ranks
    ranks = sorted({n - 1, 0})[::-1]
    lookups = [i for i, s in enumerate(steps) if s.kind == "lookup"]
    for i in range(len(steps) + 1):
        nxt = next((j for j in lookups if j >= i), None)
        if kind == "evict":
            for tier in ("local", "both", "remote"):
                for c in (0, 2):
                    for r in ranks:
                        yield (f"evict@{i}", _with(base, steps[:i] + [Step(kind="evict", prompt="p0", rank=r, chunk=c,
                                                                            tier=tier)] + steps[i:]))
        elif kind == "pause" and nxt is not None:
            for r in ranks:
                yield (f"pause@{i}", _with(base, steps[:i] + [Step(kind="fault", rank=r, action="pause")]
                                          + steps[i:nxt + 1] + [Step(kind="fault", rank=r, action="resume")]
                                          + steps[nxt + 1:]))
        elif kind == "again" and nxt == i:
            yield f"again@{nxt}", _with(base, steps[:nxt + 1] + [steps[nxt]] + steps[nxt + 1:])
        elif kind == "unscheduled" and nxt == i:
            yield f"unscheduled@{nxt}", _with(base, steps[:nxt] + [_evolve(steps[nxt], scheduled=False), steps[nxt]]
                                              + steps[nxt + 1:])
        elif kind == "in-flight" and nxt == i and base.lookup == "async":
            yield f"in-flight@{nxt}", _with(base, steps[:nxt] + [_evolve(steps[nxt], wait=False)] + steps[nxt + 1:])
        elif kind in ("restart", "kill"):
            for r in ranks:
                yield f"{kind}@{i}", _with(base, steps[:i] + [Step(kind="fault", rank=r, action=kind)] + steps[i:])


#: What may happen around one lookup: a rank's server paused across it, its LocalCPU copy gone so that its lookup
#: waits on the server past the lookup timeout (P), the lookup left unscheduled and asked
#: again (U), the request looked up again after it (A), left in flight (F, async), a chunk evicted before it from
#: LocalCPU (L) or from the server (R).
_AROUND = ("P", "U", "A", "F", "L", "R")


def _paired(base: EngineCase) -> Iterator[tuple[str, EngineCase]]:
    """The episode with every pair of disturbances around its first lookup, on the first and last rank."""
    steps, n = list(base.steps), base.n_ranks
    j = next(i for i, s in enumerate(steps) if s.kind == "lookup")
    look = steps[j]
    for a in range(len(_AROUND)):
        for b in range(a + 1, len(_AROUND)):
            pair = {_AROUND[a], _AROUND[b]}
            if "F" in pair and base.lookup != "async":
                continue
            for r in sorted({n - 1, 0})[::-1]:
                before = [Step(kind="evict", prompt=look.prompt, rank=r, chunk=0, tier=t)
                          for t, m in (("local", "L"), ("remote", "R")) if m in pair]
                if "P" in pair:
                    if "L" not in pair:
                        before.append(Step(kind="evict", prompt=look.prompt, rank=r, chunk=0, tier="local"))
                    before.append(Step(kind="fault", rank=r, action="pause"))
                around = [_evolve(look, wait="F" not in pair, scheduled="U" not in pair)]
                around += [look] if pair & {"U", "A"} else []
                after = [Step(kind="fault", rank=r, action="resume")] if "P" in pair else []
                yield (f"pair-{''.join(sorted(pair))}@{j}",
                       _with(base, steps[:j] + before + around + after + steps[j + 1:]))


def _with(case: EngineCase, steps: list[Step]) -> EngineCase:
    return EngineCase(n_ranks=case.n_ranks, lookup=case.lookup, models=case.models, prompts=case.prompts,
                      steps=tuple(steps))


def _evolve(step: Step, **changes: object) -> Step:
    return Step(**{**step.to_json(), **changes})


def first_cases(n_ranks: int, lookup: str) -> Iterator[tuple[str, EngineCase]]:
    """A shape's first cases: the recurring episode, one request id looked up again, the isolation cases (a bug of
    any of them shows in the first few cases of the enumeration)."""
    yield "recurring", recurring(n_ranks, lookup)
    yield from recurring_request(n_ranks, lookup)
    yield from isolation_cases(n_ranks, lookup)


#: How many first cases each shape has (the engine search runs them all before it mixes in random cases).
FIRST_CASES = sum(1 for _ in first_cases(1, "sync"))


def enumeration(max_ranks: int, lookups: tuple[str, ...]) -> Iterator[tuple[str, EngineCase]]:
    """The enumeration, smallest shapes first (see the module docstring)."""
    shapes = [(n, mode) for n in range(1, max_ranks + 1) for mode in lookups]
    for n, mode in shapes:
        yield from first_cases(n, mode)
    generators = [g for n, mode in sorted(shapes, key=lambda s: s[0] == 1)
                  for g in (_disturbed(recurring(n, mode)), _paired(recurring(n, mode)))]
    while generators:  # round robin over the shapes: every shape gets its disturbances early
        for g in list(generators):
            item = next(g, None)
            if item is None:
                generators.remove(g)
            else:
                yield item


def random_case(rng: random.Random, n_ranks: int, lookup: str) -> EngineCase:
    """A seeded random case: 2-4 prompts and 6-24 steps (see the module docstring)."""
    models = ("m",) if rng.random() < 0.8 else (("m", "m") if rng.random() < 0.5 else ("m", "m2"))
    prompts = [EnginePrompt(name="p0", chunks=rng.randint(1, 4))]
    for i in range(1, rng.randint(2, 4)):
        stem = rng.choice(prompts)
        kind = rng.random()
        extra: dict = {}
        if kind < 0.15:
            extra = {rng.choice(["tenant", "adapter", "image"]): f"x{i}"}
        chunks = stem.chunks if extra else rng.randint(1, 4)
        shared = stem.chunks if extra else rng.randint(0, min(stem.chunks, chunks))
        if len(models) > 1 and rng.random() < 0.4:
            extra["deployment"] = 1
        prompts.append(EnginePrompt(name=f"p{i}", chunks=chunks, stem=stem.name if shared else "", shared=shared,
                                    tail=rng.choice([0, 0, 3]), **extra))
    steps: list[Step] = []
    made = 0
    open_: list[str] = []
    paused: set[int] = set()
    for _ in range(rng.randint(6, 24)):
        roll = rng.random()
        p = rng.choice(prompts)
        if roll < 0.18 or not steps:
            steps.append(Step(kind="store", prompt=p.name))
        elif roll < 0.40:
            made += 1
            rid = f"q{made}"
            wait = lookup == "sync" or rng.random() < 0.85
            steps.append(Step(kind="lookup", request=rid, prompt=p.name, wait=wait, scheduled=rng.random() < 0.9))
            open_.append(rid)
        elif roll < 0.47 and open_:
            rid = rng.choice(open_)
            prompt = next(s.prompt for s in steps if s.kind == "lookup" and s.request == rid)
            steps.append(Step(kind="lookup", request=rid, prompt=prompt, scheduled=rng.random() < 0.7))
        elif roll < 0.62 and open_:
            steps.append(Step(kind="retrieve", request=rng.choice(open_)))
        elif roll < 0.72 and open_:
            steps.append(Step(kind="end", request=open_.pop(rng.randrange(len(open_)))))
        elif roll < 0.84 and p.chunks:
            steps.append(Step(kind="evict", prompt=p.name, rank=rng.randrange(n_ranks), chunk=rng.randrange(p.chunks),
                              tier=rng.choice(["local", "remote", "both"])))
        elif roll < 0.92:
            r = rng.randrange(n_ranks)
            action = "resume" if r in paused else rng.choice(["pause", "pause", "restart", "kill"])
            paused.symmetric_difference_update({r} if action in ("pause", "resume") else set())
            steps.append(Step(kind="fault", rank=r, action=action))
            if action == "kill":
                steps.append(Step(kind="fault", rank=r, action="restart"))
        elif open_ and lookup == "async":
            steps.append(Step(kind="poll", request=rng.choice(open_)))
    return EngineCase(n_ranks=n_ranks, lookup=lookup, models=models, prompts=tuple(prompts), steps=tuple(steps))
