"""White-box scenarios for KVManager on tiny pools: exact page ids, ref counts, LRU order."""

from __future__ import annotations

import logging

import pytest

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.seq_kv import CopyOp
from edge_runtime.errors import OutOfPages


def refs(mgr):
    return [p.ref_count for p in mgr.pool.pages]


def states(mgr):
    return "".join(p.state[0] for p in mgr.pool.pages)  # f(ree) c(ached) l(ive)


def prefill(mgr, sid, prompt):
    seq = mgr.seqs[sid]
    copies = mgr.reserve(sid, len(prompt) - seq.num_cached_tokens)
    mgr.commit(sid, prompt[seq.num_cached_tokens:])
    return copies


def test_shared_prefix_take_over_eviction_and_resume():
    mgr = KVManager(num_pages=8, page_tokens=4)
    a = list(range(1, 11))  # 10 tokens
    assert mgr.admit("A", a, 4).num_cached_tokens == 0
    assert prefill(mgr, "A", a) == []
    seg = mgr.segments("A")
    assert (seg.prefix_pages, seg.prefix_len, seg.tail_kind, seg.tail_ids) == ((), 0, "pages", (0, 1, 2))
    assert (seg.tail_len, seg.tail_capacity) == (10, 12)
    assert mgr.reserve("A", 1) == []  # room left in page 2, which A owns
    mgr.commit("A", [11])
    assert [p.tokens for p in mgr.pool.pages[:3]] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]

    b = [1, 2, 3, 4, 5, 6, 99, 100]  # shares 6 tokens: page 0 whole, page 1 partially
    seq_b = mgr.admit("B", b, 2)
    assert (seq_b.num_cached_tokens, seq_b.prefix_pages, seq_b.prefix_len) == (6, [0, 1], 6)
    prefill(mgr, "B", b)
    assert mgr.segments("B").tail_ids == (3,) and mgr.pool.pages[3].start == 6
    assert refs(mgr)[:4] == [2, 2, 1, 1] and sorted(mgr.pool.pages[1].children) == [2, 3]
    assert mgr.slot_of("B", 5) == ("pages", 1 * 4 + 1)  # shared page 1, read-only
    assert mgr.slot_of("B", 7) == ("pages", 3 * 4 + 1)  # B's tail starts at slot 0 of page 3
    mgr.check_invariants()

    assert mgr.finish("A") == []
    assert refs(mgr)[:4] == [1, 1, 0, 1] and states(mgr) == "llclffff"
    assert mgr.pool.lru_ids() == [2]

    # next turn of A: matches all it wrote, takes over its idle partial page 2 and appends in place
    a2 = a + [11, 12, 13]
    seq = mgr.admit("A2", a2, 4)
    assert (seq.num_cached_tokens, seq.prefix_pages, seq.prefix_len, seq.tail_pages) == (11, [0, 1], 8, [2])
    assert mgr.pool.pages[2].owner == "A2" and mgr.pool.lru_ids() == []
    assert prefill(mgr, "A2", a2) == []  # no copy: the owner writes in place
    assert mgr.pool.pages[2].tokens == [9, 10, 11, 12] and mgr.segments("A2").tail_ids == (2, 4)
    assert refs(mgr)[:5] == [2, 2, 1, 1, 1]
    assert mgr.counters.take_overs == 1
    mgr.check_invariants()

    mgr.release("B")
    assert mgr.pool.lru_ids() == [3] and refs(mgr)[:5] == [1, 1, 1, 0, 1]
    assert mgr.evict(1) == 1 and list(mgr.pool.free_queue) == [5, 6, 7, 3]

    mgr.preempt("A2")  # everything it wrote stays cached; leaves go first
    assert states(mgr) == "cccfcfff" and mgr.pool.lru_ids() == [4]
    assert mgr.evict(2) == 2  # page 4, then its parent page 2 (now a leaf, enters at the head)
    assert list(mgr.pool.free_queue) == [5, 6, 7, 3, 4, 2] and mgr.pool.lru_ids() == [1]
    resumed = mgr.admit("A2", a2 + [14], 4)
    assert (resumed.num_cached_tokens, resumed.prefix_pages) == (8, [0, 1])
    assert mgr.counters.preemptions == 1 and mgr.stats()["evictions"] == 3
    mgr.release("A2")
    mgr.check_leaks()


