"""The judge of a concurrent run's history (`checking.concurrency.run_layout`), its checks in this order:

- `lost-completion`: an op never completed (named);
- `double-completion`: an op's completion was delivered more than once;
- `wrong-caller`, `wrong-key`, `store-roundtrip`: a read answered with a value not its key's (every put writes
  a value tagged with its key, caller and position): the reply to another caller's concurrent read of the key
  that value was put for (a crossed reply), a value put for another key that no other caller was reading
  (a deterministic wrong key), or bytes no put wrote;
- `store-error`: a call raised;
- `linearizability`: the history is not linearizable against the key-value register (`checking.linearizability`).

Through real-server faults (`History.faults`) the same checks are `fault-hang`, `fault-integrity` and `recovery`.
"""
from __future__ import annotations

import attrs

from checking.linearizability import check
from model.codec import preview
from model.history import KV_MODEL, LOSSY_KV_MODEL, NEMESIS_CALLER, VALUE_READS, WRITE_PATHS, History, Op
from model.outcome import Violation
from model.timing import allowance, over_text

__all__ = ["judge"]


def _violation(prop: str, op: int | None, summary: str) -> Violation:
    return Violation(prop, summary, {"op": op})  # (about op `op`, its id in the history; None: about the run)


def judge(history: History, *, max_states: int = 500_000) -> tuple[list[Violation], dict]:
    """The violations of a history (see the module docstring) and the linearizability verdict as data. Through
    real-server faults (`History.faults`): an op never completed, or one that took longer than its bound, is
    `fault-hang`; an error or a miss while a fault lasted or within the recovery bound after it is fine (it
    constrains nothing), an error after that is `recovery`, as is a failed recovery probe; a wrong answer is
    `fault-integrity`, judged against the register the faults allow (`model.history.LOSSY_KV_MODEL`)."""
    out: list[Violation] = []
    faults = history.faults
    window = (min(f["struck"] for f in faults), max(f["healed"] for f in faults),
              max(f["healed"] + f["recovery_seconds"] for f in faults)) if faults else None
    for op in history.ops:
        if op.pending:
            why = op.error or "no completion within the run's bound"
            out.append(_violation("fault-hang" if faults else "lost-completion", op.id,
                                  f"{op.label()} never completed ({why})" + _during(faults)))
        elif faults and op.caller != NEMESIS_CALLER and \
                op.completed - op.invoked - op.stolen > allowance(faults[0]["op_timeout"]):
            took = op.completed - op.invoked
            out.append(_violation("fault-hang", op.id,
                                  f"{op.label()} did not return within "
                                  f"{over_text(faults[0]['op_timeout'], took, op.stolen)}" + _during(faults)))
    for op in history.ops:
        if op.completions > 1:
            out.append(_violation("double-completion", op.id, f"{op.label()} was completed {op.completions} times"))
    for v in _foreign_values(history):  # through faults every wrong value is the one property
        out.append(_violation("fault-integrity", v.detail["op"], f"{v.summary} ({v.property})" + _during(faults))
                   if faults else v)
    for f in faults:
        if "not_recovered" in f:
            out.append(_violation("recovery", None,
                                  f"{f['recovery_seconds']:g} s after the server was back from {f['fault']} the client "
                                  f"still fails: {f['not_recovered']}"))
            break
    for op in history.ops:
        if op.error and not op.pending:
            if window is not None and op.invoked <= window[2]:
                continue  # an error while a fault lasts, or before the client had its bound to recover, is fine
            out.append(_violation("recovery" if faults else "store-error", op.id,
                                  f"{op.label()} raised {op.error}"
                                  + (" after the client should have recovered" if faults else "")))
    ops = [_unconstrained_miss(op) if window and op.invoked <= window[2] else op for op in history.ops]
    verdict = check(ops, LOSSY_KV_MODEL if faults else KV_MODEL, max_states=max_states).to_json()
    if verdict["linearizable"] is False:
        bad = next(o for o in history.ops if o.id == verdict["unplaceable"])
        out.append(_violation("fault-integrity" if faults else "linearizability", bad.id,
                              f"not linearizable on {', '.join(verdict['keys'])}: after {len(verdict['prefix'])} "
                              f"op(s) in order, {bad.label()} -> {preview(bad.result, 24)} cannot be placed"
                              + _during(faults)))
    return out, verdict


def _during(faults: list[dict]) -> str:
    return f" (through {', '.join(sorted({f['fault'] for f in faults}))})" if faults else ""


def _unconstrained_miss(op: Op) -> Op:
    """A read invoked while a fault lasted (or within the recovery bound after it) that answered a miss (any part of
    it): it constrains nothing."""
    res = op.result
    missed = (res is None or res is False or (isinstance(res, list) and (None in res or len(res) < len(op.keys)))
              or (isinstance(res, int) and not isinstance(res, bool) and res < len(op.keys)))
    if op.path in WRITE_PATHS or op.pending or op.error or not missed:
        return op
    return attrs.evolve(op, error="a miss while a fault lasted")


def _overlap(a: Op, b: Op) -> bool:
    """Whether two ops' intervals overlap (a pending op never ends)."""
    a_end = float("inf") if a.completed is None else a.completed
    b_end = float("inf") if b.completed is None else b.completed
    return a.invoked <= b_end and b.invoked <= a_end


def _foreign_values(history: History) -> list[Violation]:
    """Reads answered with a value that is not their key's: bytes no put wrote (`store-roundtrip`), the reply to
    another caller's concurrent read of the key that value was put for (`wrong-caller`), or else a value put for
    another key (`wrong-key`: no other caller was reading that key, so no reply was crossed)."""
    puts = {bytes(op.value): op for op in history.ops if op.path == "put" and op.value is not None}
    out = []
    for op in history.ops:
        if op.pending or op.error or op.path not in VALUE_READS:
            continue
        values = op.result if isinstance(op.result, list) else [op.result]
        for key, value in zip(op.keys, values):
            if not isinstance(value, (bytes, bytearray)):
                continue
            put = puts.get(bytes(value))
            if put is None:
                out.append(_violation("store-roundtrip", op.id,
                                      f"{op.label()} answered {key} with {len(value)} bytes that no put wrote "
                                      f"({preview(value, 24)})"))
                break
            if put.key == key:
                continue
            crossed = next((o for o in history.ops if o.caller != op.caller and o.path in VALUE_READS
                            and put.key in o.keys and _overlap(o, op)), None)
            if crossed is not None:
                out.append(_violation("wrong-caller", op.id,
                                      f"{op.label()} was answered with the reply to {crossed.label()} (a value put "
                                      f"for {put.key} by op {put.id})"))
            else:
                out.append(_violation("wrong-key", op.id,
                                      f"{op.label()} answered {key} with the value put for {put.key} "
                                      f"({put.label()}); no other caller was reading {put.key} meanwhile"))
            break
    return out
