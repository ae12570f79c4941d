"""The radix cache on its own: matching, splitting, pinning, LRU eviction, version salting.

KV rows are filled with their token id, so reading a match back shows whether
the slots really hold the tokens they claim to.
"""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_rl.engine.radix_cache import KVCacheManager


def kv_of(tokens):
    """Rows ``[n, 2, layers=2, kv_heads=1, dim=3]``: K holds the token id, V its negation."""
    t = torch.tensor(tokens, dtype=torch.float32)[:, None, None, None].expand(len(tokens), 2, 1, 3)
    return torch.stack([t, -t], dim=1)


def cache(max_tokens=1000):
    return KVCacheManager(num_layers=2, num_kv_heads=1, head_dim=3, max_tokens=max_tokens)


def read_tokens(c, match):
    rows = c.pool.read(match.slots)
    assert torch.equal(rows[:, 1], -rows[:, 0])
    return rows[:, 0, 0, 0, 0].long().tolist()


def test_match_split_and_read_back():
    c = cache()
    a = [1, 2, 3, 4, 5, 6]
    c.insert(a, kv_of(a))
    b = [1, 2, 3, 9, 9]
    assert c.match_length(b) == 3
    c.insert(b, kv_of(b))  # splits the first edge after 3 tokens
    m = c.match_and_pin([1, 2, 3, 4, 7])
    assert m.length == 4 and read_tokens(c, m) == [1, 2, 3, 4]
    c.release(m)
    assert c.cached_tokens == 8  # 1 2 3 shared, 4 5 6 and 9 9 apart
    c.check_invariants()


def test_limit_and_no_double_copy():
    c = cache()
    a = list(range(10, 30))
    c.insert(a, kv_of(a))
    assert c.match_and_pin(a, limit=19).length == 19
    before = c.cached_tokens
    assert c.insert(a, kv_of(a)) == 0 and c.cached_tokens == before


def test_lru_eviction_spares_pinned_and_recent():
    c = cache(max_tokens=12)
    old, pinned, recent = [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]
    for s in (old, pinned, recent):
        c.insert(s, kv_of(s))
    m = c.match_and_pin(pinned)
    c.release(c.match_and_pin(recent))  # touch: now most recent
    new = [4, 4, 4, 4, 4, 4]
    assert c.insert(new, kv_of(new)) == 6
    assert c.match_length(old) == 0 and c.match_length(pinned) == 4 and c.match_length(new) == 6
    assert c.evicted_tokens >= 4
    assert read_tokens(c, m) == pinned
    c.release(m)
    c.check_invariants()


def test_insert_truncates_when_everything_is_pinned():
    c = cache(max_tokens=6)
    a = [5, 6, 7, 8]
    c.insert(a, kv_of(a))
    m = c.match_and_pin(a)
    b = [9, 9, 9, 9]
    assert c.insert(b, kv_of(b)) == 2  # only the prefix that fits
    assert c.match_length(b) == 2
    c.release(m)
    c.check_invariants()


def test_version_salting_drops_stale_entries():
    c = cache()
    a = [1, 2, 3, 4]
    c.insert(a, kv_of(a))
    m = c.match_and_pin(a)
    c.set_version(1)
    assert c.match_length(a) == 0
    assert c.cached_tokens == 4  # still pinned by an in-flight user
    assert c.insert(a, kv_of(a), version=0) == 0  # stale KV is never cached
    c.release(m)
    assert c.cached_tokens == 0
    c.check_invariants()


def test_pinned_tokens_count_and_release():
    c = cache()
    a, b = [1, 2, 3, 4], [1, 2, 7]
    c.insert(a, kv_of(a))
    c.insert(b, kv_of(b))
    ma, mb = c.match_and_pin(a), c.match_and_pin(b)
    assert c.pinned_tokens() == 5
    c.release(ma)
    assert c.pinned_tokens() == 3
    c.release(mb)
    assert c.pinned_tokens() == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=25),
       st.integers(4, 40), st.integers(0, 2**16))
def test_random_workload_keeps_kv_consistent(seqs, budget, seed):
    """Whatever is matched reads back as exactly the tokens asked for; slots never leak."""
    rnd = random.Random(seed)
    c = cache(max_tokens=budget)
    held = []
    for s in seqs:
        m = c.match_and_pin(s)
        assert read_tokens(c, m) == s[: m.length]
        held.append(m)
        c.insert(s, kv_of(s))
        if held and rnd.random() < 0.6:
            c.release(held.pop(rnd.randrange(len(held))))
        assert c.cached_tokens <= budget
        c.check_invariants()
    for m in held:
        c.release(m)
    assert c.pinned_tokens() == 0
    c.check_invariants()


def test_bad_budget():
    with pytest.raises(ValueError, match="max_tokens=-1"):
        cache(-1)


def test_set_limit_evicts_and_compacts_keeping_contents():
    c = KVCacheManager(num_layers=2, num_kv_heads=1, head_dim=3, max_tokens=64)
    seqs = [[10 * i + j for j in range(1, 9)] for i in range(1, 7)]  # 6 x 8 tokens, disjoint
    for s in seqs:
        c.insert(s, kv_of(s))
    keep = c.match_and_pin(seqs[-1])  # pinned: must survive and still read back right
    assert c.set_limit(20)
    assert c.pool.capacity == 20 and c.pool.capacity_bytes == 20 * c.pool.bytes_per_slot
    assert c.cached_tokens <= 20 and c.evicted_tokens >= 28
    c.check_invariants()
    for s in seqs:
        n = c.match_length(s)
        if n:
            assert read_tokens(c, c.match_and_pin(s)) == s[:n]
    assert c.match_length(seqs[-1]) == 8
    keep.slots = c.current_slots(keep)
    assert read_tokens(c, keep) == seqs[-1]
    assert not c.set_limit(4)  # the pinned 8 tokens do not fit in 4: nothing changes
    assert c.pool.capacity == 20
    c.release(keep)
    assert c.set_limit(100) and c.limit == 64  # never above the constructor's bound
    s = list(range(500, 530))
    assert c.insert(s, kv_of(s)) == 30 and c.pool.capacity <= 64