def test_inline_slot_outgrows_to_pages_and_is_kept_on_finish():
    mgr = KVManager(num_pages=4, page_tokens=8, num_inline_slots=2, inline_tokens=4)
    s = [1, 2, 3]
    assert mgr.admit("S", s, 1).tail_kind == "inline"  # 3 uncached + 1 new <= 4
    assert mgr.segments("S").tail_ids == (0,) and mgr.segments("S").tail_capacity == 4
    assert prefill(mgr, "S", s) == []
    assert mgr.slot_of("S", 2) == ("inline", 2) and mgr.stats()["inline_slots_used"] == 1
    assert mgr.reserve("S", 1) == []
    mgr.commit("S", [7])
    # outgrows its slot: a second slot (no copy) while the inline end stays within a page
    assert mgr.reserve("S", 1) == [] and mgr.segments("S").tail_ids == (0, 1)
    mgr.commit("S", [8])
    assert mgr.slot_of("S", 4) == ("inline", 4) and mgr.segments("S").tail_capacity == 8
    assert mgr.reserve("S", 3) == []
    mgr.commit("S", [9, 10, 11])
    # beyond a page's worth: both slots moved into a page (one copy each), slots freed
    assert mgr.reserve("S", 1) == [CopyOp("inline", 0, "pages", 0, 4),
                                   CopyOp("inline", 4, "pages", 4, 4)]
    assert mgr.segments("S").tail_kind == "pages" and mgr.arena.num_used == 0
    mgr.commit("S", [12])
    assert mgr.pool.pages[0].tokens == [1, 2, 3, 7, 8, 9, 10, 11] and mgr.pool.pages[1].tokens == [12]
    assert mgr.finish("S") == []

    assert mgr.admit("T", [9, 9], 2).inline_slots == [0]
    prefill(mgr, "T", [9, 9])
    assert mgr.finish("T") == [CopyOp("inline", 0, "pages", 16, 2)]  # kept for the next turn
    assert mgr.pool.pages[2].tokens == [9, 9] and mgr.pool.lru_ids() == [1, 2]  # leaves
    u = mgr.admit("U", [9, 9, 5], 2)  # finds it and takes the page over (fresh: no slots)
    assert (u.num_cached_tokens, u.tail_kind, u.tail_pages, u.prefix_len) == (2, "pages", [2], 0)
    mgr.release("U")
    mgr.check_leaks()


def test_next_turn_copies_its_partial_history_page_into_slots_and_takes_it_back_on_finish():
    mgr = KVManager(num_pages=6, page_tokens=8, num_inline_slots=4, inline_tokens=2)
    mgr.admit("A", [1, 2, 3], 2)  # fresh and 3 + 2 > one slot: pages, indexed as written
    assert mgr.seqs["A"].tail_kind == "pages"
    prefill(mgr, "A", [1, 2, 3])
    mgr.reserve("A", 1)
    mgr.commit("A", [4])
    assert mgr.finish("A") == [] and mgr.pool.pages[0].tokens == [1, 2, 3, 4]
    # the next turn: 4 cached + 1 new + 1 to generate = 6 tokens fit 3 slots (< a page's 4):
    # page 0 is not taken over but copied into slots, and stays cached, first to evict
    b = mgr.admit("B", [1, 2, 3, 4, 5], 1)
    assert (b.num_cached_tokens, b.took_over, b.tail_pages) == (4, False, [0])
    assert prefill(mgr, "B", [1, 2, 3, 4, 5]) == [CopyOp("pages", 0, "inline", 0, 2),
                                                  CopyOp("pages", 2, "inline", 2, 2)]
    seg = mgr.segments("B")
    assert (seg.tail_kind, seg.tail_ids, seg.full_pages, seg.tail_capacity) == ("inline", (0, 1, 2), (), 6)
    assert mgr.pool.pages[0].state == "cached" and mgr.pool.lru_ids()[0] == 0
    assert mgr.stats()["pages_live"] == 0 and mgr.stats()["inline_slots_used"] == 3
    assert mgr.slot_of("B", 4) == ("inline", 4)
    assert mgr.reserve("B", 1) == []
    mgr.commit("B", [6])
    # finish: page 0 still holds [1, 2, 3, 4]: taken back, only positions 4-5 copied into it
    assert mgr.finish("B") == [CopyOp("inline", 4, "pages", 4, 2)]
    assert mgr.pool.pages[0].tokens == [1, 2, 3, 4, 5, 6] and mgr.arena.num_used == 0
    assert mgr.counters.pages_to_slots == 1 and mgr.counters.take_overs == 1
    c = mgr.admit("C", [1, 2, 3, 4, 5, 6, 7], 1)
    assert c.num_cached_tokens == 6
    mgr.release("C")
    mgr.check_leaks()


