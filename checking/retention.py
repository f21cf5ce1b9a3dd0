"""Retention: a value put and never deleted is still readable later.

Every other store check uses fresh keys and ends in milliseconds, so a client that expires what it writes (a TTL
on every put) passes them all. `Sample.plant` puts a sample of keys (a few lengths, on every rank) on stores made
for it alone; once they are `age` seconds old, `Sample.check` reads each through every declared path, and a miss
(or a changed value) is a `retention` violation, as a store-ops trace whose `age` op waits as long again, so it
replays.

The age tested is `--retention` (default `DEFAULT_RETENTION`, a few seconds so that it fits a short budget),
unless the client declares `retention = SECONDS` (CONTRACT.md: how long it promises to keep a value nobody
deleted): then the sample is read just before it is that old (`retention` less a tenth, at most `MARGIN`),
never later than `--retention`; `retention = 0` means no promise, and nothing is tested. `plan` says, in words,
what is tested (or why not); the layers report it.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Sequence

import attrs

from checking.api import DEFAULT_RETENTION, SearchContext
from checking.storeops import run_ops
from model.finding import Finding
from runtime.bounded import BoundedStore
from model.contract import declared_paths
from model.history import SINGLE_KEY_READS
from model.outcome import Violation
from model.trace import Trace, encode, violations_of

__all__ = ["DEFAULT_RETENTION", "MARGIN", "plan", "Sample", "RetentionRun", "Retention", "RetentionCoverage"]

#: A declared retention is tested this much (at most) before it runs out.
MARGIN = 0.25
#: Value lengths of the sample (cut to the client's `max_value_bytes`).
LENGTHS = (1, 100, 4000)
_samples = itertools.count()


def plan(stores: Sequence[Any], retention: float) -> tuple[float | None, str]:
    """The age to test on `stores` given `--retention` (None: none) and what that means, in words."""
    declared = [getattr(s, "retention", None) for s in stores]
    declared = [d for d in declared if isinstance(d, (int, float)) and not isinstance(d, bool)]
    if retention <= 0:
        return None, "not tested (--retention 0)"
    if not declared:
        return retention, f"values read back {retention:g} s after their put (--retention {retention:g})"
    promise = min(declared)
    if promise <= 0:
        return None, "not tested: the client declares retention = 0 (it promises to keep nothing)"
    age = min(retention, max(promise - min(MARGIN, promise / 10), promise / 2))
    return age, (f"values read back {age:g} s after their put (the client declares retention = {promise:g} s; "
                 f"--retention {retention:g})")


@attrs.define
class Sample:
    """Keys put on `stores` at `planted` (monotonic seconds), read back once `age` seconds old."""

    stores: list
    age: float
    ops: list[dict]
    reads: list[dict]
    planted: float
    wait_bound: float
    prefix: str
    checked: bool = False

    @classmethod
    def plant(cls, stores: Sequence[Any], age: float, *, wait_bound: float) -> "Sample":
        """Put the sample on `stores` (every rank; the lengths of `LENGTHS` within the client's `max_value_bytes`).
        A put that fails is found by `check` (its read fails too)."""
        prefix = f"retention{next(_samples)}-{time.time_ns() % 10**9}:"
        limit = min((getattr(s, "max_value_bytes", None) or 1 << 30) for s in stores)
        puts, reads = [], []
        paths = tuple(p for p in declared_paths(stores[0]) if all(p in declared_paths(s) for s in stores))
        for rank in range(len(stores)):
            for n in dict.fromkeys(min(n, limit) for n in LENGTHS):
                key = f"r{rank}-len{n}"
                puts.append({"rank": rank, "op": "put", "key": key, "value": bytes((i * 7 + rank) % 256 for i in range(n))})
                reads += [{"rank": rank, "op": p, **({"key": key} if p in SINGLE_KEY_READS else {"keys": [key]})}
                          for p in dict.fromkeys(("get", *paths))]
        sample = cls(list(stores), age, puts, reads, 0.0, wait_bound, prefix)
        run_ops(sample.stores, sample._tagged(puts), wait_bound=wait_bound)
        sample.planted = time.monotonic()
        return sample

    def _tagged(self, ops: list[dict]) -> list[dict]:
        return [{**op, **({"key": self.prefix + op["key"]} if "key" in op else
                          {"keys": [self.prefix + k for k in op["keys"]]})} for op in ops]

    def due_in(self) -> float:
        """Seconds until the sample is `age` old (0 or less: due)."""
        return self.planted + self.age - time.monotonic()

    def check(self) -> list[Violation]:
        """Read the aged sample through every path (the oracle: what was put); the violations, as `retention`."""
        self.checked = True
        _, violations = run_ops(self.stores, self._tagged(self.reads), wait_bound=self.wait_bound,
                                done=self._tagged(self.ops), done_ago=round(time.monotonic() - self.planted, 1))
        return violations

    def trace(self, violation: Violation, *, client: str, options: dict) -> Trace:
        """The store-ops trace of a violation, 1-minimal by construction: the put of the key that read wrong, an
        `age` op as long as the sample aged, and that read (without any of them nothing shows)."""
        read = self.reads[int(violation.detail.get("index", 0))]
        key = read.get("key") or read["keys"][0]
        put = next(op for op in self.ops if op["rank"] == read["rank"] and op["key"] == key)
        ops = [put, {"op": "age", "seconds": round(self.age, 3)}, read]
        return Trace.of("store-ops", [violation], summary=f"retention: {violation.summary}", client=client,
                        config={"n_ranks": len(self.stores), **options}, ops=[encode(op) for op in ops],
                        expect={client: "reproduces"}, origin="retention",
                        notes="1-minimal by construction: the put, the age, the read")


class RetentionRun:
    """Retention within one run of the strategies: `start` plants a sample on fresh bounded stores of the client
    (or notes why nothing is tested), `poll()` (from the strategies' `should_stop`) checks it once it is due and
    returns the trace of a violation, `finish(deadline)` waits for it if that fits before `deadline`, `note` says
    what was tested, `close()` closes the stores."""

    def __init__(self, client: Any, *, retention: float, op_timeout: float, options: dict | None = None,
                 n_ranks: int = 2) -> None:
        self.client, self.op_timeout = client, op_timeout
        self.sample: Sample | None = None
        self.found: Trace | None = None
        made = client.stores(n_ranks, **{**client.accepted({"op_timeout": op_timeout}), **(options or {})})
        stores = [BoundedStore(s, op_timeout) for s in made]
        age, self.note = plan([s.inner for s in stores], retention)
        if age is None:
            for s in stores:
                s.close()
            return
        self.sample = Sample.plant(stores, age, wait_bound=op_timeout)
        self.note = f"planted, not read back yet: {self.note}"

    def poll(self) -> Trace | None:
        """Check the sample if it is due (once); the trace of its first violation, or None."""
        sample = self.sample
        if sample is None or sample.checked or sample.due_in() > 0:
            return self.found
        violations = sample.check()
        self.note = self.note.replace("planted, not read back yet: ", "")
        if violations:
            self.note += f": VIOLATED ({violations[0].property})"
            self.found = sample.trace(violations[0], client=self.client.name, options={"op_timeout": self.op_timeout})
        else:
            self.note += f": {len(sample.reads)} reads of {len(sample.ops)} aged values held"
        return self.found

    def finish(self, deadline: float) -> Trace | None:
        """At the end of a run: wait for the sample if it is due before `deadline`, check it; or note that it was
        not read back (the budget ended first)."""
        sample = self.sample
        if sample is None or sample.checked:
            return self.found
        wait = sample.due_in()
        if time.monotonic() + max(0.0, wait) > deadline:
            self.note = (f"not tested: the run ended {wait:.1f} s before the sample was {sample.age:g} s old "
                         "(a longer --budget, or a shorter --retention)")
            return None
        time.sleep(max(0.0, wait))
        return self.poll()

    def close(self) -> None:
        """Delete the sample's keys (best effort: bounded stores, a client that hung is not waited on), close."""
        if self.sample is None:
            return
        for op in self.sample._tagged(self.sample.ops):
            store = self.sample.stores[op["rank"]]
            if not store.broken:
                try:
                    store.delete(op["key"])
                except Exception:  # noqa: BLE001 - cleaning up is best effort; the verdict is already taken
                    break
        for s in self.sample.stores:
            s.close()


@attrs.define
class RetentionCoverage:
    """What retention tested: the age and the sample, or why nothing (in words, from `RetentionRun.note`)."""

    tested: str = ""

    def text(self) -> str:
        return self.tested or "not started"

    def to_json(self) -> dict:
        return {"tested": self.tested}


class _Due:
    """A planted sample as `check`'s `checking.api.Later`: its finding once due; the coverage kept in words."""

    def __init__(self, run: RetentionRun, coverage: RetentionCoverage, client: str) -> None:
        self.run, self.coverage, self.client = run, coverage, client
        coverage.tested = run.note

    def _finding(self, trace: Trace | None) -> Finding | None:
        self.coverage.tested = self.run.note
        if trace is None:
            return None
        return Finding(strategy="retention", violations=violations_of(trace), trace=trace, minimal=True,
                       notes=["1-minimal as built (the put, the age, the read)"])

    def poll(self) -> Finding | None:
        return self._finding(self.run.poll())

    def finish(self, deadline: float) -> Finding | None:
        return self._finding(self.run.finish(deadline))

    def close(self) -> None:
        self.coverage.tested = self.run.note
        self.run.close()


class Retention:
    """`check`'s retention strategy: plants a sample (`RetentionRun`) and returns at once; the sample comes due while
    the strategies after it run (`SearchContext.later`), or at the end if that fits the budget."""

    name = "retention"

    def search(self, ctx: SearchContext) -> Finding | None:
        t = ctx.target
        run = RetentionRun(t.client, retention=ctx.retention, op_timeout=ctx.op_timeout,
                           options=dict(t.client_options), n_ranks=t.rank_cap(2))
        ctx.later.append(_Due(run, ctx.coverage.of(self.name, RetentionCoverage), t.client.name))
        return None
