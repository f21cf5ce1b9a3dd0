"""Concurrent histories of store-client operations, and the sequential key-value register they are judged by.

An `Op` is one call as a caller saw it: who called (`caller`), which read/write path, its key(s) and value,
when it was invoked and when it completed (`None`: it never completed), and its result or error. A `History`
is the ops of one run. `KVModel` is the sequential specification: a register per key holding bytes or
nothing, with every read path of the contract (and the batch and prefix forms adapters offer) as a function
of the register state. `Model` is a sequential specification as a record, the form the linearizability checker
takes (Porcupine's: init, step, equal and the describe hooks a picture uses); `KV_MODEL` is the key-value
register in that form, the one specification. `lanes` is a plain data form of a history for pictures.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs

__all__ = ["Op", "History", "KVModel", "Model", "KV_MODEL", "LOSSY_KV_MODEL", "split_per_key", "WRITE_PATHS",
           "SINGLE_KEY_READS", "MULTI_KEY_READS", "READ_PATHS", "READ_ANY", "VALUE_READS", "FAULT_PATHS", "lanes",
           "read_args", "answer", "wrong_key", "short_value", "NEMESIS_CALLER"]

#: The caller of a history's fault ops (what each real-server fault did to every key, `History.faults`).
NEMESIS_CALLER = "nemesis"

#: Paths that change the register (the server's own eviction of a key is a delete no client made: `Op.server`).
WRITE_PATHS = ("put", "delete")
#: Reads of one key: their result is the value (or `None`), `contains` a bool.
SINGLE_KEY_READS = ("get", "get_async", "get_sync", "contains")
#: Reads of several keys (field `keys`): `get_batch` a value per key; `get_prefix` the values of the leading
#: run of hits; `contains_batch` / `contains_async` the length of that run.
MULTI_KEY_READS = ("get_batch", "get_prefix", "contains_batch", "contains_async")
READ_PATHS = SINGLE_KEY_READS + MULTI_KEY_READS
#: What a real-server fault did to one key, as an op of the nemesis in a history (`LossyKVModel`): `fault-wipe` (a
#: restart empty: the key is gone), `fault-save` / `fault-restore` (SAVE at the strike, the snapshot loaded at the
#: restart), `fault-lose` (an eviction by the server's policy: the key may be gone).
FAULT_PATHS = ("fault-wipe", "fault-save", "fault-restore", "fault-lose")
#: Reads whose result holds values (bytes or None), not a count or a bool.
VALUE_READS = ("get", "get_async", "get_sync", "get_batch", "get_prefix")


def short_value(v: Any, width: int = 16) -> str:
    """A result in a few characters: bytes as their length and first `width` characters, lists item by item."""
    if isinstance(v, (bytes, bytearray)):
        b = bytes(v)
        head = b[:width].decode("utf-8", "replace")
        return f"{len(b)} bytes {head!r}{'...' if len(b) > width else ''}"
    if isinstance(v, list):
        return "[" + ", ".join(short_value(x, width) for x in v) + "]"
    return repr(v)


def read_args(path: str, keys: Sequence[str]) -> tuple:
    """The arguments of a call of read path `path` on `keys`: the key, or the list of keys of a multi-key read."""
    if path in SINGLE_KEY_READS:
        return (keys[0],)
    if path in MULTI_KEY_READS:
        return (list(keys),)
    raise ValueError(f"unknown read path {path!r} (known: {', '.join(READ_PATHS)})")


def answer(path: str, values: Sequence[bytes | None]) -> Any:
    """What a correct client answers to the read `path` of keys whose values are `values` (None: absent):
    the value (`get`...), a bool (`contains`), a value per key (`get_batch`), the values of the leading run of
    hits (`get_prefix`) or its length (`contains_batch`, `contains_async`)."""
    if path in ("get", "get_async", "get_sync"):
        return values[0]
    if path == "contains":
        return values[0] is not None
    if path == "get_batch":
        return list(values)
    run = []
    for v in values:
        if v is None:
            break
        run.append(v)
    if path == "get_prefix":
        return run
    if path in ("contains_batch", "contains_async"):
        return len(run)
    raise ValueError(f"unknown read path {path!r} (known: {', '.join(READ_PATHS + WRITE_PATHS)})")


@attrs.define
class Op:
    """One call: `completed is None` means it never completed; `error` names an exception it raised. `client`: which
    client of the same server made it; `server`: a delete no client made, the server's own eviction of the key."""

    id: int
    caller: str
    path: str
    keys: tuple[str, ...]
    value: bytes | None = None
    invoked: float = 0.0
    completed: float | None = None
    result: Any = None
    error: str | None = None
    completions: int = 0
    client: int = 0
    server: bool = False
    #: Seconds of [invoked, completed] the machine kept the harness and the subject off the CPU (`model.timing`).
    stolen: float = 0.0

    @property
    def key(self) -> str:
        return self.keys[0]

    @property
    def pending(self) -> bool:
        return self.completed is None

    def label(self) -> str:
        via = " (the server)" if self.server else f" (client {self.client})" if self.client else ""
        return f"op {self.id} {self.caller}{via}: {self.call()}"

    def call(self) -> str:
        """The call as written: `path(key)`, `path([k1,k2])`, `put(key, N bytes)`; the server's eviction `evict(key)`."""
        args = self.keys[0] if len(self.keys) == 1 else "[" + ",".join(self.keys) + "]"
        if self.value is not None:
            args += f", {len(self.value)} bytes"
        return f"{'evict' if self.server else self.path}({args})"

    def outcome(self) -> str:
        """What the caller got, short: `-> None`, `-> 21 bytes 'k0|t1.0|'...`, `-> True`, `raised ...`, `never
        completed`."""
        if self.pending:
            return "never completed" + (f" ({self.error})" if self.error else "")
        if self.error is not None:
            return f"raised {self.error}"
        if self.path in WRITE_PATHS:
            return "-> ok"
        return "-> " + short_value(self.result)

    def to_json(self) -> dict:
        res = self.result
        if isinstance(res, (bytes, bytearray)):
            res = {"$hex": bytes(res).hex()}
        elif isinstance(res, list):
            res = [{"$hex": bytes(r).hex()} if isinstance(r, (bytes, bytearray)) else r for r in res]
        return {"id": self.id, "caller": self.caller, "path": self.path, "keys": list(self.keys),
                "value": None if self.value is None else bytes(self.value).hex(), "invoked": self.invoked,
                "completed": self.completed, "result": res, "error": self.error, "completions": self.completions,
                **({"client": self.client} if self.client else {}), **({"server": True} if self.server else {}),
                **({"stolen": round(self.stolen, 4)} if self.stolen else {})}

    @classmethod
    def from_json(cls, d: dict) -> "Op":
        def unhex(r: Any) -> Any:
            if isinstance(r, dict) and "$hex" in r:
                return bytes.fromhex(r["$hex"])
            if isinstance(r, list):
                return [unhex(x) for x in r]
            return r
        return cls(id=int(d["id"]), caller=str(d["caller"]), path=str(d["path"]), keys=tuple(d["keys"]),
                   value=None if d.get("value") is None else bytes.fromhex(d["value"]),
                   invoked=float(d["invoked"]), completed=None if d.get("completed") is None else float(d["completed"]),
                   result=unhex(d.get("result")), error=d.get("error"), completions=int(d.get("completions", 1)),
                   client=int(d.get("client", 0)), server=bool(d.get("server", False)),
                   stolen=float(d.get("stolen", 0.0)))


