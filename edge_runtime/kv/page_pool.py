"""Fixed page pool: page states, reference counts, O(1) allocation/release, LRU of cached leaves.

Pure bookkeeping (no torch). A page id addresses all layers of one page of the KV tensors.

Invariants (`check_invariants`):
- Every page is in exactly one state: FREE (ref 0, no content), CACHED (ref 0, content valid and
  indexed by the prefix cache, evictable), LIVE (ref > 0) or RETIRED (taken out of service so the
  memory guard can return its memory to the OS; see pool_shrink.py);
  free + cached + live + retired == num_pages.
- The free queue holds exactly the FREE pages (FIFO: a released page is reused last).
- The LRU list (intrusive, doubly linked: O(1) removal from the middle) holds exactly the CACHED
  pages without children in the prefix tree. Eviction takes its head, so leaves always go before
  their parents. A live child implies a live parent (a sequence holds its whole chain), so every
  cached page is reachable by repeated leaf eviction: `num_available == free + cached` is exact.
- When the last child of a cached page is evicted, the page becomes a leaf and enters the LRU at
  its head (next to go): its whole subtree was just evicted as least recently used, and every use
  of a descendant also used it, so it is no more recent than that subtree.
- A failed allocation (OutOfPages) changes nothing.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from edge_runtime.errors import OutOfPages

FREE, CACHED, LIVE, RETIRED = "free", "cached", "live", "retired"
ROOT = -1  # parent id of a page that starts at position 0


class Page:
    """One page's bookkeeping. `tokens` are the token ids whose K/V the page holds, in order."""

    __slots__ = ("page_id", "ref_count", "state", "owner", "tokens", "start", "parent",
                 "children", "indexed", "prev", "next")

    def __init__(self, page_id: int):
        self.page_id = page_id
        self.prev: Optional[Page] = None
        self.next: Optional[Page] = None
        self.reset()

    def reset(self) -> None:
        self.ref_count = 0
        self.state = FREE
        self.owner = None  # the one sequence allowed to append in place, or None
        self.tokens: list[int] = []
        self.start = 0  # absolute position of the page's slot 0
        self.parent = ROOT  # page the chain continues from (see prefix_cache.py)
        self.children: set[int] = set()
        self.indexed = False

    def __repr__(self) -> str:
        return (f"Page({self.page_id}, {self.state}, ref={self.ref_count}, owner={self.owner}, "
                f"start={self.start}, n={len(self.tokens)}, parent={self.parent})")


class _LRU:
    """Intrusive doubly linked list of pages with a sentinel; head = least recently used."""

    def __init__(self):
        self.sentinel = Page(-2)
        self.sentinel.prev = self.sentinel.next = self.sentinel
        self.size = 0

    def _link(self, page: Page, before: Page) -> None:
        assert page.prev is None and page.next is None, f"page {page.page_id} already linked"
        page.prev, page.next = before.prev, before
        before.prev.next = page
        before.prev = page
        self.size += 1

    def push_back(self, page: Page) -> None:  # most recently used
        self._link(page, self.sentinel)

    def push_front(self, page: Page) -> None:  # next to evict
        self._link(page, self.sentinel.next)

    def remove(self, page: Page) -> None:
        assert page.prev is not None and page.next is not None, f"page {page.page_id} not linked"
        page.prev.next, page.next.prev = page.next, page.prev
        page.prev = page.next = None
        self.size -= 1

    def contains(self, page: Page) -> bool:
        return page.prev is not None

    def front(self) -> Optional[Page]:
        return None if self.size == 0 else self.sentinel.next

    def ids(self) -> list[int]:
        out, node = [], self.sentinel.next
        while node is not self.sentinel:
            out.append(node.page_id)
            node = node.next
        return out


