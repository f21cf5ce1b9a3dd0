"""Judging a sequential store-ops run through real-server faults (`checking.storeops.run_ops`).

A fault is an op of the sequence: `{"op": "fault", "fault": FIELD, "rank", "seconds"}` strikes the kind of
`model.faults.SERVER_KINDS` named by its `FaultPlan` field through the run's `ServerControl`; `{"op": "recover"}`
waits until the servers are back and runs the `recovery` probe (`model.recovery`) on every rank struck since the
last one (an implicit one ends a run that struck). Between a fault and its recovery (the window):

- an error is fine; a put or delete that raised may or may not have happened (both answers are allowed after);
- a miss is fine; any other answer must be the oracle's (`fault-integrity`: never another key's bytes, never a value
  from before a delete);
- a call that does not return within its bound is `fault-hang`.

A fault that loses data (`kind.loses`: "all" of the rank's keys, "any" key) lets every key the rank held read as a
miss afterwards, until it is written again; "snapshot" (a restart with the data SAVE wrote at the strike) keeps
every completed write of a sequential run. After the recovery, a miss of a key the server still holds is
`recovery` (the client answers from a broken state), a wrong value `fault-integrity`.
"""
from __future__ import annotations

from typing import Any, Sequence

from model.codec import preview
from model.contract import StoreCallTimeout
from model.faults import ServerFault, kind_of
from model.outcome import Violation
from model.recovery import default_recovery_seconds, probe

__all__ = ["FAULT_OPS", "FaultWindow", "fault_op"]

#: The ops of a store-ops sequence that are no client call.
FAULT_OPS = ("fault", "recover")


def fault_op(field: str, rank: int, seconds: float = 0.0) -> dict:
    """The store-ops op that strikes the real-server fault `field` on `rank`'s server for `seconds`."""
    return {"op": "fault", "fault": field, "rank": rank, "seconds": seconds}


