"""Taking a range of pages out of service (and back) so the memory guard can return whole pool
chunks to the OS and the pages are not handed out again while their memory is gone.

`retire_pages(mgr, start, end)`: cached pages in the range are evicted (with their cached
subtrees: a cached page's children are all cached), free ones are retired, and live ones are
*relocated*: a page outside the range gets the same content (a CopyOp the engine runs before the
next step), the same key and tree position, and every block table is edited to point at it. Then
the whole range is RETIRED. `restore_pages` puts retired pages back in the free queue.

Invariants: relocation preserves every sequence's view (same tokens at the same positions) and the
prefix tree; a retire that cannot find room outside the range for the live pages raises
OutOfPages before changing anything.
"""

from __future__ import annotations

from edge_runtime.cache.kv_types import PAGES, CopyOp
from edge_runtime.cache.page_pool import CACHED, FREE, LIVE
from edge_runtime.errors import OutOfPages


def _evict_subtree(pool, page) -> None:
    for cid in list(page.children):
        _evict_subtree(pool, pool.pages[cid])
    pool.evict_page(page)


def _relocate(mgr, old_id: int, new_id: int) -> CopyOp | None:
    pool, P = mgr.pool, mgr.page_tokens
    old, new = pool.pages[old_id], pool.pages[new_id]
    assert old.state == LIVE and new.state == LIVE and not new.tokens, (old, new)
    mgr.prefix.move(old, new)
    new.ref_count, new.owner, new.tokens = old.ref_count, old.owner, old.tokens
    new.start, new.parent, new.children, new.indexed = old.start, old.parent, old.children, old.indexed
    for seq in mgr.seqs.values():
        for table in (seq.prefix_pages, seq.tail_pages):
            if old_id in table:
                table[table.index(old_id)] = new_id
        for pid in seq.tail_pages:  # reserved pages not indexed yet still name their parent
            if pool.pages[pid].parent == old_id:
                pool.pages[pid].parent = new_id
    n = len(old.tokens)
    old.reset()  # FREE, outside the free queue until retired below
    mgr.log("relocate", None, page=old_id, to=new_id, n=n)
    return CopyOp(PAGES, old_id * P, PAGES, new_id * P, n) if n else None


def retire_pages(mgr, start: int, end: int) -> list[CopyOp]:
    pool = mgr.pool
    if not 0 <= start <= end <= pool.num_pages:
        raise ValueError(f"page range [{start}, {end}) is not inside the pool of {pool.num_pages}")
    in_range = range(start, end)
    live = [i for i in in_range if pool.pages[i].state == LIVE]
    room = sum(1 for p in pool.pages if p.page_id not in in_range and p.state in (FREE, CACHED))
    if len(live) > room:
        raise OutOfPages(f"cannot retire pages [{start}, {end}): {len(live)} live pages need a "
                         f"new place and only {room} pages outside the range are free or evictable")
    for i in in_range:
        if pool.pages[i].state == CACHED:
            _evict_subtree(pool, pool.pages[i])
    pool.retire_free([i for i in in_range if pool.pages[i].state == FREE])
    new_ids = pool.allocate(len(live))
    assert not set(new_ids) & set(in_range), new_ids
    copies = [op for old, new in zip(live, new_ids) if (op := _relocate(mgr, old, new))]
    pool.retire_free(live)
    for seq in mgr.seqs.values():
        mgr._update_capacity(seq)
    mgr.counters.copies += len(copies)
    mgr.counters.copied_tokens += sum(op.num_tokens for op in copies)
    return copies


def restore_pages(mgr, start: int, end: int) -> int:
    return mgr.pool.restore(range(start, end))