class PagePool:
    """`num_pages` pages; `on_evict(page)` lets the prefix cache unindex a page before reuse."""

    def __init__(self, num_pages: int, on_evict: Callable[[Page], None] = lambda page: None,
                 on_event: Callable[..., None] = lambda *a, **k: None):
        assert num_pages > 0, f"num_pages must be positive, got {num_pages}"
        self.num_pages = num_pages
        self.pages = [Page(i) for i in range(num_pages)]
        self.free_queue: deque[int] = deque(range(num_pages))
        self.lru = _LRU()
        self.num_cached = 0
        self.num_retired = 0
        self.num_evictions = 0
        self.on_evict = on_evict
        self.on_event = on_event

    # -- counts -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_live(self) -> int:
        return self.num_pages - self.num_free - self.num_cached - self.num_retired

    @property
    def num_available(self) -> int:
        """Pages an allocation can get now: free ones plus every cached one (by eviction)."""
        return self.num_free + self.num_cached

    def lru_ids(self) -> list[int]:
        return self.lru.ids()

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, n: int, seq_id=None) -> list[int]:
        """n pages, LIVE with ref 1, empty; free pages first, then LRU evictions."""
        if n > self.num_available:
            raise OutOfPages(f"need {n} KV pages but only {self.num_available} are free or "
                             f"evictable (of {self.num_pages}); raise the pool size or wait")
        out = []
        for _ in range(n):
            if not self.free_queue:
                self.evict_one()
            page = self.pages[self.free_queue.popleft()]
            assert page.state == FREE and page.ref_count == 0, page
            page.state, page.ref_count = LIVE, 1
            out.append(page.page_id)
            self.on_event("alloc", seq_id, page=page.page_id)
        return out

    def evict_one(self) -> int:
        """Evict the least recently used cached leaf; returns its id."""
        page = self.lru.front()
        assert page is not None, "evict_one with no evictable page"
        return self.evict_page(page)

    def evict_page(self, page: Page) -> int:
        """Evict one cached leaf (any position in the LRU); returns its id."""
        assert page.state == CACHED and not page.children, page
        self.lru.remove(page)
        parent_id = page.parent
        self.on_evict(page)  # unindexes it and detaches it from its parent
        self.num_cached -= 1
        self.num_evictions += 1
        self.on_event("evict", None, page=page.page_id)
        self._to_free(page)
        if parent_id != ROOT:
            parent = self.pages[parent_id]
            if parent.state == CACHED and not parent.children:
                self.lru.push_front(parent)
        return page.page_id

    def evict(self, max_pages: Optional[int] = None) -> int:
        """Evict up to max_pages cached pages (all when None), LRU leaves first."""
        count = 0
        while self.num_cached and (max_pages is None or count < max_pages):
            self.evict_one()
            count += 1
        return count

    def _to_free(self, page: Page) -> None:
        page.reset()
        self.free_queue.append(page.page_id)

    def retire_free(self, page_ids) -> None:
        """FREE pages (in the free queue or just vacated) -> RETIRED: never allocated again."""
        ids = set(page_ids)
        assert all(self.pages[i].state == FREE for i in ids), [self.pages[i] for i in ids]
        self.free_queue = deque(i for i in self.free_queue if i not in ids)
        for i in sorted(ids):
            self.pages[i].state = RETIRED
            self.on_event("retire", None, page=i)
        self.num_retired += len(ids)

    def relocate(self, old_id: int, new_id: int) -> None:
        """The empty LIVE page `new_id` takes over the bookkeeping of the LIVE page `old_id`
        (references, owner, tokens, tree position; the prefix cache's index is re-pointed
        separately, `PrefixCache.move`). `old_id` is left FREE outside the free queue: the
        caller retires it (`retire_free`), as kv/pool_shrink.py does."""
        old, new = self.pages[old_id], self.pages[new_id]
        assert old.state == LIVE and new.state == LIVE and not new.tokens, (old, new)
        new.ref_count, new.owner, new.tokens = old.ref_count, old.owner, old.tokens
        new.start, new.parent, new.children = old.start, old.parent, old.children
        new.indexed = old.indexed
        old.reset()

    def restore(self, page_ids) -> int:
        """RETIRED pages -> FREE (at the back of the free queue); returns how many."""
        ids = [i for i in page_ids if self.pages[i].state == RETIRED]
        for i in ids:
            self.pages[i].state = FREE
            self.free_queue.append(i)
            self.on_event("restore", None, page=i)
        self.num_retired -= len(ids)
        return len(ids)

    # -- references ---------------------------------------------------------------------------
    def incref(self, page_id: int, seq_id=None) -> None:
        page = self.pages[page_id]
        if page.state == CACHED:
            if self.lru.contains(page):
                self.lru.remove(page)
            self.num_cached -= 1
            page.state = LIVE
        assert page.state == LIVE, page
        page.ref_count += 1
        self.on_event("ref+", seq_id, page=page_id, ref=page.ref_count)

    def decref(self, page_id: int, seq_id=None, evict_first: bool = False) -> None:
        """Drop one reference; at 0 an indexed page becomes CACHED, any other page FREE.
        `evict_first`: it enters the LRU as the next to evict (its content is also elsewhere)."""
        page = self.pages[page_id]
        assert page.state == LIVE and page.ref_count > 0, page
        page.ref_count -= 1
        if page.owner == seq_id:
            page.owner = None
        self.on_event("ref-", seq_id, page=page_id, ref=page.ref_count)
        if page.ref_count:
            return
        page.owner = None
        if page.indexed:
            page.state = CACHED
            self.num_cached += 1
            if not page.children:
                (self.lru.push_front if evict_first else self.lru.push_back)(page)
        else:
            assert not page.children, f"unindexed page with children: {page}"
            self.on_event("free", seq_id, page=page_id)
            self._to_free(page)

    # -- checks -------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        counts = {FREE: 0, CACHED: 0, LIVE: 0, RETIRED: 0}
        for page in self.pages:
            counts[page.state] += 1
            assert (page.ref_count > 0) == (page.state == LIVE), page
            if page.state in (FREE, RETIRED):
                assert not page.tokens and not page.indexed and not page.children, page
            if page.state == CACHED:
                assert page.indexed and page.owner is None, page
                assert self.lru.contains(page) == (not page.children), page
            else:
                assert not self.lru.contains(page), page
        assert counts[FREE] == len(self.free_queue) == len(set(self.free_queue)), counts
        assert all(self.pages[i].state == FREE for i in self.free_queue)
        assert counts[CACHED] == self.num_cached, (counts, self.num_cached)
        assert counts[RETIRED] == self.num_retired, (counts, self.num_retired)
        assert sum(counts.values()) == self.num_pages
        assert len(self.lru.ids()) == self.lru.size
