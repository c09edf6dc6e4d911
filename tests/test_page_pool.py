"""PagePool white-box: free queue order, states, LRU of cached leaves, failed allocation."""

from __future__ import annotations

import pytest

from edge_runtime.kv.page_pool import PagePool
from edge_runtime.kv.prefix_cache import PrefixCache
from edge_runtime.errors import OutOfPages


def make(n=5):
    pool = PagePool(n)
    cache = PrefixCache(pool, 4)
    pool.on_evict = cache.unregister
    return pool, cache


def fill(pool, cache, pid, parent, start, tokens):
    page = pool.pages[pid]
    page.parent, page.start, page.tokens = parent, start, list(tokens)
    cache.register(page)


def test_allocate_takes_free_pages_in_order_and_fails_atomically():
    pool, _ = make(5)
    assert pool.allocate(2) == [0, 1]
    assert (pool.num_free, pool.num_cached, pool.num_live) == (3, 0, 2)
    with pytest.raises(OutOfPages, match="need 4 KV pages but only 3"):
        pool.allocate(4)
    assert list(pool.free_queue) == [2, 3, 4] and pool.num_live == 2
    pool.decref(1)  # unindexed page: straight back to the free queue, at the back
    assert list(pool.free_queue) == [2, 3, 4, 1]
    pool.check_invariants()


def test_lru_holds_cached_leaves_and_evicts_leaves_before_parents():
    pool, cache = make(5)
    ids = pool.allocate(4)
    fill(pool, cache, 0, -1, 0, [1, 2, 3, 4])
    fill(pool, cache, 1, 0, 4, [5, 6])  # child of 0
    fill(pool, cache, 2, 0, 2, [9])  # another child of 0 (a tail attached at offset 2)
    fill(pool, cache, 3, -1, 0, [7])
    assert ids == [0, 1, 2, 3]
    for pid in (2, 1, 0, 3):
        pool.decref(pid)
    assert pool.lru_ids() == [2, 1, 3]  # 0 has children: cached but not evictable yet
    assert (pool.num_free, pool.num_cached, pool.num_live) == (1, 4, 0)
    pool.incref(1)  # a hit: live again, out of the LRU
    assert pool.lru_ids() == [2, 3] and pool.pages[1].state == "live"
    pool.decref(1)
    assert pool.lru_ids() == [2, 3, 1]
    assert pool.evict_one() == 2 and pool.lru_ids() == [3, 1]
    assert pool.evict_one() == 3
    assert pool.evict_one() == 1 and pool.lru_ids() == [0]  # 0 became a leaf: at the head
    assert pool.allocate(3) == [4, 2, 3] and pool.num_evictions == 3
    assert pool.lru_ids() == [0]
    assert pool.allocate(2) == [1, 0] and pool.num_evictions == 4
    pool.check_invariants()


def test_check_invariants_catches_a_page_in_two_states():
    pool, _ = make(3)
    pool.allocate(1)
    pool.free_queue.append(0)
    with pytest.raises(AssertionError):
        pool.check_invariants()
