"""Every reference protocol on the process runner and the simulator, every single fault at 1-4 ranks x 0-6
chunks: `python -m tests.sweep_processes` prints per protocol the cases, how many held, how many matched the
simulator (verdict and every rank's chunks). Used for the README's claims table; about 3 minutes on 2 cores."""
import time, json
from adapters.processes import ProcessRunner
from model.faults import Eviction, FaultPlan
from model.outcome import Case
from model.harness import run_case
from model.protocols import REFERENCE_PROTOCOLS
def plans(n, k):
    yield FaultPlan()
    for c in range(k):
        yield FaultPlan(evict_before_lookup=[Eviction(c)])
        yield FaultPlan(evict_after_lookup=[Eviction(c)])
    for r in range(n):
        yield FaultPlan(lost=[(r, 0)])
        yield FaultPlan(delayed=[(r, 0, 2.0)])
def main() -> None:
    t = time.monotonic(); stats = {}
    with ProcessRunner() as pr:
        for name, cls in sorted(REFERENCE_PROTOCOLS.items()):
            p = cls(); cases = held = parity = 0
            for n in (1, 2, 3, 4):
                for k in range(0, 7):
                    for f in plans(n, k):
                        c = Case(n, k, faults=f)
                        o = pr.run(p, c); s = run_case(p, c)
                        cases += 1; held += not o.violations
                        parity += (o.violated() == s.violated() and {r: sorted(v) for r, v in o.results.items()} == {r: sorted(v) for r, v in s.results.items()})
                        if o.violations: print(name, c, o.violations)
            stats[name] = {"cases": cases, "held": held, "same_as_sim": parity}
    print(json.dumps(stats), round(time.monotonic() - t, 1))
if __name__ == "__main__":
    main()