class FaultWindow:
    """The faults of one sequential run and what they allow (see the module doc)."""

    def __init__(self, stores: Sequence[Any], oracle: Sequence[dict], *, control: Any, op_timeout: float,
                 recovery_seconds: float | None) -> None:
        self.stores, self.oracle, self.control = stores, oracle, control
        self.op_timeout = op_timeout
        self.recovery_seconds = default_recovery_seconds(op_timeout) if recovery_seconds is None else recovery_seconds
        self.struck: list[tuple[Any, ServerFault]] = []
        self.faulted = False
        self.maybe: dict[tuple[int, str], list] = {}
        self.owners: dict[bytes, str] = {}  # every value put, by the key it was put under

    def what(self) -> str:
        return "; ".join(kind.text(f) for kind, f in self.struck) or "no fault"

    # -- fault ops -----------------------------------------------------------------------------------------
    def fault_op(self, i: int, op: dict, rec: dict) -> Violation | None:
        if op["op"] == "recover":
            return self._recover(i, rec)
        try:
            kind = kind_of(op.get("fault", ""))
        except KeyError:
            raise ValueError(f"ops[{i}]: unknown fault {op.get('fault')!r}") from None
        if kind.family != "server":
            raise ValueError(f"ops[{i}]: {kind.field} is not a real-server fault")
        fault = kind.from_json({"rank": op.get("rank"), "at": "op", "seconds": op.get("seconds", 0.0)})
        if not 0 <= fault.rank < len(self.stores):
            raise ValueError(f"ops[{i}]: rank {fault.rank} is not one of the {len(self.stores)} stores")
        if self.control is None:
            raise ValueError(f"ops[{i}]: {kind.text(fault)} needs a nemesis (servers shardcheck started)")
        kind.strike(self.control, fault)
        if kind.loses in ("all", "any"):
            for key in self.oracle[fault.rank]:
                self.maybe.setdefault((fault.rank, key), []).append(None)
        self.struck.append((kind, fault))
        self.faulted = True
        rec["outcome"] = "struck"
        return None

    def _recover(self, i: int, rec: dict) -> Violation | None:
        if not self.struck:
            rec["outcome"] = "nothing to recover from"
            return None
        healed = self.control.healed(max(f.seconds for _, f in self.struck) + 10.0)
        if healed is None:
            raise RuntimeError(f"ops[{i}]: the nemesis could not end {self.what()}")
        rec["recovered"] = {}
        for r in sorted({f.rank for _, f in self.struck}):
            p = probe(self.stores[r], healed_at=healed, recovery_seconds=self.recovery_seconds,
                      op_timeout=self.op_timeout)
            if not p.ok:
                return Violation("recovery", f"ops[{i}] rank {r}: {self.recovery_seconds:g} s after the server was "
                                 f"back from ({self.what()}) the client still fails ({p.attempts} attempts): {p.why}",
                                 {"index": i, "rank": r, "attempts": p.attempts})
            rec["recovered"][str(r)] = p.seconds
        self.struck = []
        rec["outcome"] = "recovered"
        return None

    def close(self, i: int) -> Violation | None:
        """The implicit recovery at the end of a run that struck."""
        return self._recover(i, {})

    # -- the client's answers ------------------------------------------------------------------------------

    def timed_out(self, i: int, r: int, exc: StoreCallTimeout, op: dict | None = None) -> Violation:
        detail = {"index": i, "op": exc.op, "key": exc.key, "seconds": exc.seconds}
        if op is not None and "key" in op:  # whether the server held the key (a missing one may hang for its own reasons)
            detail["present"] = op["key"] in self.oracle[r]
        if self.struck:
            return Violation("fault-hang", f"ops[{i}] rank {r} while {self.what()}: {exc}", detail)
        return Violation("store-hang", f"ops[{i}] rank {r}: {exc}", detail)

    def raised(self, i: int, r: int, op: dict, exc: Exception) -> Violation | None:
        if op["op"] == "put":
            self.owners.setdefault(bytes(op["value"]), op["key"])
        if not self.struck:
            return Violation("store-error", f"ops[{i}] rank {r}: {op['op']}({op.get('key', op.get('keys'))!r})"
                             f" raised {type(exc).__name__}: {exc}", {"index": i})
        if op["op"] in ("put", "delete"):  # it may have happened all the same (the oracle kept the value before)
            self.maybe.setdefault((r, op["key"]), []).append(bytes(op["value"]) if op["op"] == "put" else None)
        return None

    def settled(self, r: int, op: dict) -> None:
        """A put or delete that completed (the oracle has it): its key's value is certain again."""
        if op["op"] == "put":
            self.owners.setdefault(bytes(op["value"]), op["key"])
        if op["op"] in ("put", "delete"):
            self.maybe.pop((r, op["key"]), None)

    def answered(self, i: int, r: int, op: dict, got: Any, expected: Any) -> Violation | None:
        """None when `got` is allowed under the run's faults (the oracle follows what it shows), else the violation."""
        keys = op.get("keys") or [op["key"]]
        gots, wants = (got, expected) if op["op"] == "get_batch" else ([got], [expected])
        if not isinstance(gots, list) or len(gots) != len(wants):
            return self._wrong(i, r, op, got, expected)
        for key, g, want in zip(keys, gots, wants):
            if g == want:
                continue
            alternatives = self.maybe.get((r, key), [])
            if op["op"] == "contains":
                allowed = [want, *(v is not None for v in alternatives)] + ([False] if self.struck else [])
            else:
                allowed = [want, *alternatives] + ([None] if self.struck else [])
            if g not in allowed:
                return self._wrong(i, r, op, got, expected)
            if not self.struck:  # what the read showed is what the store holds now
                shown = next(v for v in alternatives if (v is not None) == bool(g)) if op["op"] == "contains" else g
                self._set(r, key, shown)
        return None

    def _set(self, r: int, key: str, value: Any) -> None:
        if value is None:
            self.oracle[r].pop(key, None)
        else:
            self.oracle[r][key] = value
        self.maybe.pop((r, key), None)

    def _wrong(self, i: int, r: int, op: dict, got: Any, expected: Any) -> Violation:
        what = f"ops[{i}] rank {r}: {op['op']}({op.get('key', op.get('keys'))!r}) returned {preview(got)}, the oracle " \
               f"{preview(expected)}"
        if not self.faulted:
            return Violation("store-roundtrip", what, {"index": i})
        wrong = [g for g in (got if isinstance(got, list) else [got]) if g not in (None, False, True)]
        if wrong or self.struck or op["op"] == "contains" and got is True:
            whose = [self.owners.get(bytes(g)) for g in wrong if isinstance(g, (bytes, bytearray))]
            named = "".join(f"; {preview(g)} are the bytes put under {w!r}" + (" before" if w in (op.get("keys") or
                            [op.get("key")]) else "") for g, w in zip(wrong, whose) if w is not None)
            owners = [w for w in whose if w is not None]
            return Violation("fault-integrity", f"{what}{named} ({'while ' + self.what() if self.struck else 'after a fault'})",
                             {"index": i, "owner": owners[0] if owners else None})
        return Violation("recovery", f"{what}: after the recovery the client still answers a miss for a key its "
                         "server holds", {"index": i})
