"""Exhaustive explorer: breadth-first search over every interleaving of the N rank load programs and every
fault choice, for small configurations (N ranks, K chunks, every cached set or a given one).

Pure Python, no I/O (the manifest tooling lives in `checking.manifest`). The modules, bottom up:
- `tries`: rank-program tries (a deterministic program's state is the results it received);
- `stores`: interned store contents and the initial configurations;
- `lazy`: the lazy initial state (presence decided when first observed), with its soundness argument;
- `setup`: the harness's store phase, the initial configurations and their lookup phases;
- `state`: the model explored (`StateSpace`): interned local states, packing, the rank-local transitions (every
  effect's meaning taken from `model.interpreter`), and lazy eviction placement with its soundness argument;
- `terminal`: the real `Outcome` of a terminal state and its checks (`Terminals`);
- `reconstruct`: a violating state's BFS path as a `Case`;
- `halves`: the search loop's memo of each half of the ranks' successor deltas, and when they are the whole story;
- `slow`: the search loop's general path (every branch kind, collective completions, checks near the step bound);
- `bfs`: the search loop (`Search`, over one `StateSpace`), partial-order reduction (with its soundness argument)
  and what is checked where;
- `explorer`: `explore`, `bench` and the test hooks;
- `shards`: exact partitioning into shards and the merge that gives the one-process result;
- `workers`, `on_ray`: the shards on local processes or as Ray tasks; `scale`: the scale benchmark.
`bench()` measures the search (`shardcheck bench`; the manifest: `shardcheck regen manifest`). The search loop's hot
path (`expand`) runs compiled when `make venv` built it (`checking.native`; `SHARDCHECK_PURE=1`: the source runs).
"""
from checking import native

native.select(__name__, __path__)

from checking.explore.explorer import (bench, explore, outcome_summary, terminal_outcomes,  # noqa: E402
                                      terminal_signatures)
from checking.explore.result import ExploreError, ExploreResult  # noqa: E402
from checking.explore.state import DELAY_SECONDS  # noqa: E402

__all__ = ["explore", "ExploreResult", "ExploreError", "bench", "terminal_signatures", "terminal_outcomes",
           "outcome_summary", "DELAY_SECONDS"]