def test_owned_page_filled_then_the_turn_continues_in_slots():
    mgr = KVManager(num_pages=6, page_tokens=8, num_inline_slots=4, inline_tokens=2)
    a = [1, 2, 3, 4, 5, 6, 7]
    mgr.admit("A", a, 1)
    prefill(mgr, "A", a)
    mgr.finish("A")
    # 10 + 2 tokens from position 0 do not fit 3 slots: page 0 is taken over; its last free
    # position and then slots take the rest (2 + 2 from the page end fit 2 slots)
    b = a + [8, 9, 10]
    assert mgr.admit("B", b, 2).took_over
    assert prefill(mgr, "B", b) == []
    seg = mgr.segments("B")
    assert (seg.tail_kind, seg.full_pages, seg.tail_ids, seg.tail_capacity) == ("inline", (0,), (0,), 10)
    assert mgr.pool.pages[0].tokens == [1, 2, 3, 4, 5, 6, 7, 8]
    assert mgr.slot_of("B", 7) == ("pages", 7) and mgr.slot_of("B", 9) == ("inline", 1)
    assert mgr.reserve("B", 1) == [] and mgr.segments("B").tail_ids == (0, 1)
    mgr.commit("B", [11])
    assert mgr.finish("B") == [CopyOp("inline", 0, "pages", 8, 2), CopyOp("inline", 2, "pages", 10, 1)]
    new = mgr.pool.pages[1]
    assert (new.tokens, new.start, new.parent) == ([9, 10, 11], 8, 0)
    c = mgr.admit("C", b + [11, 12], 1)
    assert c.num_cached_tokens == 11 and c.prefix_pages == [0]
    mgr.release("C")
    mgr.check_leaks()


def test_fork_then_copy_on_write_only_for_the_non_owner():
    mgr = KVManager(num_pages=6, page_tokens=4)
    a = [1, 2, 3, 4, 5, 6]
    mgr.admit("A", a, 4)
    prefill(mgr, "A", a)
    child = mgr.fork("A", "B")
    assert child.tail_pages == [0, 1] and refs(mgr)[:2] == [2, 2]
    assert (mgr.seqs["A"].capacity, child.capacity) == (8, 6)
    assert mgr.reserve("B", 1) == [CopyOp("pages", 4, "pages", 8, 2)]
    assert mgr.segments("B").tail_ids == (0, 2) and refs(mgr)[:3] == [2, 1, 1]
    assert mgr.reserve("A", 1) == []
    mgr.commit("A", [7])
    mgr.commit("B", [8])
    assert mgr.pool.pages[1].tokens == [5, 6, 7] and mgr.pool.pages[2].tokens == [5, 6, 8]
    assert sorted(mgr.prefix.index[(0, 4, 5)]) == [1, 2]
    mgr.check_invariants()
    mgr.finish("A")
    mgr.finish("B")
    mgr.check_leaks()


def test_failed_allocation_changes_nothing():
    mgr = KVManager(num_pages=2, page_tokens=4)
    mgr.admit("A", list(range(8)), 4)
    prefill(mgr, "A", list(range(8)))
    before = (refs(mgr), states(mgr), list(mgr.pool.free_queue), dict(mgr.seqs["A"].__dict__))
    with pytest.raises(OutOfPages):
        mgr.admit("B", [9] * 5, 1)
    with pytest.raises(OutOfPages):
        mgr.reserve("A", 1)
    assert "B" not in mgr.seqs
    assert before == (refs(mgr), states(mgr), list(mgr.pool.free_queue), dict(mgr.seqs["A"].__dict__))
    assert mgr.counters.failed_allocations == 2
    mgr.check_invariants()


def test_cached_pages_are_evicted_to_admit_new_work():
    mgr = KVManager(num_pages=2, page_tokens=4)
    mgr.admit("A", [1, 2, 3, 4, 5], 1)
    prefill(mgr, "A", [1, 2, 3, 4, 5])
    mgr.finish("A")
    assert states(mgr) == "cc" and mgr.pool.lru_ids() == [1]  # page 0 has a child: not a leaf
    mgr.admit("B", [7, 7, 7, 7, 7], 1)
    prefill(mgr, "B", [7, 7, 7, 7, 7])
    assert mgr.segments("B").tail_ids == (1, 0) and mgr.stats()["evictions"] == 2


def test_check_invariants_detects_a_wrong_ref_count():
    mgr = KVManager(num_pages=3, page_tokens=4)
    mgr.admit("A", [1, 2, 3], 1)
    prefill(mgr, "A", [1, 2, 3])
    mgr.pool.pages[0].ref_count += 1
    with pytest.raises(AssertionError, match="ref"):
        mgr.check_invariants()


