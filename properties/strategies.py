"""Every Hypothesis strategy the property machines draw from.

Sizes are small on purpose: each protocol bug of `model.variants` shows with 1-4 ranks and at most 6 chunks,
and small sizes make shrunk counterexamples readable. Indices (`chunk`, `rank`, `choice`) are drawn from a
fixed range and wrapped by the machine (`chunk % n_chunks`), so every drawn value is meaningful in every
state and shrinks towards 0.
"""
from __future__ import annotations

from hypothesis import strategies as st

from model.outcome import OtherPrompt
from model.protocols import DEFAULT_WAIT_TIMEOUT

__all__ = ["n_ranks", "n_chunks", "salts", "chunk_index", "evict_rank", "rank_index", "async_ahead", "delays",
           "move_choice", "other_prompts", "STORE_RANKS", "store_rank", "store_client", "fault_kind_index", "keys",
           "large_values", "values", "batch_keys", "needed_ops"]

# -- protocol layer -----------------------------------------------------------------------------------
n_ranks = st.integers(1, 4)
n_chunks = st.integers(0, 6)
salts = st.sampled_from(["s0", "s1", "s2"])
chunk_index = st.integers(0, 5)
#: `None`: every rank's copy of the chunk; else a rank (wrapped by the machine).
evict_rank = st.sampled_from([None, 0, 1, 2, 3])
rank_index = st.integers(0, 3)
#: Which of a rank's next `GetAsync`s a fault hits (0: the next one).
async_ahead = st.integers(0, 3)
#: Completion delays around the reference wait timeout: within it, and past it.
delays = st.sampled_from([DEFAULT_WAIT_TIMEOUT / 4, DEFAULT_WAIT_TIMEOUT * 2, DEFAULT_WAIT_TIMEOUT * 10])
#: Which runnable rank moves next (wrapped over the runnable ranks; 0: the lowest).
move_choice = st.integers(0, 3)

#: Other prompts in the same tier as the episode's (a shared tier outlives one prompt): a shared prefix, stored
#: before or after, some of their chunks evicted; their chunk counts and shared prefixes wrap like indices.
other_prompts = st.lists(st.builds(
    lambda salt, k, shared, after, evicted: OtherPrompt(salt=salt, n_chunks=k, shared=min(shared, k), after=after,
                                                        evicted=tuple(sorted({c % k for c in evicted})) if k else ()),
    st.sampled_from(["t1", "t2", "tenant-b"]), st.integers(0, 6), st.integers(0, 6), st.booleans(),
    st.lists(st.integers(0, 5), max_size=2)), max_size=2)

# -- store layer ---------------------------------------------------------------------------------------
STORE_RANKS = 2
store_rank = st.integers(0, STORE_RANKS - 1)
#: Which real-server fault kind strikes (wrapped over the run's `--nemesis` kinds).
fault_kind_index = st.integers(0, 6)
#: Which client of the same servers makes a call (wrapped by the machine: one client when it cannot share them).
store_client = st.integers(0, 1)
#: A few keys so that puts, deletes and reads collide, plus arbitrary printable ones.
keys = st.sampled_from(["k0", "k1", "kv:abc:pcp2:r0", "K0", "k0:", "kv:abc:pcp2:r1", "x" * 200,
                        "kv:ünïcode:✓", "a b\tc", "{braces}[brackets]@#$%^&*", "-", "0",
                        "k\r\nSET k0 x"])
#: Large values (1-5 KB) as a short random pattern repeated: drawing thousands of independent bytes costs
#: milliseconds per value, and a repeated pattern with a random length finds truncation and offsets as well.
large_values = st.tuples(st.binary(min_size=1, max_size=16), st.integers(1000, 5000)).map(
    lambda t: (t[0] * (t[1] // len(t[0]) + 1))[:t[1]])
#: Values: empty, small, and a few larger ones (byte-exact round trips, truncation, binary zeros).
values = st.binary(max_size=64) | large_values
batch_keys = st.lists(keys, min_size=0, max_size=4)

# -- op-sequence minimisation (checking.minimise.ddmin) --------------------------------------------
#: A sequence length and the positions in it that a failure needs (a monotone failure: any sequence that
#: keeps every needed op fails).
needed_ops = st.integers(0, 40).flatmap(
    lambda n: st.tuples(st.just(n), st.sets(st.integers(0, max(n - 1, 0)), max_size=min(n, 5))))

# -- concurrent layer (properties/test_concurrent_layer.py) ------------------------------------------------
CONCURRENT_KEYS = ("k0", "k1", "k2")


def concurrent_op(paths: tuple[str, ...], clients: int = 1, evictions: bool = False) -> st.SearchStrategy[dict]:
    """One op of a caller thread: a put (with 0-32 filler bytes), a delete, or a read through one of `paths`
    (multi-key paths read 2-3 distinct keys); through one of `clients` clients of the same server; with
    `evictions`, also the server's own eviction of a key."""
    key = st.sampled_from(CONCURRENT_KEYS)
    puts = st.builds(lambda k, pad: {"path": "put", "keys": [k], "pad": pad}, key, st.integers(0, 32))
    deletes = st.builds(lambda k: {"path": "delete", "keys": [k]}, key)
    single = [p for p in paths if p in ("get", "get_async", "get_sync", "contains")]
    multi = [p for p in paths if p not in single]
    reads = [st.builds(lambda p, k: {"path": p, "keys": [k]}, st.sampled_from(single), key)] if single else []
    if multi:
        reads.append(st.builds(lambda p, ks: {"path": p, "keys": ks}, st.sampled_from(multi),
                               st.lists(key, min_size=2, max_size=3, unique=True)))
    op = st.one_of(puts, deletes, *reads)
    if clients > 1:
        op = st.builds(lambda o, c: {**o, "client": c} if c else o, op, st.integers(0, clients - 1))
    if evictions:  # about one op in eight
        op = st.one_of(*[op] * 7, st.builds(lambda k: {"path": "evict", "keys": [k]}, key))
    return op


def concurrent_batches(paths: tuple[str, ...], clients: int = 1,
                       evictions: bool = False) -> st.SearchStrategy[list[list[dict]]]:
    """A batch of ops run at once: 1-4 caller threads of 1-6 ops each (see `concurrent_op`)."""
    return st.lists(st.lists(concurrent_op(paths, clients, evictions), min_size=1, max_size=6), min_size=1, max_size=4)
