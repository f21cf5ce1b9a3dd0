"""An engine case as data: the prompts, the deployment's shape and the engine steps (CONTRACT.md, "Engines").

An engine case runs a real serving engine's own lookup-and-load path (`--engine`), as vLLM drives it: every rank
stores a prompt's KV after prefill, the scheduler looks the prompt up (sync, or async: `lookup_cache`, `lookup`,
then polling `lookup_cache`), every rank retrieves the planned prefix, and the request ends (`lookup_unpin`).

- `EnginePrompt`: a prompt's tokens (its own, or the leading chunks of another prompt: a shared prefix) and what
  its KV depends on besides the tokens: the tenant (a `request_configs` tag), the LoRA adapter, an image, and the
  deployment that serves it (each deployment serves one model; every deployment shares the tier).
- The steps (`STEP_KINDS`): `store`, `evict` (a chunk out of a rank's `local` tier, its `remote` server, or `both`;
  LocalCPU's LRU evicts a prompt's chunks suffix first, so a local eviction takes every later chunk too), `fault`
  (a rank's Valkey server held paused or down: `model.faults.HELD_ACTIONS`, pause, resume, kill, restart),
  `lookup` (of a request id and a prompt; `wait=False` leaves an async lookup in flight; `scheduled=False`: the
  scheduler could not schedule it, so vLLM asks `lookup_cache` again later), `poll`, `retrieve`, `end`.
- `EngineCase`: ranks, lookup mode, the models of the deployments, the prompts and the steps; `to_json` /
  `case_from_json` (every field checked, a problem raises `CaseError` naming the field).

Pure data: the deployment that runs it lives in `adapters/`, the interpreter in `checking.serving.engine_run`.
"""
from __future__ import annotations

import hashlib
from typing import Any

import attrs

from model.faults import HELD_ACTIONS

__all__ = ["LOOKUP_MODES", "TIERS", "STEP_KINDS", "MAX_ENGINE_RANKS", "MAX_PROMPT_CHUNKS",
           "MAX_STEPS", "CaseError", "EnginePrompt", "Step", "EngineCase", "prompt_tokens", "kv_identity",
           "case_from_json", "IMAGE_PLACEHOLDER", "json_int", "json_str", "prompt_from_json"]

LOOKUP_MODES = ("sync", "async")
TIERS = ("local", "remote", "both")
STEP_KINDS = ("store", "evict", "fault", "lookup", "poll", "retrieve", "end")
MAX_ENGINE_RANKS, MAX_PROMPT_CHUNKS, MAX_STEPS, MAX_PROMPTS, MAX_MODELS = 16, 64, 2000, 32, 4
#: The token id vLLM emits for every image placeholder position (identical for every image).
IMAGE_PLACEHOLDER = 7


