"""What both property machines share: one exception class per property, how a failure is raised and reported
(Hypothesis notes and events, traces written under the found directory), and the step counters."""
from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

from hypothesis import event as _hyp_event, note as _hyp_note
from hypothesis.control import current_build_context
from hypothesis.errors import InvalidArgument

from model.checks import ENGINE_LAYER, NEMESIS_PROPERTIES, PROPERTIES, STORE_PROPERTIES
from model.outcome import Violation
from model.trace import Trace

__all__ = ["RULE_STEPS", "PATH_CALLS", "PropertyViolated", "VIOLATED", "raise_violations", "violated_properties",
           "final_run", "note", "event", "write_found"]

#: Rule executions per layer (`properties.layer_rates` reads it).
RULE_STEPS: collections.Counter = collections.Counter()
#: Store-client calls per path (`get`, `get_async`, `get_batch`, ...) the store layer made (check's coverage).
PATH_CALLS: collections.Counter = collections.Counter()



class PropertyViolated(AssertionError):
    """A property of the contract did not hold; `property` names it."""

    property: str = ""


def _class_name(prop: str) -> str:
    return "".join(part.capitalize() for part in re.split(r"[^a-zA-Z0-9]+", prop)) + "Violated"


#: One exception class per property, so that Hypothesis tells distinct failures apart.
VIOLATED: dict[str, type[PropertyViolated]] = {}
for _prop in (*PROPERTIES, *STORE_PROPERTIES, *ENGINE_LAYER, *NEMESIS_PROPERTIES, "replay"):
    _cls = type(_class_name(_prop), (PropertyViolated,), {"property": _prop, "__module__": "properties.machines"})
    VIOLATED[_prop] = globals()[_cls.__name__] = _cls


def _violation_error(v: Violation) -> PropertyViolated:
    cls = VIOLATED.get(v.property) or type(_class_name(v.property), (PropertyViolated,), {"property": v.property})
    return cls(f"{v.property}: {v.summary}")


def raise_violations(violations: list[Violation], context: str) -> None:
    """Raise the violations: one exception, or a group of one per distinct property."""
    first: dict[str, Violation] = {}
    for v in violations:
        first.setdefault(v.property, v)
    errors = [_violation_error(v) for v in first.values()]
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ExceptionGroup(f"{context}: violated {', '.join(first)}", errors)


def violated_properties(exc: BaseException) -> set[str]:
    """The property names carried by `exc` (a `PropertyViolated` or a group holding some)."""
    if isinstance(exc, BaseExceptionGroup):
        return set().union(*(violated_properties(e) for e in exc.exceptions))
    return {exc.property} if isinstance(exc, PropertyViolated) else set()


def final_run() -> bool:
    """Whether this is the run Hypothesis reports (or a run outside Hypothesis, e.g. a pasted program)."""
    return current_build_context().is_final if _in_hypothesis() else True


def _in_hypothesis() -> bool:
    try:
        current_build_context()
    except InvalidArgument:
        return False
    return True


def note(text: str) -> None:
    """Hypothesis's `note` inside a test; printed when a program runs outside one (a pasted failing program)."""
    if _in_hypothesis():
        _hyp_note(text)
    else:
        print(text)


def event(text: str) -> None:
    """Hypothesis's `event` (statistics) inside a test; nothing outside one."""
    if _in_hypothesis():
        _hyp_event(text)


def write_found(trace: Trace, cfg: Any, *parts: str) -> Path | str:
    """Hand a failure's trace over: into the run config's `found` list when it collects them in memory (`check`'s
    Hypothesis engine), else saved under its `found_dir` (`Trace.save_unique`: named by content, never overwriting).
    Returns where it went (a path, or "kept in memory")."""
    if cfg.found is not None:
        cfg.found.append(trace)
        return "kept in memory"
    source = _source(trace, cfg)
    if source is not None:  # (as `check` records it: a replay on the unchanged subject is never `fixed`)
        trace.config["source"] = source
    return trace.save_unique(cfg.found_dir, *parts)


def _source(trace: Trace, cfg: Any) -> str | None:
    """The digest of the source of the subject `cfg` runs (`checking.layers.Layer.source`), for `trace`'s layer."""
    from checking.layers import LAYERS
    layer = LAYERS.get(trace.kind)
    if layer is None:
        return None
    if layer.subject == "engine":
        return layer.source(engine=cfg.engine)
    return layer.source(client=cfg.resolved_client(),
                        protocol=cfg.resolved_protocol() if layer.subject == "protocol" else None)


