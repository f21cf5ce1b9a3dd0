"""The linearizability checker, a small library of its own (as Porcupine is): a sequential specification (a
`model.history.Model`; `KV_MODEL`, the key-value register per key, by default), a concurrent history
(`model.history.History`), and `check(history, model=...)`, which answers linearizable, not (with the op at which the
history stops being linearizable and a linearization of the prefix), or undecided within its bounds.

- `checker`: `check`, the cut into independent parts, the first tries and the choice of path per part;
- `midpoints`: the replay in the order of the ops' midpoints, repaired locally where the model refuses an op;
- `greedy`: the register's greedy pass (reads as early, writes as late as the model and real time allow);
- `register`: the register path (`register_view` models): the exact sweep when every put writes its own value;
- `sweep`: that sweep over the writes' instants, and its argument;
- `zones`: Gibbons & Korach's zones, a necessary condition checked when the sweep backtracks;
- `wing_gong`: the Wing & Gong / Lowe search with a Zobrist-hashed memo, for every other part;

Its modules run compiled when `make venv` built them (`checking.native`; `SHARDCHECK_PURE=1`: the source runs).
"""
from checking import native

native.select(__name__, __path__)

from checking.linearizability.checker import DEFAULT_MAX_STATES, Verdict, check, partitions, per_key, \
    search_part, split_parts  # noqa: E402 -- after the choice of the compiled modules

__all__ = ["Verdict", "check", "partitions", "split_parts", "per_key", "search_part", "DEFAULT_MAX_STATES"]