@attrs.define
class History:
    """The ops of one run, in id order; `faults`: the real-server faults struck during it (kind, rank, when it
    struck, when it was over, what the recovery probe found), each key's loss as ops of `FAULT_PATHS`."""

    ops: list[Op] = attrs.field(factory=list)
    faults: list[dict] = attrs.field(factory=list)

    def pending(self) -> list[Op]:
        return [op for op in self.ops if op.pending]

    def to_json(self) -> list[dict]:
        return [op.to_json() for op in self.ops]

    @classmethod
    def from_json(cls, data: Iterable[dict]) -> "History":
        return cls([Op.from_json(d) for d in data])


class KVModel:
    """The sequential key-value register, over a fixed tuple of keys: a state is a tuple of values (bytes or None)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = tuple(keys)
        self.index = {k: i for i, k in enumerate(self.keys)}

    def init(self) -> tuple:
        return (None,) * len(self.keys)

    @staticmethod
    def register_view(op: Op) -> tuple[str, Any] | None:
        """What a single-key `op` does to its register (see `Model.register_view`); None for a multi-key op or an
        unknown path. A read that never answered or failed is a read of anything: ("read", op) never matches, so
        callers drop such reads first (they constrain nothing)."""
        if len(op.keys) != 1:
            return None
        path = op.path
        if path == "put":
            v = op.value
            return ("write", v if type(v) is bytes else b"" if v is None else bytes(v))
        if path in _GETS:
            res = op.result
            if res is None or type(res) is bytes:
                return ("read", res)
            return ("read", bytes(res)) if isinstance(res, bytearray) else ("read", ("$malformed", repr(res)))
        if path == "delete":
            return _DELETE_VIEW
        if path == "contains":
            if op.result == True:  # noqa: E712 -- as `step` compares: 1 is True there too
                return _ANY_VIEW
            return ("read", None) if op.result == False else ("read", ("$malformed", repr(op.result)))  # noqa: E712
        return None

    def step(self, state: tuple, op: Op) -> tuple[bool, tuple]:
        """Whether `op` (with its recorded result) is legal in `state`, and the state after it."""
        path = op.path
        if path in WRITE_PATHS:
            i = self.index[op.key]
            new = list(state)
            new[i] = bytes(op.value) if path == "put" else None
            return True, tuple(new)
        if op.pending or op.error is not None:
            return True, state  # a read that never answered (or failed) constrains nothing
        return self.answer(state, op.path, op.keys) == op.result, state

    def answer(self, state: tuple, path: str, keys: Sequence[str]) -> Any:
        """What a correct client answers to the read `path` of `keys` in `state`."""
        return answer(path, [state[self.index[k]] for k in keys])


def wrong_key(keys: Sequence[str], got: Any, expected: Any, held: Mapping[str, Iterable[bytes]]) -> tuple[str, str] | None:
    """Whether a value read of `keys` that answered `got` instead of `expected` answered, for one key `k`, a
    value put for another key `k2` and never for `k` (`held`: every value each key was ever put): `(k, k2)`, or
    None. A stale value of the key itself, or bytes nobody put, is no wrong key."""
    if isinstance(got, (bytes, bytearray)) or got is None:
        pairs = [(keys[0], got, expected)] if len(keys) == 1 else []
    elif isinstance(got, (list, tuple)) and isinstance(expected, list):
        pairs = list(zip(keys, got, expected + [None] * (len(got) - len(expected))))
    else:
        return None
    for key, value, want in pairs:
        if value is None or value == want or not isinstance(value, (bytes, bytearray)):
            continue
        value = bytes(value)
        if value in set(held.get(key, ())):
            continue
        for other, values in held.items():
            if other != key and value in set(values):
                return key, other
    return None



#: What `KVModel.register_view` answers for a read that only says the key holds some value (`contains` True).
READ_ANY = "read-any"
_GETS = frozenset(("get", "get_async", "get_sync"))
_DELETE_VIEW = ("write", None)
_ANY_VIEW = (READ_ANY, None)


def _describe_value(v: Any) -> str:
    if isinstance(v, (bytes, bytearray)):
        b = bytes(v)
        return repr(b if len(b) <= 24 else b[:24] + b"...")
    return repr(v)


@attrs.frozen
class Model:
    """A sequential specification, for the linearizability checker (`checking.linearizability.check`).

    `init(keys)`: the state of the part of a history over `keys` before any op; `step(keys, state, op)`: whether
    the op, with its recorded result, is legal in `state` of the part over `keys`, and the state after it; `equal(a, b)`: whether two
    states are the same (the search's memo; states must also hash alike when equal); `describe_op(op)` and
    `describe_state(state)`: text for a picture or a report. Optional `register_view(op)`: for a model that is
    one register per key, what the op does to its key's register: ("write", value) (None: the key deleted),
    ("read", value) (None: a miss), (`READ_ANY`, None) (the key holds some value), or None when the op is
    outside that form; with it the checker decides unique-value parts without search. Optional `split(ops)`:
    the ops with every multi-key op cut into what it says about each key, when the specification is one
    independent object per key (the checker then judges each key's part separately)."""

    name: str
    init: Callable[[Sequence[str]], Any]
    step: Callable[[tuple[str, ...], Any, Op], tuple[bool, Any]]
    equal: Callable[[Any, Any], bool] = lambda a, b: a == b
    describe_op: Callable[[Op], str] = lambda op: op.label()
    describe_state: Callable[[Any], str] = repr
    register_view: Callable[[Op], tuple[str, Any] | None] | None = None
    split: Callable[[Sequence[Op]], list[Op]] | None = None


def lanes(history: History, *, verdict: dict | None = None) -> dict:
    """A plain data form of `history` for a picture: one lane per caller with its op intervals (label: the call;
    outcome: what the caller got; pending ones flagged, `end` None), and for a linearizability violation the longest linearizable prefix and the op that
    cannot be placed (from `verdict`, as `checking.linearizability.check` reports it)."""
    by_caller: dict[str, list[dict]] = {}
    t0 = min((op.invoked for op in history.ops), default=0.0)
    for op in sorted(history.ops, key=lambda o: o.invoked):
        by_caller.setdefault(op.caller, []).append({
            "op": op.id, "label": op.label(), "outcome": op.outcome(), "start": op.invoked - t0,
            "end": None if op.pending else op.completed - t0, "pending": op.pending, "error": op.error})
    out: dict = {"lanes": [{"caller": c, "ops": ops} for c, ops in sorted(by_caller.items())],
                 "pending": [op.id for op in history.ops if op.pending]}
    if verdict and verdict.get("linearizable") is False:
        out["linearizable_prefix"] = list(verdict.get("prefix", []))
        out["unplaceable"] = verdict.get("unplaceable")
    return out



def split_per_key(ops: Sequence[Op]) -> list[Op]:
    """`ops` with every multi-key read split into single-key reads (same id, caller and interval): `get_batch`
    each value; `get_prefix` / `contains_batch` / `contains_async` the hits of the leading run, then a miss of
    the key after it. A multi-key read that never answered (or failed) constrains nothing and is left out; a
    malformed answer becomes a read of its first key that no state answers."""
    out: list[Op] = []
    for op in ops:
        if len(op.keys) == 1 or op.path in WRITE_PATHS:
            out.append(op)
            continue
        if op.pending or op.error is not None:
            continue
        res = op.result
        if op.path == "get_batch":
            parts = [("get", k, v) for k, v in zip(op.keys, res if isinstance(res, list) else [])]
            if not isinstance(res, list) or len(res) != len(op.keys):
                parts = [("get", op.keys[0], ("$malformed", repr(res)))]
        else:
            hits = len(res) if isinstance(res, list) else res if isinstance(res, int) else -1
            if not 0 <= hits <= len(op.keys):
                parts = [("get", op.keys[0], ("$malformed", repr(res)))]
            elif op.path == "get_prefix":
                parts = [("get", k, v) for k, v in zip(op.keys, res)]
            else:
                parts = [("contains", k, True) for k in op.keys[:hits]]
            if 0 <= hits < len(op.keys):
                parts.append(("contains", op.keys[hits], False))
        for path, key, result in parts:
            out.append(Op(op.id, op.caller, path, (key,), op.value, op.invoked, op.completed, result, op.error,
                          op.completions))
    return out


_KV_BY_KEYS: dict[tuple[str, ...], KVModel] = {}


def _kv_init(keys: Sequence[str]) -> tuple:
    return (None,) * len(keys)


def _kv_step(keys: tuple[str, ...], state: tuple, op: Op) -> tuple[bool, tuple]:
    if len(keys) == 1:  # the common case (a part per key): no index
        path = op.path
        if path == "put":
            return True, (bytes(op.value),)
        if path == "delete":
            return True, (None,)
        if op.completed is None or op.error is not None:  # (op.pending, without the property call)
            return True, state
        if path == "contains":
            return (state[0] is not None) == op.result, state
        if path in ("get", "get_async", "get_sync"):
            return state[0] == op.result, state
    kv = _KV_BY_KEYS.get(keys)
    if kv is None:
        kv = _KV_BY_KEYS.setdefault(tuple(keys), KVModel(keys))
    return kv.step(state, op)


def _kv_describe_state(state: tuple) -> str:
    return "(" + ", ".join(_describe_value(v) for v in state) + ")"


#: The key-value register per key (`KVModel`) as a `Model` record: a state is a tuple of values, one per key of
#: the part (in the part's key order).
KV_MODEL = Model("kv-register", init=_kv_init, step=_kv_step, describe_state=_kv_describe_state,
                 register_view=KVModel.register_view, split=split_per_key)


# -- the register through real-server faults (the nemesis) -------------------------------------------------------
class _Maybe(tuple):
    """A register that may have lost its value (`fault-lose`): (value, until), until = when the loss was over."""

    __slots__ = ()


def _lossy_init(keys: Sequence[str]) -> tuple:
    return (None,) * len(keys), (None,) * len(keys)


def _lossy_step(keys: tuple[str, ...], state: tuple, op: Op) -> tuple[bool, tuple]:
    """`_kv_step` plus the nemesis's ops of `FAULT_PATHS` (see `LOSSY_KV_MODEL`); a state is (values, saved)."""
    values, saved = state
    path = op.path
    if path in WRITE_PATHS + FAULT_PATHS:
        i = keys.index(op.key)
        new, keep = list(values), list(saved)
        if path == "put":
            new[i] = bytes(op.value)
        elif path in ("delete", "fault-wipe"):
            new[i] = None
        elif path == "fault-save":
            keep[i] = values[i]
        elif path == "fault-restore":
            new[i] = saved[i]
        elif values[i] is not None:  # fault-lose
            value = values[i][0] if isinstance(values[i], _Maybe) else values[i]
            new[i] = _Maybe((value, op.completed if op.completed is not None else float("inf")))
        return True, (tuple(new), tuple(keep))
    if op.pending or op.error is not None:
        return True, state
    maybes = [i for i, k in enumerate(keys) if k in op.keys and isinstance(values[i], _Maybe)]
    for gone in range(1 << len(maybes)):  # which maybes are gone, as this read sees them
        seen = list(values)
        for j, i in enumerate(maybes):
            seen[i] = None if gone >> j & 1 else values[i][0]
        if KVModel(keys).answer(tuple(seen), op.path, op.keys) == op.result:
            settled = list(values)
            for j, i in enumerate(maybes):
                if gone >> j & 1:
                    settled[i] = None
                elif op.invoked > values[i][1]:
                    settled[i] = values[i][0]
            return True, (tuple(settled), saved)
    return False, state


#: The key-value register through real-server faults: `KV_MODEL` plus the nemesis's ops of `FAULT_PATHS` (what each
#: fault did to a key). `saved` is what the last `fault-save` held and `fault-restore` puts it back (a restart with data
#: allows exactly what the snapshot held); `fault-lose` makes a value a maybe: a read may answer it or a miss, a miss
#: settles it as gone, and a read of the value invoked after the loss was over settles it as kept. No register view:
#: every part goes to the search.
LOSSY_KV_MODEL = Model("kv-register-through-faults", init=_lossy_init, step=_lossy_step,
                       describe_state=lambda s: "(" + ", ".join(_describe_value(v) for v in s[0]) + ")",
                       split=split_per_key)
