"""Progress of a long run on stderr: a rich progress bar on a terminal, a plain line every few seconds elsewhere.

Each report shows the engine running now, what it covered so far, cases per second and the time left of the budget.
"""
from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["Progress"]

#: Seconds between two plain lines (when stderr is not a terminal).
PLAIN_EVERY = 5.0


class Progress:
    """`with Progress(budget, enabled=...) as p: ... p.update(coverage)`; `coverage` is a `checking.api.Coverage`."""

    def __init__(self, budget: float, *, enabled: bool = True, started: float | None = None) -> None:
        self.budget, self.enabled = budget, enabled
        self.last = time.monotonic()
        self.start = self.last if started is None else started  # (the budget counts from the command's start)
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> "Progress":
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, Progress as Bar, TextColumn, TimeRemainingColumn
            self.bar = Bar(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.fields[rate]}"),
                           TextColumn("{task.fields[covered]}"), TimeRemainingColumn(),
                           console=Console(stderr=True), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("start", total=self.budget, rate="", covered="")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def update(self, coverage: Any) -> None:
        """Report `coverage` (a `checking.api.Coverage`): the engine running now, protocol cases per second, and what
        that engine covered so far."""
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.start
        cases = coverage.cases()
        rate = f"{cases / elapsed:,.0f} cases/s" if elapsed > 0 and cases else ""
        record = coverage.records.get(coverage.phase)
        covered = record.text() if record is not None else ""
        if self.bar is not None:
            self.bar.update(self.task, completed=min(elapsed, self.budget), description=coverage.phase or "start",
                            rate=rate, covered=covered[:60])
        elif now - self.last >= PLAIN_EVERY:
            self.last = now
            left = max(0.0, self.budget - elapsed)
            print(f"  ... {coverage.phase or 'start'}: {covered}{' (' + rate + ')' if rate else ''}; {left:.0f} s left",
                  file=sys.stderr, flush=True)
