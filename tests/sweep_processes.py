"""Every reference protocol on the process runner and the simulator, every single fault at 1-4 ranks x 0-6
chunks: `python -m tests.sweep_processes` prints per protocol the cases, how many held, and how many of the
comparable ones matched the simulator (verdict and every rank's chunks). Used for the README's claims table;
about 6 minutes on 2 cores. Not a test (pytest does not collect it): a measurement."""
import json
import time

from adapters.processes import ProcessRunner
from model.faults import Eviction, FaultPlan
from model.harness import run_case
from model.outcome import Case
from model.protocols import REFERENCE_PROTOCOLS


def plans(n, k):
    """(fault plan, whether the simulator's outcome is comparable): an eviction during the load happens at the
    evicted rank's own step here, at a global step in the simulator."""
    yield FaultPlan(), True
    for c in range(k):
        yield FaultPlan(evict_before_lookup=[Eviction(c)]), True
        yield FaultPlan(evict_after_lookup=[Eviction(c)]), True
        for step in (0, 1, 2):
            yield FaultPlan(evict_during_load=[Eviction(c, None, step)]), False
    for r in range(n):
        yield FaultPlan(lost=[(r, 0)]), True
        yield FaultPlan(delayed=[(r, 0, 2.0)]), True


def _chunks(outcome):
    return {r: sorted(v) for r, v in outcome.results.items()}


def main() -> None:
    start, stats = time.monotonic(), {}
    with ProcessRunner() as runner:
        for name, cls in sorted(REFERENCE_PROTOCOLS.items()):
            protocol, row = cls(), {"cases": 0, "held": 0, "comparable": 0, "same_as_sim": 0}
            for n in (1, 2, 3, 4):
                for k in range(7):
                    for plan, comparable in plans(n, k):
                        case = Case(n, k, faults=plan)
                        out, sim = runner.run(protocol, case), run_case(protocol, case)
                        row["cases"] += 1
                        row["held"] += not out.violations
                        row["comparable"] += comparable
                        row["same_as_sim"] += comparable and out.violated() == sim.violated() and \
                            _chunks(out) == _chunks(sim)
                        if out.violations:
                            print(name, case, out.violations)
            stats[name] = row
    print(json.dumps(stats), round(time.monotonic() - start, 1))


if __name__ == "__main__":
    main()
