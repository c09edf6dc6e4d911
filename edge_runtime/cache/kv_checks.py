"""Whole-manager invariant checks and the stats gauges of KVManager (no torch).

`check_manager` is the leak/consistency check run after every step in tests and whenever the
engine is idle. It raises AssertionError with the offending values (and a pool dump) on failure.
"""

from __future__ import annotations

from collections import Counter

from edge_runtime.cache.kv_types import INLINE


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
        assert not seq.tail_pages and seq.inline_slot is not None, seq.seq_id
        assert mgr.arena.num_tokens[seq.inline_slot] >= seq.num_tokens - p, seq.seq_id
        if mgr.arena.owner[seq.inline_slot] == seq.seq_id:
            assert mgr.arena.num_tokens[seq.inline_slot] == seq.num_tokens - p, seq.seq_id
        return
    assert seq.inline_slot is None, seq.seq_id
    for i, pid in enumerate(seq.tail_pages):
        page, lo = pages[pid], p + i * P
        assert page.start == lo, f"tail page {page} of {seq.seq_id!r} not at {lo}"
        hi = min(seq.num_tokens, lo + P)
        if hi > lo:
            assert page.tokens[: hi - lo] == toks[lo:hi], f"tail page {pid} differs from {seq.seq_id!r}"
        if page.owner == seq.seq_id:
            assert len(page.tokens) == max(0, hi - lo), f"owner {seq.seq_id!r} out of step: {page}"
            assert i == len(seq.tail_pages) - 1 or len(page.tokens) == P, page


def check_manager(mgr) -> None:
    mgr.pool.check_invariants()
    mgr.prefix.check_invariants()
    mgr.arena.check_invariants()
    page_refs, slot_refs = Counter(), Counter()
    for seq in mgr.seqs.values():
        assert len(set(seq.all_pages())) == len(seq.all_pages()), f"page twice in {seq.seq_id!r}"
        page_refs.update(seq.all_pages())
        if seq.inline_slot is not None:
            slot_refs[seq.inline_slot] += 1
        _check_seq(mgr, seq)
    for page in mgr.pool.pages:
        assert page.ref_count == page_refs[page.page_id], \
            f"page {page.page_id}: ref {page.ref_count} != {page_refs[page.page_id]} block tables"
        if page.owner is not None:
            owner = mgr.seqs.get(page.owner)
            assert owner is not None and page.page_id in owner.tail_pages, page
    for slot in range(mgr.arena.num_slots):
        assert mgr.arena.ref_count[slot] == slot_refs[slot], (slot, mgr.arena.ref_count[slot])
        own = mgr.arena.owner[slot]
        assert own is None or mgr.seqs[own].inline_slot == slot, (slot, own)


def manager_stats(mgr) -> dict:
    pool, c = mgr.pool, mgr.counters
    held = pool.num_live + pool.num_cached
    tokens_held = sum(len(pg.tokens) for pg in pool.pages if pg.state != "free")
    return {
        "pages_total": pool.num_pages,
        "pages_free": pool.num_free,
        "pages_cached": pool.num_cached,
        "pages_live": pool.num_live,
        "pages_retired": pool.num_retired,
        "inline_slots_total": mgr.arena.num_slots,
        "inline_slots_used": mgr.arena.num_used,
        "running_sequences": len(mgr.seqs),
        "tokens_in_pages": tokens_held,
        "page_utilization": tokens_held / (held * mgr.page_tokens) if held else 0.0,
        "prefix_hit_rate": c.cached_prompt_tokens / c.prompt_tokens if c.prompt_tokens else 0.0,
        "evictions": pool.num_evictions,
        **c.as_dict(),
    }
