"""PrefixCache: longest-prefix match over aligned pages, partial use, tail chains, take-over."""

from __future__ import annotations

from edge_runtime.kv.page_pool import ROOT, PagePool
from edge_runtime.kv.prefix_cache import PrefixCache, common_len


def setup(n=8, P=4):
    pool = PagePool(n)
    cache = PrefixCache(pool, P)
    pool.on_evict = cache.unregister
    return pool, cache


def add(pool, cache, parent, start, tokens, owner=None):
    pid = pool.allocate(1)[0]
    page = pool.pages[pid]
    page.parent, page.start, page.tokens, page.owner = parent, start, list(tokens), owner
    cache.register(page)
    return pid


def test_common_len():
    assert common_len([1, 2, 3], [0, 1, 2, 4], 1) == 2
    assert common_len([1, 2], [1, 2, 3], 0) == 2
    assert common_len([1, 2, 3], [1], 0) == 1


def test_aligned_chain_partial_last_page_and_keys_chained_by_parent():
    pool, cache = setup()
    p0 = add(pool, cache, ROOT, 0, [1, 2, 3, 4])
    p1 = add(pool, cache, p0, 4, [5, 6, 7, 8])
    add(pool, cache, ROOT, 4, [5, 6, 7, 8])  # same tokens, other parent: must not match
    m = cache.match([1, 2, 3, 4, 5, 6, 0])
    assert (m.prefix_pages, m.prefix_len, m.tail_pages, m.num_cached) == ([p0, p1], 6, [], 6)
    assert cache.match([9, 1, 2]).num_cached == 0
    m = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert (m.prefix_pages, m.prefix_len) == ([p0, p1], 8)


def test_tail_chain_is_matched_and_taken_over_when_idle():
    pool, cache = setup()
    sys_page = add(pool, cache, ROOT, 0, [1, 2, 3, 4])  # a system prompt page, used to 3
    t0 = add(pool, cache, sys_page, 3, [50, 51, 52, 53])  # a stream's tail, starts at 3
    t1 = add(pool, cache, t0, 7, [54, 55])
    other = add(pool, cache, sys_page, 3, [60, 61])  # another stream's tail
    m = cache.match([1, 2, 3, 50, 51, 52, 53, 54, 55])
    assert (m.prefix_pages, m.prefix_len, m.tail_pages, m.num_cached, m.take_over) == \
        ([sys_page], 3, [t0, t1], 9, True)
    pool.pages[t1].owner = "busy"  # someone is appending to it: share read-only instead
    m = cache.match([1, 2, 3, 50, 51, 52, 53, 54, 55])
    assert (m.tail_pages, m.take_over) == ([t0, t1], False)
    m = cache.match([1, 2, 3, 60, 99])
    assert (m.prefix_len, m.tail_pages, m.num_cached, m.take_over) == (3, [other], 4, False)


def test_idle_partial_root_page_is_taken_over():
    pool, cache = setup()
    p0 = add(pool, cache, ROOT, 0, [1, 2, 3])
    m = cache.match([1, 2, 3, 4])
    assert (m.prefix_pages, m.prefix_len, m.tail_pages, m.num_cached, m.take_over) == ([], 0, [p0], 3, True)
    m = cache.match([1, 2])
    assert (m.prefix_pages, m.prefix_len, m.tail_pages, m.num_cached) == ([p0], 2, [], 2)
    cache.check_invariants()


def test_identical_pages_are_all_explored():
    # two requests admitted together each computed the same first page; only the second one's
    # chain continues with this prompt's history
    pool, cache = setup()
    a0 = add(pool, cache, ROOT, 0, [1, 2, 3, 4])
    b0 = add(pool, cache, ROOT, 0, [1, 2, 3, 4])
    add(pool, cache, a0, 4, [5, 6])
    b1 = add(pool, cache, b0, 4, [7, 8, 9])
    m = cache.match([1, 2, 3, 4, 7, 8, 9, 10])
    assert (m.prefix_pages, m.prefix_len, m.tail_pages, m.num_cached, m.take_over) == ([b0], 4, [b1], 7, True)
