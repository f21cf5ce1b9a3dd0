"""The two property layers as Hypothesis state machines.

- `ProtocolMachine`: stores prompts, evicts, looks up, starts loads, moves one rank at a time and injects
  faults; every finished episode is checked with `model.checks.check_outcome` (all the contract's properties);
  with the in-memory client a failing episode must also replay under `model.harness.run_case` to the same
  verdict (else the failure is `replay`: the stepping is wrong).
- `StoreMachine`: drives one client's `RankStore`s (put, get, contains, delete, get_async, wait, get_batch)
  against an in-memory oracle, every call bounded in time.

Both read their protocol and client from `properties.config.current()` (set by the pytest plugin's
`--protocol` / `--client`). A failure raises one `<Property>Violated` exception per violated property (an
`ExceptionGroup` of them when several are), so Hypothesis shrinks each distinct failure on its own; the final
(minimal) failing run also writes a `model.trace.Trace` under the configured `found_dir`.

The program Hypothesis prints for a failure runs as-is after `from properties.machines import *`.
"""
from __future__ import annotations

from properties.protocol_machine import ProtocolMachine
from properties.reporting import (PATH_CALLS, RULE_STEPS, VIOLATED, PropertyViolated, raise_violations,
                                  violated_properties, write_found)
from properties.store_machine import Pending, StoreMachine
from model.checks import STORE_PROPERTIES

__all__ = ["ProtocolMachine", "StoreMachine", "Pending", "PropertyViolated", "STORE_PROPERTIES", "RULE_STEPS",
           "PATH_CALLS", "VIOLATED", "raise_violations", "violated_properties", "write_found"]

# one name per property's exception class (`SoundnessViolated`, ...), as Hypothesis prints them
globals().update({cls.__name__: cls for cls in VIOLATED.values()})
__all__ += [cls.__name__ for cls in VIOLATED.values()]
