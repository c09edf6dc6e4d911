"""Taking a range of pages out of service (and back) so the memory guard can return whole pool
chunks to the OS and the pages are not handed out again while their memory is gone.

`retire_pages(pool, prefix, seqs, page_tokens, log, start, end)`: cached pages in the range are
evicted (with their cached subtrees: a cached page's children are all cached), free ones are
retired, and live ones are *relocated*: a page outside the range gets the same content (a CopyOp
the engine runs before the next step), the same key and tree position (`PrefixCache.move`,
`PagePool.relocate`), and every block table is edited to point at it (`SeqKV.replace_page`). Then
the whole range is RETIRED. Putting retired pages back in the free queue is `PagePool.restore`.
KVManager.retire_pages calls it with its own collaborators, then updates the sequences' capacities
and counts the copies; nothing here knows the manager.

With layer groups (kv/page_pool.py: a page is a head slice plus companion slices) the range is
one of slices: a cached companion goes with its page (a global one) or alone (a local part), a
live one is relocated alone, its head's companion list and the group map re-pointed, copied
with a `CopyOp` of whole slices ("slices": every layer of the slice, no group map).

Invariants: relocation preserves every sequence's view (same tokens at the same positions) and the
prefix tree; a retire that cannot find room outside the range for the live pages raises
OutOfPages before changing anything.
"""

from __future__ import annotations

from collections.abc import Collection

from edge_runtime.kv.seq_kv import PAGES, SLICES, CopyOp, SeqKV
from edge_runtime.kv.observability import EventLog
from edge_runtime.kv.page_pool import CACHED, FREE, LIVE, PagePool
from edge_runtime.kv.prefix_cache import PrefixCache
from edge_runtime.errors import OutOfPages


def _evict_subtree(pool, page) -> None:
    for cid in list(page.children):
        _evict_subtree(pool, pool.pages[cid])
    pool.evict_page(page)


def _evict_cached(pool: PagePool, page) -> None:
    """Evict a cached slice: its page's local part, or its whole page with its subtree."""
    if page.local:
        pool.evict_local(pool.pages[page.head])
    else:
        _evict_subtree(pool, page if page.head is None else pool.pages[page.head])


def _relocate(pool: PagePool, prefix: PrefixCache, seqs: Collection[SeqKV], page_tokens: int,
              log: EventLog, old_id: int, new_id: int) -> CopyOp | None:
    old, new = pool.pages[old_id], pool.pages[new_id]
    store = PAGES if pool.page_slices == 1 else SLICES
    if old.head is not None:  # a companion slice: no block table or tree names it
        n = len(pool.pages[old.head].tokens)
        pool.relocate(old_id, new_id)
        log("relocate", None, page=old_id, to=new_id, n=n)
        return CopyOp(store, old_id * page_tokens, store, new_id * page_tokens, n) if n else None
    n = len(old.tokens)
    prefix.move(old, new)
    pool.relocate(old_id, new_id)  # old: FREE, outside the free queue until retired below
    for seq in seqs:
        seq.replace_page(old_id, new_id)
        for pid in seq.tail_pages:  # reserved pages not indexed yet still name their parent
            if pool.pages[pid].parent == old_id:
                pool.pages[pid].parent = new_id
    log("relocate", None, page=old_id, to=new_id, n=n)
    return CopyOp(store, old_id * page_tokens, store, new_id * page_tokens, n) if n else None


def retire_pages(pool: PagePool, prefix: PrefixCache, seqs: Collection[SeqKV], page_tokens: int,
                 log: EventLog, start: int, end: int) -> list[CopyOp]:
    """Take pages [start, end) out of service; returns the relocation copies (block tables of
    `seqs` already point at the new pages). OutOfPages changes nothing."""
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
            _evict_cached(pool, pool.pages[i])
    pool.retire_free([i for i in in_range if pool.pages[i].state == FREE])
    new_ids = [pool.take_slice() for _ in live]
    assert not set(new_ids) & set(in_range), new_ids
    copies = [op for old, new in zip(live, new_ids)
              if (op := _relocate(pool, prefix, seqs, page_tokens, log, old, new))]
    pool.retire_free(live)
    return copies