class CaseError(ValueError):
    """A malformed engine case; `field` names what is wrong (`steps[3].rank`, `prompts[0].chunks`, ...)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@attrs.frozen(kw_only=True)
class EnginePrompt:
    """A prompt: `chunks` full chunks (and `tail` tokens past them, never stored), its first `shared` chunks the
    tokens of prompt `stem`; its KV also depends on `tenant`, `adapter`, `image`; served by deployment
    `deployment` (index into the case's `models`)."""

    name: str
    chunks: int
    tail: int = 0
    stem: str = ""
    shared: int = 0
    tenant: str = ""
    adapter: str = ""
    image: str = ""
    deployment: int = 0

    def to_json(self) -> dict:
        return {k: v for k, v in attrs.asdict(self).items() if v not in ("", 0) or k in ("name", "chunks")}


@attrs.frozen(kw_only=True)
class Step:
    """One engine step (see the module docstring); unused fields keep their defaults."""

    kind: str
    prompt: str = ""
    request: str = ""
    rank: int = 0
    chunk: int = 0
    tier: str = "both"
    action: str = ""
    wait: bool = True
    scheduled: bool = True

    _FIELDS = {"store": ("prompt",), "evict": ("prompt", "rank", "chunk", "tier"), "fault": ("rank", "action"),
               "lookup": ("request", "prompt", "wait", "scheduled"), "poll": ("request",), "retrieve": ("request",),
               "end": ("request",)}

    def to_json(self) -> dict:
        return {"kind": self.kind, **{f: getattr(self, f) for f in self._FIELDS[self.kind]}}

    def describe(self) -> str:
        if self.kind == "store":
            return f"store {self.prompt}"
        if self.kind == "evict":
            return f"evict {self.prompt} chunk {self.chunk} on rank {self.rank} ({self.tier})"
        if self.kind == "fault":
            return f"{self.action} rank {self.rank}'s server"
        if self.kind == "lookup":
            how = ("" if self.wait else ", left in flight") + ("" if self.scheduled else ", not scheduled")
            return f"look up {self.request} = {self.prompt}{how}"
        return f"{self.kind} {self.request}"


@attrs.frozen(kw_only=True)
class EngineCase:
    """What one engine case runs: `n_ranks` ranks per deployment, the `lookup` mode, one deployment per entry of
    `models` (all on the same tier), the prompts and the steps."""

    n_ranks: int
    lookup: str = "sync"
    models: tuple[str, ...] = attrs.field(default=("m",), converter=tuple)
    prompts: tuple[EnginePrompt, ...] = attrs.field(default=(), converter=tuple)
    steps: tuple[Step, ...] = attrs.field(default=(), converter=tuple)

    def prompt(self, name: str) -> EnginePrompt:
        for p in self.prompts:
            if p.name == name:
                return p
        raise KeyError(name)

    def size(self) -> tuple[int, int, int, int]:
        """What the minimiser makes smaller, in order: ranks, steps, chunks, deployments."""
        return (self.n_ranks, len(self.steps), sum(p.chunks for p in self.prompts), len(self.models))

    def to_json(self) -> dict:
        return {"n_ranks": self.n_ranks, "lookup": self.lookup, "models": list(self.models),
                "prompts": [p.to_json() for p in self.prompts], "steps": [s.to_json() for s in self.steps]}

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
            if not 0 <= p.deployment < len(self.models):
                out.append((f"prompts[{i}].deployment", f"expected 0..{len(self.models) - 1}"))
        bound: dict[str, str] = {}
        ended: set[str] = set()
        for i, s in enumerate(self.steps):
            where = f"steps[{i}]"
            if s.request in ended:
                out.append((f"{where}.request", f"request {s.request!r} ended before (vLLM's request ids are unique)"))
            if s.kind == "end":
                ended.add(s.request)
            if s.prompt and s.prompt not in by_name:
                out.append((f"{where}.prompt", f"no prompt named {s.prompt!r}"))
            if s.kind in ("evict", "fault") and not 0 <= s.rank < self.n_ranks:
                out.append((f"{where}.rank", f"expected 0..{self.n_ranks - 1}"))
            if s.kind == "evict" and s.prompt in by_name and not 0 <= s.chunk < by_name[s.prompt].chunks:
                out.append((f"{where}.chunk", f"{s.prompt!r} has chunks 0..{by_name[s.prompt].chunks - 1}"))
            if s.kind == "lookup":
                if bound.setdefault(s.request, s.prompt) != s.prompt:
                    out.append((f"{where}.prompt", f"request {s.request!r} was a lookup of {bound[s.request]!r}"))
                if not s.wait and self.lookup != "async":
                    out.append((f"{where}.wait", "only an async lookup can be left in flight"))
            elif s.kind in ("poll", "retrieve", "end") and s.request not in bound:
                out.append((f"{where}.request", f"no lookup of {s.request!r} before it"))
        return out


# -- tokens and KV identities ---------------------------------------------------------------------------------
def _block(seed: str, chunk: int, chunk_size: int, vocab: int | None = None) -> list[int]:
    digest = hashlib.blake2b(f"{seed}|{chunk}".encode(), digest_size=min(64, 2 * chunk_size)).digest()
    digest = (digest * (1 + 2 * chunk_size // len(digest)))[:2 * chunk_size]
    words = [int.from_bytes(digest[2 * i:2 * i + 2], "big") for i in range(chunk_size)]
    if vocab is not None:  # (a model's own vocabulary; ids 0 and 1 are left to its special tokens)
        return [2 + w % (vocab - 2) for w in words]
    return [1000 + w % 30000 for w in words]


def _seed(case: Any, prompt: EnginePrompt, chunk: int) -> str:
    """The prompt whose tokens chunk `chunk` carries: the stem's for the shared chunks (recursively)."""
    while prompt.stem and chunk < prompt.shared:
        prompt = case.prompt(prompt.stem)
    return prompt.name


def prompt_tokens(case: Any, prompt: EnginePrompt, chunk_size: int, salt: str = "", *,
                  vocab: int | None = None) -> list[int]:
    """The prompt's token ids: its full chunks, then `tail` more (`salt`: a run's own token space, so that a tier
    shared with earlier runs never holds its chunks; `vocab`: ids within a model's vocabulary). An image fills
    positions 1..chunk_size-2 of chunk 0 with vLLM's placeholder id (the engine's integration decides how the image
    reaches the cache key). `case`: anything with `prompt(name)` (an engine or a stack case)."""
    tokens: list[int] = []
    for c in range(prompt.chunks + (1 if prompt.tail else 0)):
        block = _block(salt + _seed(case, prompt, c), c, chunk_size, vocab)
        tokens.extend(block if c < prompt.chunks else block[:prompt.tail])
    if prompt.image and prompt.chunks:
        tokens[1:chunk_size - 1] = [IMAGE_PLACEHOLDER] * (chunk_size - 2)
    return tokens


def kv_identity(case: EngineCase, prompt: EnginePrompt, chunk: int) -> tuple:
    """What chunk `chunk`'s KV depends on: the model, the adapter, the tenant, the image and every token up to the
    chunk's end (two prompts with equal identities have equal KV, whoever computed it)."""
    seeds = tuple(_seed(case, prompt, c) for c in range(chunk + 1))
    return (case.models[prompt.deployment], prompt.adapter, prompt.tenant, prompt.image, seeds)


# -- JSON --------------------------------------------------------------------------------------------------------
def json_int(data: dict, name: str, where: str, lo: int, hi: int, default: Any = None) -> int:
    """`data[name]`, an integer in lo..hi (or `default`), else `CaseError` naming `where.name`."""
    v = data.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise CaseError(f"{where}.{name}" if where else name, f"expected an integer in {lo}..{hi}, got {v!r}")
    return v


def json_str(data: dict, name: str, where: str, default: str = "") -> str:
    """`data[name]`, a string (or `default`), else `CaseError` naming `where.name`."""
    v = data.get(name, default)
    if not isinstance(v, str):
        raise CaseError(f"{where}.{name}", f"expected a string, got {v!r}")
    return v


def prompt_from_json(data: Any, where: str) -> EnginePrompt:
    """A prompt of a case's JSON (`where`: its place, for errors)."""
    if not isinstance(data, dict):
        raise CaseError(where, "expected an object")
    unknown = set(data) - {f.name for f in attrs.fields(EnginePrompt)}
    if unknown:
        raise CaseError(f"{where}.{sorted(unknown)[0]}", "unknown field")
    name = json_str(data, "name", where)
    if not name:
        raise CaseError(f"{where}.name", "expected a non-empty string")
    return EnginePrompt(name=name, chunks=json_int(data, "chunks", where, 0, MAX_PROMPT_CHUNKS),
                        tail=json_int(data, "tail", where, 0, 10_000, 0), stem=json_str(data, "stem", where),
                        shared=json_int(data, "shared", where, 0, MAX_PROMPT_CHUNKS, 0),
                        tenant=json_str(data, "tenant", where), adapter=json_str(data, "adapter", where),
                        image=json_str(data, "image", where),
                        deployment=json_int(data, "deployment", where, 0, MAX_MODELS, 0))


def _step(data: Any, where: str) -> Step:
    if not isinstance(data, dict):
        raise CaseError(where, "expected an object")
    kind = data.get("kind")
    if kind not in STEP_KINDS:
        raise CaseError(f"{where}.kind", f"expected one of {', '.join(STEP_KINDS)}, got {kind!r}")
    allowed = {"kind", *Step._FIELDS[kind]}
    unknown = set(data) - allowed
    if unknown:
        raise CaseError(f"{where}.{sorted(unknown)[0]}", f"not a field of a {kind} step")
    fields: dict[str, Any] = {"kind": kind}
    for name in Step._FIELDS[kind]:
        if name not in data:
            raise CaseError(f"{where}.{name}", "missing")
        if name in ("rank", "chunk"):
            fields[name] = json_int(data, name, where, 0, 10_000)
        elif name in ("wait", "scheduled"):
            if not isinstance(data[name], bool):
                raise CaseError(f"{where}.{name}", f"expected true or false, got {data[name]!r}")
            fields[name] = data[name]
        else:
            fields[name] = json_str(data, name, where)
    if kind == "evict" and fields["tier"] not in TIERS:
        raise CaseError(f"{where}.tier", f"expected one of {', '.join(TIERS)}, got {fields['tier']!r}")
    if kind == "fault" and fields["action"] not in HELD_ACTIONS:
        raise CaseError(f"{where}.action", f"expected one of {', '.join(HELD_ACTIONS)}, got {fields['action']!r}")
    if kind in ("lookup", "poll", "retrieve", "end") and not fields["request"]:
        raise CaseError(f"{where}.request", "expected a non-empty request id")
    return Step(**fields)


def case_from_json(data: Any) -> EngineCase:
    """The case of a trace's `config.case` object; `CaseError` names the first field that is wrong."""
    if not isinstance(data, dict):
        raise CaseError("case", "expected an object")
    unknown = set(data) - {"n_ranks", "lookup", "models", "prompts", "steps"}
    if unknown:
        raise CaseError(sorted(unknown)[0], "unknown field")
    n = json_int(data, "n_ranks", "", 1, MAX_ENGINE_RANKS)
    lookup = data.get("lookup", "sync")
    if lookup not in LOOKUP_MODES:
        raise CaseError("lookup", f"expected one of {', '.join(LOOKUP_MODES)}, got {lookup!r}")
    models = data.get("models", ["m"])
    if not isinstance(models, list) or not 1 <= len(models) <= MAX_MODELS or not all(
            isinstance(m, str) and m for m in models):
        raise CaseError("models", f"expected 1..{MAX_MODELS} non-empty model names")
    for name, cap in (("prompts", MAX_PROMPTS), ("steps", MAX_STEPS)):
        if not isinstance(data.get(name, []), list) or len(data.get(name, [])) > cap:
            raise CaseError(name, f"expected a list of at most {cap}")
    case = EngineCase(n_ranks=n, lookup=lookup, models=tuple(models),
                      prompts=tuple(prompt_from_json(p, f"prompts[{i}]") for i, p in enumerate(data.get("prompts", []))),
                      steps=tuple(_step(s, f"steps[{i}]") for i, s in enumerate(data.get("steps", []))))
    for field, problem in case.problems():
        raise CaseError(field, problem)
    return case