def test_debug_log_and_low_free_dump(monkeypatch, caplog):
    monkeypatch.setenv("EDGE_RUNTIME_KV_DEBUG", "1")
    mgr = KVManager(num_pages=3, page_tokens=4, dump_below_free=2)
    assert mgr.log.enabled
    with caplog.at_level(logging.DEBUG, logger="edge_runtime.kv"):
        mgr.admit("req-1", [1, 2, 3, 4, 5], 1)
        prefill(mgr, "req-1", [1, 2, 3, 4, 5])
        mgr.finish("req-1")
    events = [(e[1], e[2], e[3].get("page")) for e in mgr.log.events]
    assert ("alloc", "req-1", 0) in events and ("alloc", "req-1", 1) in events
    assert ("ref-", "req-1", 1) in events
    assert any("req=req-1 alloc page=0" in r.getMessage() for r in caplog.records)
    dumps = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(dumps) == 1 and "free KV pages below 2" in dumps[0].getMessage()
    assert "seq req-1" in dumps[0].getMessage()
    assert not KVManager(2, 4, debug=False).log.enabled


def test_stats_report_utilization_and_hit_rate():
    mgr = KVManager(num_pages=4, page_tokens=4)
    mgr.admit("A", [1, 2, 3, 4, 5, 6], 1)
    prefill(mgr, "A", [1, 2, 3, 4, 5, 6])
    mgr.finish("A")
    mgr.admit("B", [1, 2, 3, 4, 5, 6, 7, 8], 1)
    st = mgr.stats()
    assert st["prefix_hit_rate"] == pytest.approx(6 / 14)
    assert st["page_utilization"] == pytest.approx(6 / 8)
    assert (st["pages_live"], st["pages_cached"], st["pages_free"]) == (2, 0, 2)


def test_retire_relocates_live_pages_evicts_cached_and_restore_returns_them():
    mgr = KVManager(num_pages=8, page_tokens=4)
    a = [1, 2, 3, 4, 5, 6]
    mgr.admit("A", a, 2)
    prefill(mgr, "A", a)  # pages 0, 1 (A owns 1)
    mgr.admit("B", [1, 2, 3, 4, 5, 9, 9], 2)
    prefill(mgr, "B", [1, 2, 3, 4, 5, 9, 9])  # prefix [0, 1] p=5, tail page 2
    mgr.admit("C", [7, 7, 7, 7, 7], 1)
    prefill(mgr, "C", [7, 7, 7, 7, 7])  # pages 3, 4
    mgr.finish("C")  # 3, 4 cached
    copies = mgr.retire_pages(0, 4)  # live 0, 1, 2 move; cached 3 (and its child 4) evicted
    assert copies == [CopyOp("pages", 0, "pages", 20, 4), CopyOp("pages", 4, "pages", 24, 2),
                      CopyOp("pages", 8, "pages", 28, 2)]
    assert states(mgr) == "rrrrflll" and mgr.stats()["pages_retired"] == 4
    assert mgr.segments("A").tail_ids == (5, 6)
    seg_b = mgr.segments("B")
    assert (seg_b.prefix_pages, seg_b.prefix_len, seg_b.tail_ids) == ((5, 6), 5, (7,))
    assert mgr.pool.pages[6].owner == "A" and mgr.pool.pages[7].parent == 6
    assert mgr.prefix.match([1, 2, 3, 4, 5, 6]).prefix_pages == [5, 6]
    mgr.check_invariants()
    with pytest.raises(OutOfPages):
        mgr.retire_pages(5, 8)  # 3 live pages, 1 free page outside: nothing changes
    assert states(mgr) == "rrrrflll"
    assert mgr.restore_pages(0, 8) == 4 and list(mgr.pool.free_queue) == [4, 0, 1, 2, 3]
    mgr.finish("A")
    mgr.finish("B")
    mgr.check_leaks()


def test_an_admission_taken_back_leaves_the_counters_unchanged():
    mgr = KVManager(num_pages=4, page_tokens=4)
    mgr.admit("A", [1, 2, 3, 4, 5], 1)
    prefill(mgr, "A", [1, 2, 3, 4, 5])
    mgr.finish("A")
    before = mgr.counters.as_dict()
    mgr.admit("B", [1, 2, 3, 4, 5, 6], 1)  # the engine plans it, then takes it back
    mgr.release("B")
    assert mgr.counters.as_dict() == before
    mgr.admit("C", [1, 2, 3, 4, 5, 6], 1)
    prefill(mgr, "C", [1, 2, 3, 4, 5, 6])
    mgr.release("C")  # a real cancel
    assert mgr.counters.cancelled == 1 and mgr.counters.admitted == 2
