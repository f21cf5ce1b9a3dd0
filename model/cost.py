"""The paper's two-term cost model of a remote KV-cache hit, as plain numbers (no I/O).

    T_hit(n)       = T0 + n * s / B     (fixed per-hit engine cost + transfer)
    T_recompute(n) = n / R              (prefill from scratch)

A hit beats recompute for some n iff B > B* = s*R, and then exactly for n > T0 / (1/R - s/B), a
threshold that is never below R*T0 (its limit at infinite bandwidth).  Synchronous loading turns the
engine into a single-server queue with utilisation rho = lam * bytes_per_hit / B; it has a steady
state only if rho < 1.  `proofs.theorems.T5` proves these statements over the reals.

Units are decimal SI (1 KB = 1e3 bytes, 1 GB = 1e9 bytes): with them s*R = 48.4e3 * 52.2e3 =
2.526e9 B/s reproduces the paper's 2.53 GB/s (binary units would give 2.41 GiB/s).
"""
from __future__ import annotations

import math

import attrs

__all__ = ["t_hit", "t_recompute", "break_even_bandwidth", "hit_threshold_tokens", "hit_wins", "utilisation",
           "PaperFigures", "PAPER", "fit_line"]


def t_hit(n: float, s: float, B: float, T0: float) -> float:
    """Seconds to serve an n-token prompt from the remote tier: T0 + n*s/B."""
    return T0 + n * s / B


def t_recompute(n: float, R: float) -> float:
    """Seconds to prefill n tokens from scratch: n/R."""
    return n / R


def break_even_bandwidth(s: float, R: float) -> float:
    """B* = s*R (bytes/s): below or at it no prompt length makes a hit faster than recompute."""
    return s * R


def hit_threshold_tokens(s: float, R: float, B: float, T0: float) -> float | None:
    """The prompt length above which a hit beats recompute, T0 / (1/R - s/B); None when B <= s*R
    (no length wins).  B = math.inf gives the bandwidth-independent floor R*T0."""
    if B <= s * R:
        return None
    if math.isinf(B):
        return R * T0
    return T0 / (1.0 / R - s / B)


def hit_wins(n: float, s: float, R: float, B: float, T0: float) -> bool:
    """Whether a hit on an n-token prompt is strictly faster than recomputing it."""
    return t_hit(n, s, B, T0) < t_recompute(n, R)


def utilisation(lam: float, bytes_per_hit: float, B: float) -> float:
    """rho = lam * bytes_per_hit / B of the synchronous-loading queue (stable only if rho < 1)."""
    return lam * bytes_per_hit / B


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points (x, y): how a stack's measured times give the
    model's terms (a miss's slope is 1/R; a hit's intercept is T0). Two distinct x at least."""
    n = len(xs)
    if n != len(ys) or len(set(xs)) < 2:
        raise ValueError("fit_line needs as many y as x, and two distinct x at least")
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


@attrs.frozen
class PaperFigures:
    """The paper's figures (GLM-5.3 FP8, 8xB300, PCP8, LMCache + Valkey), decimal SI units."""

    s: float = 48.4e3  # KV bytes per token
    R: float = 52.2e3  # prefill tokens/s
    T0: float = 0.33  # fixed per-hit engine cost, s
    B_star_reported: float = 2.53e9  # B* = s*R, bytes/s
    threshold_reported: float = 17_000  # tokens below which a hit never wins (R*T0)
    lam: float = 1.21  # hit-heavy replay arrival rate, requests/s
    bytes_per_hit: float = 0.79e9  # median KV bytes per request in that replay
    B_sync: tuple[float, float] = (0.78e9, 0.89e9)  # measured synchronous-load bandwidth, bytes/s
    rho_reported: float = 1.13
    B_single_instance: float = 1.71e9  # best single-Valkey L2 path, bytes/s
    B_sharded: float = 10.76e9  # one Valkey per rank, aggregate GET bandwidth, bytes/s
    hit_16k_s: float = 0.88  # measured remote hit, 16k-token prompt
    recompute_16k_s: float = 0.31  # measured recompute, same prompt
    predicted_hit_16k_s: float = 0.79  # the model's prediction for that hit
    sources: dict[str, str] = attrs.field(factory=lambda: {
        "B_star_reported, T0, threshold_reported, B_sharded, hit_16k_s, recompute_16k_s":
            "paper abstract (arXiv 2610.21500), shared/seeds/004_* beside this repository",
        "s, R, B_single_instance, predicted_hit_16k_s":
            "write-up of the paper, section 1 (s = 48.4 KB/token, R = 52.2k token/s), shared/seeds/001_* beside this repository",
        "lam, bytes_per_hit, B_sync, rho_reported":
            "write-up of the paper, section 2 (rho = lam*n*s/B ~ 1.13 > 1), shared/seeds/001_* beside this repository",
    })

    def break_even_bandwidth(self) -> float:
        return break_even_bandwidth(self.s, self.R)

    def hit_threshold_tokens(self, B: float = math.inf) -> float | None:
        return hit_threshold_tokens(self.s, self.R, B, self.T0)

    def utilisation(self, B: float) -> float:
        return utilisation(self.lam, self.bytes_per_hit, B)


PAPER = PaperFigures()
