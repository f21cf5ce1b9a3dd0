"""`properties.stepping.Episode` is `run_case` taken apart: any rule-driven episode replays to the same run."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from model.harness import run_case
from model.protocols import PaperProtocol, PaperProtocolAsync
from model.store import memory_factory
from model.variants import GiveUpOnLocalMiss, RetryUntilPresent, UnboundedWaitAsync
from properties import strategies as s
from properties.stepping import DONE, LOADING, LOOKED_UP, STORED, Episode

actions = st.lists(st.one_of(
    st.tuples(st.just("evict"), s.chunk_index, s.evict_rank),
    st.tuples(st.just("lose"), s.rank_index, s.async_ahead),
    st.tuples(st.just("delay"), s.rank_index, s.async_ahead, s.delays),
    st.tuples(st.just("advance"), s.move_choice),
), max_size=30)


def _drive(protocol, n, k, salt, steps) -> Episode:
    ep = Episode(protocol, memory_factory(n), n, k, salt)
    for a in steps:
        if ep.phase == DONE:
            break
        if a[0] == "evict" and k:
            ep.evict(a[1] % k, None if a[2] is None else a[2] % n)
        elif a[0] == "lose":
            ep.lose(a[1] % n, a[2])
        elif a[0] == "delay":
            ep.delay(a[1] % n, a[2], a[3])
        elif a[0] == "advance":
            {STORED: ep.lookup, LOOKED_UP: ep.start_load, LOADING: lambda: ep.move(a[1])}[ep.phase]()
    ep.finish()
    return ep


@pytest.mark.parametrize("protocol", [PaperProtocol(), PaperProtocolAsync(), GiveUpOnLocalMiss(),
                                      UnboundedWaitAsync(), RetryUntilPresent()], ids=lambda p: p.name)
@settings(max_examples=60, deadline=None)
@given(n=s.n_ranks, k=s.n_chunks, salt=s.salts, steps=actions)
def test_episode_replays_under_run_case(protocol, n, k, salt, steps):
    """The stepped episode and `run_case` on its recorded Case agree on violations, results and schedule."""
    ep = _drive(protocol, n, k, salt, steps)
    mine, theirs = ep.out, run_case(protocol, ep.case())
    assert [(v.property, v.summary) for v in mine.violations] == [(v.property, v.summary) for v in theirs.violations]
    assert mine.results == theirs.results
    assert (mine.planned, mine.lcp, mine.cached) == (theirs.planned, theirs.lcp, theirs.cached)
    assert (mine.load.schedule if mine.load else []) == (theirs.load.schedule if theirs.load else [])
