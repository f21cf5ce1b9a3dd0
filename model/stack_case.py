"""A serving-stack case as data: prompts and a stream of requests, faults between and during them (CONTRACT.md,
"Serving stacks").

A stack case runs requests through a real serving stack (`--engine vllm`, `--engine sglang-hicache`): the stack serves
them in its own order (its scheduler looks each prompt up in the tier, loads what the connector reports, computes
the rest, saves what is new), and the case says what arrives and what happens to the tier meanwhile:

- `serve` (request, prompt): submit it and step the stack until it ends (what else is in flight advances too);
- `submit` (request, prompt): queue it, no step; `step` (`count` scheduler steps); `drain` (step until nothing is
  left, within the run's bound);
- `abort` (request);
- `evict` (a chunk of a prompt out of a rank's `local` tier or off its `remote` server), `fault` (a rank's server:
  a held fault, `model.faults.HELD_ACTIONS`: `pause`, `resume`, `kill`, `restart`).

Prompts are `model.engine_case.EnginePrompt`s (their chunks of the stack's `chunk_size` tokens, a tail, a stem whose
leading chunks they share, a tenant): one representation of a prompt for every serving layer. Pure data: the stack
that runs it lives in `adapters/`, the interpreter in `checking.serving.stack_run`.
"""
from __future__ import annotations

from typing import Any

import attrs

from model.engine_case import CaseError, EnginePrompt, json_int, json_str, prompt_from_json, prompt_tokens
from model.faults import HELD_ACTIONS

__all__ = ["STACK_STEP_KINDS", "STACK_TIERS", "StackStep", "StackCase", "stack_case_from_json", "request_tokens",
           "MAX_STACK_RANKS", "MAX_STACK_STEPS", "MAX_OUTPUT_TOKENS"]

STACK_STEP_KINDS = ("serve", "submit", "step", "drain", "abort", "evict", "fault")
STACK_TIERS = ("local", "remote")
MAX_STACK_RANKS, MAX_STACK_STEPS, MAX_STACK_PROMPTS, MAX_OUTPUT_TOKENS, MAX_STEP_COUNT = 8, 200, 16, 64, 1000


@attrs.frozen(kw_only=True)
class StackStep:
    """One step of a stack case (see the module docstring); unused fields keep their defaults."""

    kind: str
    request: str = ""
    prompt: str = ""
    rank: int = 0
    chunk: int = 0
    tier: str = "remote"
    action: str = ""
    count: int = 1

    _FIELDS = {"serve": ("request", "prompt"), "submit": ("request", "prompt"), "step": ("count",), "drain": (),
               "abort": ("request",), "evict": ("prompt", "rank", "chunk", "tier"), "fault": ("rank", "action")}

    def to_json(self) -> dict:
        return {"kind": self.kind, **{f: getattr(self, f) for f in self._FIELDS[self.kind]}}

    def describe(self) -> str:
        if self.kind in ("serve", "submit"):
            return f"{self.kind} {self.request} = {self.prompt}"
        if self.kind == "step":
            return f"{self.count} scheduler step{'s' if self.count != 1 else ''}"
        if self.kind == "drain":
            return "step until nothing is left"
        if self.kind == "evict":
            return f"evict {self.prompt} chunk {self.chunk} on rank {self.rank} ({self.tier})"
        if self.kind == "fault":
            return f"{self.action} rank {self.rank}'s server"
        return f"{self.kind} {self.request}"


