"""The protocol layer as a Hypothesis state machine: `ProtocolMachine` stores prompts (beside other prompts of the
same tier), evicts, looks up, starts loads, moves one rank at a time and injects faults; every finished episode is
checked with `model.checks.check_outcome` (all the contract's properties); with an in-memory client a failing episode
must also replay under `model.harness.run_case` to the same verdict (else the failure is `replay`)."""
from __future__ import annotations

import time
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from model.harness import run_case
from model.trace import Trace
from runtime.watchdog import forget
from properties import config, strategies as s
from runtime.bounded import BoundedStore
from properties.stepping import DONE, LOADING, LOOKED_UP, STORED, Episode
from properties.reporting import RULE_STEPS, VIOLATED, event, final_run, note, raise_violations, write_found

__all__ = ["ProtocolMachine"]


# == the protocol layer ================================================================================
class ProtocolMachine(RuleBasedStateMachine):
    """Episodes of one prompt: store, evict, look up, load one rank step at a time, with faults.

    After an episode ends (checked), the next rule opens a fresh one with the same sizes, and `lookup`,
    `start_load` and `move` first take the steps before them that have not happened yet. So every
    rule is meaningful in every state, which keeps preconditions (and Hypothesis's rejected draws) away and
    lets the shrinker delete any step.
    """

    def __init__(self) -> None:
        super().__init__()
        if final_run():  # the run Hypothesis reports judges a stall at the full limit (see runtime.watchdog)
            forget()
        self.cfg = config.current()
        self.protocol = self.cfg.protocol_object()
        self.ep: Episode | None = None
        self.sizes: tuple[int, int, str, tuple] = (1, 0, "s0", ())

    def _open(self, n_ranks: int, n_chunks: int, salt: str, others: tuple = ()) -> Episode:
        n_ranks = self.cfg.rank_cap(n_ranks)  # (within the servers the user has: --max-ranks)
        self.sizes = (n_ranks, n_chunks, salt, others)
        # a real client's calls are bounded, so a blocking one is a hang, not a stuck test run
        stores = self.cfg.stores(n_ranks)
        if not self.cfg.in_memory():
            stores = [BoundedStore(st, self.cfg.op_timeout) for st in stores]
        self.ep = Episode(self.protocol, stores, n_ranks, n_chunks, salt, wait_bound=self.cfg.op_timeout,
                          others=others)
        self._check_if_done()
        return self.ep

    def _episode(self) -> Episode:
        """The open episode; after one ended, a fresh one of the same sizes (opened when first needed)."""
        return self.ep if self.ep is not None else self._open(*self.sizes)

    # -- rules --------------------------------------------------------------------------------------
    @initialize(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts)
    def first_prompt(self, n_ranks: int, n_chunks: int, salt: str) -> None:
        """Every rank runs `rank_store` for the first prompt."""
        RULE_STEPS["protocol"] += 1
        self._open(n_ranks, n_chunks, salt)

    @rule(n_ranks=s.n_ranks, n_chunks=s.n_chunks, salt=s.salts, others=s.other_prompts)
    def store_prompt(self, n_ranks: int, n_chunks: int, salt: str, others: list) -> None:
        """Finish (and check) the open episode, then every rank stores a new prompt, in a tier that other prompts
        may share (stored before or after it, sharing a prefix or not, some of their chunks evicted)."""
        RULE_STEPS["protocol"] += 1
        if self.ep is not None:
            self.ep.finish()
            self._check_if_done()
        self._open(n_ranks, n_chunks, salt, tuple(others))

    @precondition(lambda self: self.sizes[1] > 0)
    @rule(chunk=s.chunk_index, rank=s.evict_rank)
    def evict(self, chunk: int, rank: int | None) -> None:
        """Evict a chunk's keys (from one rank or all): before lookup, after it, or during the load."""
        RULE_STEPS["protocol"] += 1
        ep = self._episode()
        e = ep.evict(chunk % ep.k, None if rank is None else rank % ep.n)
        event(f"evict while {ep.phase}")
        note(f"evicted {e} while {ep.phase}")

    @rule()
    def lookup(self) -> None:
        """All ranks look up at one instant and the scheduler plans the load (once per episode)."""
        RULE_STEPS["protocol"] += 1
        self._lookup()

    def _lookup(self) -> None:
        if self._episode().phase == STORED:
            self.ep.lookup()
            out = self.ep.out
            note(f"lookup: cached {sorted(out.cached)}, LCP {out.lcp}, reports {out.reports}, planned {out.planned}")
            self._check_lookup()
            self._check_if_done()

    @rule(rank=s.rank_index, ahead=s.async_ahead)
    def lose_completion(self, rank: int, ahead: int) -> None:
        """A rank's upcoming GetAsync completion will never arrive."""
        RULE_STEPS["protocol"] += 1
        ep = self._episode()
        note(f"lost completion {ep.lose(rank % ep.n, ahead)}")

    @rule(rank=s.rank_index, ahead=s.async_ahead, seconds=s.delays)
    def delay_completion(self, rank: int, ahead: int, seconds: float) -> None:
        """A rank's upcoming GetAsync completion arrives late."""
        RULE_STEPS["protocol"] += 1
        ep = self._episode()
        note(f"delayed completion {ep.delay(rank % ep.n, ahead, seconds)}")

    @rule()
    def start_load(self) -> None:
        """Every rank starts its load program (looking up first if that has not happened)."""
        RULE_STEPS["protocol"] += 1
        self._start_load()

    def _start_load(self) -> None:
        self._lookup()
        if self.ep is not None and self.ep.phase == LOOKED_UP:
            self.ep.start_load()
            self._check_if_done()

    @rule(choice=s.move_choice)
    def move(self, choice: int) -> None:
        """Hypothesis picks which runnable rank takes its next effect (starting the load if need be)."""
        RULE_STEPS["protocol"] += 1
        self._start_load()
        if self.ep is not None and self.ep.phase == LOADING:
            self.ep.move(choice)
            self._check_if_done()

    @rule()
    def finish(self) -> None:
        """Run the rest of the episode (lowest runnable rank first) and check it."""
        RULE_STEPS["protocol"] += 1
        self._episode().finish()
        self._check_if_done()

    # -- the checks ----------------------------------------------------------------------------------
    # Checked where the state changes rather than as Hypothesis `@invariant`s run after every rule: the
    # lookup right after it is made, everything else when the episode ends (a move that desyncs, deadlocks
    # or hangs ends it at once).
    def _check_lookup(self) -> None:
        """Right after the lookup: `planned == LCP` (soundness and completeness)."""
        if self.ep.phase == LOOKED_UP and self.ep.lookup_violations():
            # finish the episode first, so every later property (e.g. within-plan) is reported with it
            self.ep.finish()

    def _check_if_done(self) -> None:
        """When the episode is over: every property of the contract (the next rule opens a fresh episode)."""
        ep = self.ep
        if ep is None or ep.phase != DONE:
            return
        self.ep = None
        out = ep.out
        event(f"episode: {ep.n} ranks, {ep.k} chunks, {min(ep.faults().size(), 3)}{'+' * (ep.faults().size() >= 3)} "
              f"faults, planned {'< LCP' if (out.planned or 0) < out.lcp else '= LCP' if out.planned == out.lcp else '> LCP'}")
        if not out.violations or not {"hang", "termination"} & set(out.violated()):
            try:
                ep.cleanup()
            except Exception:  # a client that fails even to delete: start over with fresh stores
                self.cfg.discard()
        else:
            self.cfg.discard()  # a client that hung or raised may be unusable (a real one restarts its servers)
        if not out.violations:
            return
        if final_run():
            note(f"case: {ep.case()!r}")
            if self.cfg.write_traces:
                found = self._minimised(ep.case(), out)
                trace = Trace.from_outcome(found, protocol_ref=self.cfg.protocol_ref(), client=self.cfg.client_label(),
                                           origin="pytest properties/ (ProtocolMachine)")
                path = write_found(trace, self.cfg, out.protocol, out.violations[0].property)
                note(f"counterexample trace: {path}")
        if self.cfg.in_memory():
            # the simulator replays a run over in-memory stores: it must see what the machine saw (a real
            # client's run may differ, e.g. where the client hung; `shardcheck replay --client` replays those)
            replay = run_case(self.protocol, ep.case())
            if set(replay.violated()) != set(out.violated()):
                raise VIOLATED["replay"](f"run_case replays this episode to {replay.violated()}, the machine saw "
                                         f"{out.violated()}")
        raise_violations(out.violations, f"protocol {out.protocol}")

    def _minimised(self, case: Any, out: Any) -> Any:
        """The outcome of the smallest case (`checking.minimise.minimise`) that still shows the first violation,
        re-run on fresh stores of a real client within `minimise_seconds` (Hypothesis does not shrink runs of
        a real client; on the model it has, and `out` is returned as it is)."""
        if self.cfg.in_memory() or self.cfg.minimise_seconds <= 0:
            return out
        from runtime.pool import ClientPool
        from checking.minimise import minimise
        from checking.search import plain_finding

        stop_at = time.monotonic() + self.cfg.minimise_seconds
        pool = ClientPool(self.cfg.resolved_client(), op_timeout=self.cfg.op_timeout)
        try:
            found = minimise(self.protocol, plain_finding(case, out, "pytest"), runner=pool.run,
                             should_stop=lambda: time.monotonic() >= stop_at)
        finally:
            pool.close()
        if found.case != case:
            note(f"minimised on fresh stores to: {found.case!r}")
        return found.outcome

    def teardown(self) -> None:
        """Finish and check the open episode, so every run ends with a full check."""
        if self.ep is not None:
            self.ep.finish()
            self._check_if_done()


