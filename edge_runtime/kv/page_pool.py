"""Fixed page pool: page states, reference counts, O(1) allocation/release, LRU of cached leaves.

Pure bookkeeping (no torch). A page id addresses all layers of one page of the KV tensors, or,
for a model with layer groups (kv/layer_groups.py), one group's layers: a *slice*. Then a page
that a block table holds is its head slice (the first global group's) plus companions: the
other global groups' slices, which share the head's state and reference count always, and the
local groups' slices (its *local part*), which have a count of their own: a sequence drops the
local part of a page once the page is behind its window (kv/manager.py), while it keeps the
head. `group_map[g][head]` is the slice of group g of a page (what the storage reads).

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
- Counts are in slices (a page is `page_slices` of them: 1 without groups). A live local part
  implies a live head; a cached local part (its head indexed) is evictable on its own, as the
  LRU entry of its first slice, and a head with a local part present is no leaf: the local
  part goes first. `num_available` counts whole pages an allocation can get.
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
                 "children", "indexed", "prev", "next", "head", "local", "companions",
                 "has_local")

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
        self.head: int | None = None  # a companion slice: its page's head slice
        self.local = False  # a companion slice of a local group
        self.companions: list[int] = []  # a head: the other global slices, then the local ones
        self.has_local = False  # a head: its local part is there (live or cached)

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
                 on_event: Callable[..., None] = lambda *a, **k: None, global_slices: int = 1,
                 local_slices: int = 0):
        """num_pages: slices; a page is `global_slices + local_slices` of them."""
        assert num_pages > 0, f"num_pages must be positive, got {num_pages}"
        assert global_slices >= 1 and local_slices >= 0, (global_slices, local_slices)
        self.num_pages = num_pages
        self.global_slices, self.local_slices = global_slices, local_slices
        self.page_slices = global_slices + local_slices
        # group g's slice of the page whose head is h: group_map[g][h] (identity for a plain
        # pool); an entry of a dropped local part is stale: its keys are masked, never used
        self.group_map = [list(range(num_pages)) for _ in range(self.page_slices)]
        self.map_changes: set[int] = set()  # heads whose group_map column changed since taken
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
        """Pages an allocation can get now: free slices plus every cached one (by eviction)."""
        return (self.num_free + self.num_cached) // self.page_slices

    def available_pages(self, pinned_slices: int) -> int:
        """Pages an allocation can get once `pinned_slices` cached slices are taken live."""
        return (self.num_free + self.num_cached - pinned_slices) // self.page_slices

    def cached_slices(self, page_id: int, local: bool = True) -> int:
        """Cached slices a reference to the page (with its local part when `local`) takes live."""
        page = self.pages[page_id]
        n = self.global_slices if page.state == CACHED else 0
        if local and page.has_local and self.pages[page.companions[-1]].state == CACHED:
            n += self.local_slices
        return n

    def holds_local(self, page_id: int) -> bool:
        """The page's local part is there (always, without local groups)."""
        return not self.local_slices or self.pages[page_id].has_local

    def _local_ids(self, head: Page) -> list[int]:
        return head.companions[self.global_slices - 1:] if head.has_local else []

    def _global_ids(self, head: Page) -> list[int]:
        return [head.page_id] + head.companions[:self.global_slices - 1]

    def _is_leaf(self, page: Page) -> bool:
        return not page.children and not page.has_local

    def lru_ids(self) -> list[int]:
        return self.lru.ids()

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, n: int, seq_id=None) -> list[int]:
        """n pages (each head, its global and its local slices), LIVE with ref 1, empty; free
        slices first, then LRU evictions. Returns the head ids."""
        if n > self.num_available:
            raise OutOfPages(f"need {n} KV pages but only {self.num_available} are free or "
                             f"evictable (of {self.num_pages // self.page_slices}); raise the "
                             f"pool size or wait")
        out = []
        for _ in range(n):
            ids = [self._take(seq_id) for _ in range(self.page_slices)]
            head = self.pages[ids[0]]
            head.companions, head.has_local = ids[1:], self.local_slices > 0
            for g, sid in enumerate(ids):
                self.group_map[g][ids[0]] = sid
                if g:
                    self.pages[sid].head, self.pages[sid].local = ids[0], g >= self.global_slices
            out.append(ids[0])
            self._map_changed(ids[0])
        return out

    def _map_changed(self, head: int) -> None:
        if self.page_slices > 1:  # a plain pool's map is the identity: nobody reads it
            self.map_changes.add(head)

    def take_map_changes(self) -> list[int]:
        """The heads whose group_map column changed since the last call (the storage's copy of
        the map applies them), sorted; empties the set."""
        out, self.map_changes = sorted(self.map_changes), set()
        return out

    def _take(self, seq_id) -> int:
        if not self.free_queue:
            self.evict_one()
        page = self.pages[self.free_queue.popleft()]
        assert page.state == FREE and page.ref_count == 0, page
        page.state, page.ref_count = LIVE, 1
        self.on_event("alloc", seq_id, page=page.page_id)
        return page.page_id

    def evict_one(self) -> int:
        """Evict the least recently used cached leaf (or cached local part); returns its id."""
        page = self.lru.front()
        assert page is not None, "evict_one with no evictable page"
        if page.local:
            return self.evict_local(self.pages[page.head])
        return self.evict_page(page)

    def evict_page(self, page: Page) -> int:
        """Evict one cached leaf (any position in the LRU); returns its id."""
        assert page.state == CACHED and not page.children, page
        if page.has_local:
            self.evict_local(page)
        self.lru.remove(page)
        parent_id = page.parent
        self.on_evict(page)  # unindexes it and detaches it from its parent
        self.num_cached -= self.global_slices
        self.num_evictions += 1
        self.on_event("evict", None, page=page.page_id)
        for sid in self._global_ids(page)[1:]:
            self._to_free(self.pages[sid])
        self._to_free(page)
        if parent_id != ROOT:
            parent = self.pages[parent_id]
            if parent.state == CACHED and self._is_leaf(parent):
                self.lru.push_front(parent)
        return page.page_id

    def evict_local(self, head: Page) -> int:
        """Evict the cached local part of a page (its head stays); returns the head's id."""
        local = [self.pages[i] for i in self._local_ids(head)]
        assert local and all(p.state == CACHED for p in local), (head, local)
        self.lru.remove(local[0])
        self.num_cached -= self.local_slices
        self.num_evictions += 1
        self.on_event("evict_local", None, page=head.page_id)
        for p in local:
            self._to_free(p)
        head.companions, head.has_local = head.companions[:self.global_slices - 1], False
        if head.state == CACHED and self._is_leaf(head):
            self.lru.push_front(head)  # as a parent whose last child went: next in line
        return head.page_id

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

    def take_slice(self) -> int:
        """One free slice, LIVE with ref 1, for `relocate` to move a slice into (evicting as
        needed); the caller checked there is room."""
        return self._take(None)

    def relocate(self, old_id: int, new_id: int) -> None:
        """The empty LIVE slice `new_id` takes over the bookkeeping of the LIVE slice `old_id`
        (references, owner, tokens, tree position, companions; the prefix cache's index is
        re-pointed separately, `PrefixCache.move`). `old_id` is left FREE outside the free
        queue: the caller retires it (`retire_free`), as kv/pool_shrink.py does."""
        old, new = self.pages[old_id], self.pages[new_id]
        assert old.state == LIVE and new.state == LIVE and not new.tokens, (old, new)
        new.ref_count, new.owner, new.tokens = old.ref_count, old.owner, old.tokens
        new.start, new.parent, new.children = old.start, old.parent, old.children
        new.indexed, new.head, new.local = old.indexed, old.head, old.local
        new.companions, new.has_local = old.companions, old.has_local
        if old.head is None:  # a head: its companions and the map follow it
            for g in range(self.page_slices):
                self.group_map[g][new_id] = self.group_map[g][old_id]
            self.group_map[0][new_id] = new_id
            for sid in new.companions:
                self.pages[sid].head = new_id
        else:  # a companion: its head's list and the map point at the new slice
            head = self.pages[old.head]
            i = head.companions.index(old_id)
            head.companions[i] = new_id
            self.group_map[i + 1][old.head] = new_id
        self._map_changed(new_id if new.head is None else new.head)
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
    def incref(self, page_id: int, seq_id=None, local: bool = True) -> None:
        """One more reference to a page, and to its local part when `local` (which must be
        there)."""
        page = self.pages[page_id]
        if page.state == CACHED:
            if self.lru.contains(page):
                self.lru.remove(page)
            self.num_cached -= self.global_slices
        for sid in self._global_ids(page):
            other = self.pages[sid]
            assert other.state in (LIVE, CACHED), other
            other.state = LIVE
            other.ref_count += 1
        self.on_event("ref+", seq_id, page=page_id, ref=page.ref_count)
        if local and self.local_slices:
            self.incref_local(page, seq_id)

    def incref_local(self, head: Page, seq_id=None) -> None:
        local = [self.pages[i] for i in self._local_ids(head)]
        assert local, f"page {head.page_id}'s local part is not there"
        if local[0].state == CACHED:
            self.lru.remove(local[0])
            self.num_cached -= self.local_slices
        for p in local:
            p.state = LIVE
            p.ref_count += 1
        self.on_event("ref+local", seq_id, page=head.page_id, ref=local[0].ref_count)

    def decref(self, page_id: int, seq_id=None, evict_first: bool = False,
               local: bool = True) -> None:
        """Drop one reference (and one to the local part when `local`); at 0 an indexed page
        becomes CACHED, any other page FREE. `evict_first`: it enters the LRU as the next to
        evict (its content is also elsewhere)."""
        page = self.pages[page_id]
        assert page.state == LIVE and page.ref_count > 0, page
        if local and self.local_slices:
            self.decref_local(page_id, seq_id, evict_first)
        for sid in self._global_ids(page):
            self.pages[sid].ref_count -= 1
        if page.owner == seq_id:
            page.owner = None
        self.on_event("ref-", seq_id, page=page_id, ref=page.ref_count)
        if page.ref_count:
            return
        page.owner = None
        if page.indexed:
            for sid in self._global_ids(page):
                self.pages[sid].state = CACHED
            self.num_cached += self.global_slices
            if self._is_leaf(page):
                (self.lru.push_front if evict_first else self.lru.push_back)(page)
        else:
            assert not page.children and not page.has_local, f"unindexed page with children: {page}"
            self.on_event("free", seq_id, page=page_id)
            for sid in self._global_ids(page)[1:]:
                self._to_free(self.pages[sid])
            self._to_free(page)

    def decref_local(self, page_id: int, seq_id=None, evict_first: bool = False) -> None:
        """Drop one reference to a page's local part (the head keeps its own); at 0 the part is
        CACHED when the page is indexed, else FREE."""
        head = self.pages[page_id]
        local = [self.pages[i] for i in self._local_ids(head)]
        assert local and local[0].state == LIVE and local[0].ref_count > 0, (head, local)
        for p in local:
            p.ref_count -= 1
        self.on_event("ref-local", seq_id, page=page_id, ref=local[0].ref_count)
        if local[0].ref_count:
            return
        if head.indexed:
            for p in local:
                p.state = CACHED
            self.num_cached += self.local_slices
            (self.lru.push_front if evict_first else self.lru.push_back)(local[0])
            return
        for p in local:
            self._to_free(p)
        head.companions, head.has_local = head.companions[:self.global_slices - 1], False

    # -- checks -------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        counts = {FREE: 0, CACHED: 0, LIVE: 0, RETIRED: 0}
        for page in self.pages:
            counts[page.state] += 1
            assert (page.ref_count > 0) == (page.state == LIVE), page
            if page.state in (FREE, RETIRED):
                assert not page.tokens and not page.indexed and not page.children, page
                assert page.head is None and not page.companions and not page.has_local, page
            elif page.head is None:
                self._check_page(page)
            else:  # a companion: its head names it (and _check_page the rest)
                assert page.page_id in self.pages[page.head].companions, page
            if page.state == CACHED:
                head = page if page.head is None else self.pages[page.head]
                assert head.indexed and page.owner is None, page
                first = page.head is None or (page.local and head.companions.index(
                    page.page_id) == self.global_slices - 1)
                leaf = self._is_leaf(page) if page.head is None else page.local
                assert self.lru.contains(page) == (first and leaf), page
            else:
                assert not self.lru.contains(page), page
        assert counts[FREE] == len(self.free_queue) == len(set(self.free_queue)), counts
        assert all(self.pages[i].state == FREE for i in self.free_queue)
        assert counts[CACHED] == self.num_cached, (counts, self.num_cached)
        assert counts[RETIRED] == self.num_retired, (counts, self.num_retired)
        assert sum(counts.values()) == self.num_pages
        assert len(self.lru.ids()) == self.lru.size

    def _check_page(self, head: Page) -> None:
        """A live or cached head: its companions mirror it (global) or each other (local), and
        the group map names them."""
        n = self.page_slices - 1 if head.has_local else self.global_slices - 1
        assert len(head.companions) == n, head
        ids = [head.page_id] + head.companions
        for g, sid in enumerate(ids):
            assert self.group_map[g][head.page_id] == sid, (head, g, sid)
            other = self.pages[sid]
            if g:
                assert other.head == head.page_id and other.local == (g >= self.global_slices), \
                    (head, other)
                assert not other.tokens and not other.children and not other.indexed, other
            ref = ids[0] if g < self.global_slices else ids[self.global_slices]
            assert (other.state, other.ref_count) == (self.pages[ref].state,
                                                      self.pages[ref].ref_count), (head, other)
        if head.has_local:
            local = self.pages[ids[self.global_slices]]
            assert local.state != LIVE or head.state == LIVE, f"live local part of {head}"
            assert local.state in (LIVE, CACHED), local
        if self.local_slices == 0:
            assert not head.has_local, head