@attrs.frozen(kw_only=True)
class StackCase:
    """What one stack case runs: `n_ranks` ranks (one server each), the prompts, the steps, and how many tokens each
    request generates (greedy)."""

    n_ranks: int
    prompts: tuple[EnginePrompt, ...] = attrs.field(default=(), converter=tuple)
    steps: tuple[StackStep, ...] = attrs.field(default=(), converter=tuple)
    max_tokens: int = 4

    #: The models a stack case serves: one (`model.engine_case.kv_identity` reads it).
    models = ("m",)

    def prompt(self, name: str) -> EnginePrompt:
        for p in self.prompts:
            if p.name == name:
                return p
        raise KeyError(name)

    def size(self) -> tuple[int, int, int]:
        """What the minimiser makes smaller, in order: ranks, steps, chunks."""
        return (self.n_ranks, len(self.steps), sum(p.chunks for p in self.prompts))

    def to_json(self) -> dict:
        return {"n_ranks": self.n_ranks, "max_tokens": self.max_tokens, "prompts": [p.to_json() for p in self.prompts],
                "steps": [s.to_json() for s in self.steps]}

    def requests(self) -> dict[str, str]:
        """Every request id the case submits, with its prompt's name."""
        return {s.request: s.prompt for s in self.steps if s.kind in ("serve", "submit")}

    def problems(self) -> list[tuple[str, str]]:
        """What is inconsistent, as (field, problem) pairs (empty when the case can run)."""
        out: list[tuple[str, str]] = []
        names = [p.name for p in self.prompts]
        if len(set(names)) != len(names):
            out.append(("prompts", "two prompts share a name"))
        by_name = {p.name: p for p in self.prompts}
        for i, p in enumerate(self.prompts):
            if p.stem and p.stem not in by_name:
                out.append((f"prompts[{i}].stem", f"no prompt named {p.stem!r}"))
            elif p.stem and p.shared > by_name[p.stem].chunks:
                out.append((f"prompts[{i}].shared", f"{p.stem!r} has only {by_name[p.stem].chunks} chunks"))
            if p.shared > p.chunks:
                out.append((f"prompts[{i}].shared", "more shared chunks than chunks"))
            if p.chunks + p.tail == 0:
                out.append((f"prompts[{i}].chunks", "a prompt has at least one token"))
            if p.adapter or p.image or p.deployment:
                out.append((f"prompts[{i}]", "a stack prompt has no adapter, image or deployment"))
        submitted: set[str] = set()
        for i, s in enumerate(self.steps):
            where = f"steps[{i}]"
            if s.kind in ("serve", "submit"):
                if s.request in submitted:
                    out.append((f"{where}.request", f"request {s.request!r} was submitted before (ids are unique)"))
                submitted.add(s.request)
            elif s.kind == "abort" and s.request not in submitted:
                out.append((f"{where}.request", f"no request {s.request!r} before it"))
            if s.prompt and s.prompt not in by_name:
                out.append((f"{where}.prompt", f"no prompt named {s.prompt!r}"))
            if s.kind in ("evict", "fault") and not 0 <= s.rank < self.n_ranks:
                out.append((f"{where}.rank", f"expected 0..{self.n_ranks - 1}"))
            if s.kind == "evict" and s.prompt in by_name and not 0 <= s.chunk < by_name[s.prompt].chunks:
                out.append((f"{where}.chunk", f"{s.prompt!r} has chunks 0..{by_name[s.prompt].chunks - 1}"))
        return out


def request_tokens(case: StackCase, prompt: EnginePrompt, chunk_size: int, vocab: int, salt: str = "") -> list[int]:
    """A prompt's token ids for a stack whose model has `vocab` token ids (`model.engine_case.prompt_tokens`, within
    the vocabulary; `salt`: a run's own token space)."""
    return prompt_tokens(case, prompt, chunk_size, salt, vocab=vocab)


# -- JSON --------------------------------------------------------------------------------------------------------
def _step(data: Any, where: str) -> StackStep:
    if not isinstance(data, dict):
        raise CaseError(where, "expected an object")
    kind = data.get("kind")
    if kind not in STACK_STEP_KINDS:
        raise CaseError(f"{where}.kind", f"expected one of {', '.join(STACK_STEP_KINDS)}, got {kind!r}")
    allowed = {"kind", *StackStep._FIELDS[kind]}
    unknown = set(data) - allowed
    if unknown:
        raise CaseError(f"{where}.{sorted(unknown)[0]}", f"not a field of a {kind} step")
    fields: dict[str, Any] = {"kind": kind}
    for name in StackStep._FIELDS[kind]:
        if name not in data:
            raise CaseError(f"{where}.{name}", "missing")
        if name in ("rank", "chunk"):
            fields[name] = json_int(data, name, where, 0, 10_000)
        elif name == "count":
            fields[name] = json_int(data, name, where, 1, MAX_STEP_COUNT)
        else:
            fields[name] = json_str(data, name, where)
    if kind == "evict" and fields["tier"] not in STACK_TIERS:
        raise CaseError(f"{where}.tier", f"expected one of {', '.join(STACK_TIERS)}, got {fields['tier']!r}")
    if kind == "fault" and fields["action"] not in HELD_ACTIONS:
        raise CaseError(f"{where}.action", f"expected one of {', '.join(HELD_ACTIONS)}, got {fields['action']!r}")
    if kind in ("serve", "submit", "abort") and not fields["request"]:
        raise CaseError(f"{where}.request", "expected a non-empty request id")
    return StackStep(**fields)


def stack_case_from_json(data: Any) -> StackCase:
    """The case of a `stack` trace's `config.case` object; `CaseError` names the first field that is wrong."""
    if not isinstance(data, dict):
        raise CaseError("case", "expected an object")
    unknown = set(data) - {"n_ranks", "max_tokens", "prompts", "steps"}
    if unknown:
        raise CaseError(sorted(unknown)[0], "unknown field")
    for name, cap in (("prompts", MAX_STACK_PROMPTS), ("steps", MAX_STACK_STEPS)):
        if not isinstance(data.get(name, []), list) or len(data.get(name, [])) > cap:
            raise CaseError(name, f"expected a list of at most {cap}")
    case = StackCase(n_ranks=json_int(data, "n_ranks", "", 1, MAX_STACK_RANKS),
                     max_tokens=json_int(data, "max_tokens", "", 1, MAX_OUTPUT_TOKENS, 4),
                     prompts=tuple(prompt_from_json(p, f"prompts[{i}]") for i, p in enumerate(data.get("prompts", []))),
                     steps=tuple(_step(s, f"steps[{i}]") for i, s in enumerate(data.get("steps", []))))
    for field, problem in case.problems():
        raise CaseError(field, problem)
    return case
