"""kv/page_math.py against the allocator itself: requests grown to full length in a KVManager
on a tiny pool (prefill, the engine's forks for n > 1, one token per choice per step), counting the
pages it holds at the end (live pages only grow while the choices grow, so the end is the peak)."""

from __future__ import annotations

import itertools

import pytest

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.page_math import (pages_for_sequence_at_most, pages_for_tokens,
                                          request_pages_lenient)
from edge_runtime.errors import OutOfPages

PAGE = 4
SHAPES = list(itertools.product(range(1, 10), range(1, 7), range(1, 4)))  # prompt, max_tokens, n
GROWING_CHOICES = [(p, m, n) for p, m, n in SHAPES if m > 1 or n == 1]  # each writes its own K/V


def grow_request(kv: KVManager, num_prompt: int, max_tokens: int, n: int) -> int:
    """Run one request as the engine does and return the live pages at full length: the prompt
    prefilled in choice 0, choices 1.. forked from it, then every choice fed its sampled tokens
    (all but the last, which is never fed back) one step at a time."""
    prompt = list(range(1, num_prompt + 1))
    kv.admit("c0", prompt, max_tokens)
    kv.reserve("c0", num_prompt)
    kv.commit("c0", prompt)
    for i in range(1, n):
        kv.fork("c0", f"c{i}")
    for step in range(max_tokens - 1):
        for i in range(n):  # each choice samples its own tokens
            kv.reserve(f"c{i}", 1)
            kv.commit(f"c{i}", [1000 * (i + 1) + step])
    kv.check_invariants()
    return kv.pool.num_live


def test_pages_for_tokens_counts_a_partial_last_page():
    assert [pages_for_tokens(t, 4) for t in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert pages_for_tokens(512, 512) == 1 and pages_for_tokens(513, 512) == 2
    assert pages_for_sequence_at_most(9, 4) == 4
    with pytest.raises(AssertionError):
        pages_for_tokens(1, 0)


@pytest.mark.parametrize("num_prompt,max_tokens,n", GROWING_CHOICES)
def test_request_pages_without_inline_storage_are_what_the_allocator_holds(num_prompt, max_tokens, n):
    """Exact: the pool of that many pages runs the request to full length, one page fewer fails."""
    needed = request_pages_lenient(num_prompt, max_tokens, n, PAGE)
    assert grow_request(KVManager(needed, PAGE), num_prompt, max_tokens, n) == needed
    if needed > 1:
        with pytest.raises(OutOfPages):
            grow_request(KVManager(needed - 1, PAGE), num_prompt, max_tokens, n)


@pytest.mark.parametrize("num_prompt,n", [(p, n) for p, m, n in SHAPES if m == 1 and n > 1])
def test_request_pages_count_a_partial_prompt_page_per_choice_that_writes_nothing(num_prompt, n):
    """max_tokens 1: the choices share every page of the prompt, its partial last one too, while
    the count gives each choice a copy of it: an over-count, on the side of refusing."""
    needed = request_pages_lenient(num_prompt, 1, n, PAGE)
    held = grow_request(KVManager(needed, PAGE), num_prompt, 1, n)
    assert held == pages_for_tokens(num_prompt, PAGE)
    assert needed == held + (n - 1) * (num_prompt % PAGE != 0)


@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("num_prompt,max_tokens,n", GROWING_CHOICES)
def test_request_pages_with_inline_slots_are_lenient(num_prompt, max_tokens, n, slots):
    """A fresh prompt's tail stays in pages unless the whole request fits one slot: never more
    than the allocator holds, and exactly it when the request fits a slot."""
    inline_tokens = 3
    needed = request_pages_lenient(num_prompt, max_tokens, n, PAGE, slots, inline_tokens)
    kv = KVManager(64, PAGE, num_inline_slots=slots, inline_tokens=inline_tokens)
    held = grow_request(kv, num_prompt, max_tokens, n)
    assert needed <= held
    if num_prompt + max_tokens <= inline_tokens:  # admitted into a slot whole
        assert needed == held


def test_request_pages_inline_cases_by_hand():
    # n=3 choices of 3 positions each, 2 slots: two choices in slots, one in a page
    assert request_pages_lenient(2, 2, 3, PAGE, 2, 3) == 1
    assert request_pages_lenient(2, 2, 3, PAGE, 0, 3) == 3  # no slots: a page each
    # 9 positions, n=2: two prompt pages shared, a page of its own per choice after them
    assert request_pages_lenient(8, 2, 2, PAGE) == 2 + 2
    assert request_pages_lenient(8, 2, 2, PAGE, 2, 3) == 2  # ... or a slot each
    assert request_pages_lenient(8, 2, 2, PAGE, 2, 8) == 2  # a slot holds at most a page


def held_after_shared_prefix(num_shared: int, num_tokens: int) -> int:
    """Pages a sequence of `num_tokens` tokens holds when its first `num_shared` come from the
    prefix cache: an earlier request wrote them and then other tokens, and finished."""
    kv = KVManager(64, PAGE)
    common = list(range(1, num_shared + 1))
    earlier = common + [500 + i for i in range(PAGE)]
    kv.admit("earlier", earlier, 1)
    kv.reserve("earlier", len(earlier))
    kv.commit("earlier", earlier)
    kv.finish("earlier")
    prompt = common + [900 + i for i in range(num_tokens - num_shared)]
    seq = kv.admit("next", prompt, 1)
    assert seq.num_cached_tokens == num_shared, (num_shared, seq.num_cached_tokens)
    kv.reserve("next", num_tokens - num_shared)
    kv.commit("next", prompt[num_shared:])
    kv.check_invariants()
    return len(seq.all_pages())


def test_pages_for_sequence_at_most_bounds_a_prefix_ending_mid_page():
    reached = set()
    for num_tokens in range(2, 14):
        bound = pages_for_sequence_at_most(num_tokens, PAGE)
        held = [held_after_shared_prefix(s, num_tokens) for s in range(1, num_tokens)]
        assert max(held) <= bound, (num_tokens, held, bound)
        assert min(held) >= pages_for_tokens(num_tokens, PAGE), (num_tokens, held)
        if max(held) == bound:
            reached.add(num_tokens)
    assert {2, 6, 7, 8} <= reached, reached  # e.g. 6 = 2 shared (a partial page) + 4 in a new one
