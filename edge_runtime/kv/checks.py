"""Whole-manager invariant checks and the stats gauges of KVManager (no torch).

`check_manager` is the leak/consistency check run after every step in tests and whenever the
engine is idle. It raises AssertionError with the offending values (and a pool dump) on failure.
Both read only KVManager's public state (the class docstring lists it) and change nothing.
"""

from __future__ import annotations

from collections import Counter

from edge_runtime.kv.layer_groups import pages_behind
from edge_runtime.kv.seq_kv import INLINE


def _check_seq(mgr, seq) -> None:
    P, p, pages = mgr.page_tokens, seq.prefix_len, mgr.pool.pages
    toks = seq.token_ids
    assert seq.num_tokens <= seq.capacity, (seq.seq_id, seq.num_tokens, seq.capacity)
    assert p <= seq.num_tokens, (seq.seq_id, p, seq.num_tokens)
    assert len(seq.prefix_pages) == -(-p // P), (seq.seq_id, seq.prefix_pages, p)
    for i, pid in enumerate(seq.prefix_pages):
        page, lo = pages[pid], i * P
        assert page.start == lo, f"prefix page {page} of {seq.seq_id!r} not at {lo}"
        hi = min(p, lo + P)
        assert page.tokens[: hi - lo] == toks[lo:hi], f"prefix page {pid} differs from {seq.seq_id!r}"
    if seq.tail_kind == INLINE:
        start, S = seq.inline_start(P), mgr.inline_tokens
        assert seq.inline_slots, seq.seq_id
        for i, slot in enumerate(seq.inline_slots):
            mine = max(0, min(S, seq.num_tokens - start - i * S))
            assert mgr.arena.num_tokens[slot] >= mine, (seq.seq_id, slot, mine)
            if mgr.arena.owner[slot] == seq.seq_id:
                assert mgr.arena.num_tokens[slot] == mine, (seq.seq_id, slot, mine)
            else:
                assert i == len(seq.inline_slots) - 1 or mine == S, (seq.seq_id, slot)
    else:
        assert not seq.inline_slots, seq.seq_id
    for i, pid in enumerate(seq.tail_pages):
        page, lo = pages[pid], p + i * P
        assert page.start == lo, f"tail page {page} of {seq.seq_id!r} not at {lo}"
        hi = min(seq.num_tokens, lo + P)
        if hi > lo:
            assert page.tokens[: hi - lo] == toks[lo:hi], f"tail page {pid} differs from {seq.seq_id!r}"
        if seq.tail_kind == INLINE and hi - lo < P:  # only an owned last page being filled
            assert i == len(seq.tail_pages) - 1 and page.owner == seq.seq_id, \
                f"tail page {pid} before inline slots of {seq.seq_id!r} neither full nor ours"
        if page.owner == seq.seq_id:
            assert len(page.tokens) == max(0, hi - lo), f"owner {seq.seq_id!r} out of step: {page}"
            assert i == len(seq.tail_pages) - 1 or len(page.tokens) == P, page


def _check_local(mgr, seq) -> None:
    """Layer groups: a sequence holds the local part of exactly its pages in its window."""
    if mgr.local_window is None:
        assert seq.local_from == 0, (seq.seq_id, seq.local_from)
        return
    assert seq.num_cached_tokens <= seq.read_from <= seq.num_tokens, (seq.seq_id, seq.read_from)
    behind = pages_behind(seq, mgr.page_tokens, mgr.local_window, seq.read_from)
    assert seq.local_from == behind, \
        f"{seq.seq_id!r} holds local parts from page {seq.local_from}, {behind} are behind"


def check_manager(mgr) -> None:
    mgr.pool.check_invariants()
    mgr.prefix.check_invariants()
    mgr.arena.check_invariants()
    page_refs, slot_refs, local_refs = Counter(), Counter(), Counter()
    for seq in mgr.seqs.values():
        assert len(set(seq.all_pages())) == len(seq.all_pages()), f"page twice in {seq.seq_id!r}"
        page_refs.update(seq.all_pages())
        _check_local(mgr, seq)
        local_refs.update(seq.all_pages()[seq.local_from:])
        assert len(set(seq.inline_slots)) == len(seq.inline_slots), f"slot twice in {seq.seq_id!r}"
        slot_refs.update(seq.inline_slots)
        _check_seq(mgr, seq)
    for page in mgr.pool.pages:
        if page.head is not None:  # a companion slice: checked with its page (below, pool)
            continue
        assert page.ref_count == page_refs[page.page_id], \
            f"page {page.page_id}: ref {page.ref_count} != {page_refs[page.page_id]} block tables"
        if page.has_local:
            local = mgr.pool.pages[page.companions[-1]]
            assert local.ref_count == local_refs[page.page_id], \
                f"page {page.page_id}'s local part: ref {local.ref_count} != " \
                f"{local_refs[page.page_id]} block tables in its window"
        else:
            assert not local_refs[page.page_id] or not mgr.pool.local_slices, \
                f"page {page.page_id} read in a window without its local part"
        if page.owner is not None:
            owner = mgr.seqs.get(page.owner)
            assert owner is not None and page.page_id in owner.tail_pages, page
    for slot in range(mgr.arena.num_slots):
        assert mgr.arena.ref_count[slot] == slot_refs[slot], (slot, mgr.arena.ref_count[slot])
        own = mgr.arena.owner[slot]
        assert own is None or slot in mgr.seqs[own].inline_slots, (slot, own)
    held = [(s.window, s.seq_id) for s in mgr.seqs.values() if s.window is not None]
    assert len({w for w, _ in held}) == len(held), f"a window held twice: {held}"
    mgr.windows.check_invariants(dict(held))
    for seq in mgr.seqs.values():
        assert seq.window_start <= seq.num_tokens, (seq.seq_id, seq.window_start, seq.num_tokens)
        if seq.window is not None:  # the read rule's blocks start at or after it
            assert seq.window_start % mgr.windows.window_tokens == 0, \
                (seq.seq_id, seq.window_start, mgr.windows.window_tokens)


def manager_stats(mgr) -> dict:
    pool, c = mgr.pool, mgr.counters
    held = (pool.num_live + pool.num_cached) // pool.page_slices  # whole pages' worth
    tokens_held = sum(len(pg.tokens) for pg in pool.pages if pg.state != "free")
    local_held = sum(1 for pg in pool.pages if pg.local and pg.state in ("live", "cached"))
    return {
        "pages_total": pool.num_pages,
        "pages_free": pool.num_free,
        "pages_cached": pool.num_cached,
        "pages_live": pool.num_live,
        "pages_retired": pool.num_retired,
        "inline_slots_total": mgr.arena.num_slots,
        "inline_slots_used": mgr.arena.num_used,
        "windows_total": mgr.windows.num_windows,
        "windows_used": mgr.windows.num_used,
        "window_tokens": mgr.windows.window_tokens,
        "running_sequences": len(mgr.seqs),
        "tokens_in_pages": tokens_held,
        "page_utilization": tokens_held / (held * mgr.page_tokens) if held else 0.0,
        "prefix_hit_rate": c.cached_prompt_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
        "evictions": pool.num_evictions,
        "page_slices": pool.page_slices,  # slices per page: 1 without layer groups
        "local_slices_held": local_held,  # layer groups: live + cached slices of local groups
        **c.as_dict(),
    }
