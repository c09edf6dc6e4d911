"""TailAllocator: storage for the private tail of each sequence: pages, inline slots,
copy-on-write (no torch).

KVManager owns one and calls its public methods; the allocator holds no sequence table of its own:
it works on the SeqKV it is given, with the collaborators passed to its constructor (the page pool,
the prefix cache, the inline arena, the counters, the event log and the low-free-pages dump), which
it shares with the manager.

Invariants: only a page's or slot's owner writes into it (at its end); anyone else gets a copy
first, and every copy it plans is counted (`count_copy`); a failed allocation raises OutOfPages
before anything changes; after every change to a tail, `update_capacity` has set the sequence's
capacity (positions it may write without another `grow`).

Where the end of a tail goes. A tail is full pages plus, at its end, either a page being filled
or up to a page's worth of inline slots. Slots are chosen for the end of a tail that continues
cached history (`num_cached_tokens > 0`: its new tokens are this stream's own turn, which nobody
else will match while it runs) when everything the sequence can still write from the last page
boundary on (`prompt_len + max_new_tokens - boundary`) fits in fewer slots than a page
(`slot_plan`): a voice turn whose history just crossed a page boundary then holds one 128-token
slot for its last ~40 tokens instead of a second 512-token page. A fresh prompt with nothing cached
keeps pages (its first tokens, e.g. a system prompt, are indexed as they are written, so requests
arriving together share them), except a short one that fits one slot whole (the original inline
path). Slots are indexed by nobody: at finish `inline_end_to_page` moves an inline end into a page
for the next turn.
"""

from __future__ import annotations

from edge_runtime.kv.inline_arena import InlineArena
from edge_runtime.kv.seq_kv import INLINE, PAGES, CopyOp, SeqKV
from edge_runtime.kv.observability import EventLog, KVCounters, LowFreePagesDump
from edge_runtime.kv.page_math import ceil_div
from edge_runtime.kv.page_pool import CACHED, LIVE, ROOT, PagePool
from edge_runtime.kv.prefix_cache import PrefixCache
from edge_runtime.errors import OutOfPages


class TailAllocator:
    """Public methods, all called by KVManager: `pages_needed` and `slot_plan` (planning an
    admission), `grow` (reserve), `update_capacity` (after admit, fork and a retire),
    `inline_end_to_page` (finish) and `count_copy`."""

    def __init__(self, pool: PagePool, prefix: PrefixCache, arena: InlineArena,
                 counters: KVCounters, log: EventLog, low_free_dump: LowFreePagesDump,
                 page_tokens: int, enable_prefix_cache: bool, enable_inline: bool):
        self.pool = pool
        self.prefix = prefix
        self.arena = arena
        self.counters = counters
        self.log = log
        self.low_free_dump = low_free_dump
        self.page_tokens = page_tokens
        self.inline_tokens = arena.slot_tokens  # tokens per inline slot
        self.enable_prefix_cache = enable_prefix_cache
        self.enable_inline = enable_inline

    def pages_needed(self, seq: SeqKV, target: int, owns_last: bool) -> tuple[int, bool]:
        """(new pages, copy-on-write of the last tail page) to hold positions [0, target)."""
        P, p, have = self.page_tokens, seq.prefix_len, len(seq.tail_pages)
        used = seq.num_tokens - p  # committed tail tokens
        cow = have > 0 and target > seq.num_tokens and used < have * P and not owns_last
        return max(0, ceil_div(target - p, P) - have) + int(cow), cow

    def slot_plan(self, seq: SeqKV, target: int, owns_last: bool) -> int | None:
        """Slots to hold a page tail's end [boundary, target) instead of pages, or None.

        The boundary is the end of the tail's last page when that page is full or ours (we fill
        it first), or its start when it is partial and shared (it is copied into the slots rather
        than into a page of our own). Applies to a tail continuing cached history when the
        sequence's whole possible remainder from the boundary fits in fewer slots than a page and
        the slots are free now."""
        if not (self.enable_inline and seq.num_cached_tokens > 0 and seq.tail_kind == PAGES):
            return None
        P, S, p, have = self.page_tokens, self.inline_tokens, seq.prefix_len, len(seq.tail_pages)
        full = (seq.num_tokens - p) // P
        if have > full + 1:
            return None  # pages reserved ahead: keep using them
        shared_partial = have == full + 1 and not owns_last
        boundary = p + (full if shared_partial else have) * P
        most = max(target, seq.prompt_len + seq.max_new_tokens) - boundary
        n = ceil_div(target - boundary, S)
        if target <= boundary or most > P - S or n > self.arena.num_free:
            return None
        return n

    def update_capacity(self, seq: SeqKV) -> None:
        """Set `seq.capacity` from its tail: the end of what it owns, or where its shared part
        ends (it copies before writing past that)."""
        p, P, S = seq.prefix_len, self.page_tokens, self.inline_tokens
        if seq.tail_kind == INLINE:
            owns = self.arena.owner[seq.inline_slots[-1]] == seq.seq_id
            end = seq.inline_start(P) + len(seq.inline_slots) * S
            seq.capacity = end if owns else seq.num_tokens
            return
        have = len(seq.tail_pages)
        owns = have and self.pool.pages[seq.tail_pages[-1]].owner == seq.seq_id
        seq.capacity = p + have * P if owns else max(seq.num_tokens, p + (have - 1) * P, p)
        if have and seq.num_tokens - p == have * P:
            seq.capacity = p + have * P  # last page full: nothing more to write into it

    def _check_available(self, n: int, seq_id) -> None:
        if n > self.pool.num_available:
            self.counters.failed_allocations += 1
            raise OutOfPages(f"sequence {seq_id!r} needs {n} more KV pages, "
                             f"{self.pool.num_available} are free or evictable")

    def _allocate(self, n: int, seq_id) -> list[int]:
        ids = self.pool.allocate(n, seq_id)
        self.low_free_dump.after_allocation(self.pool.num_free)
        return ids

    def _new_tail_page(self, seq: SeqKV, pid: int, tokens: list[int]) -> None:
        page = self.pool.pages[pid]
        page.owner, page.start = seq.seq_id, seq.prefix_len + len(seq.tail_pages) * self.page_tokens
        if seq.tail_pages:
            page.parent = seq.tail_pages[-1]
        else:
            page.parent = seq.prefix_pages[-1] if seq.prefix_pages else ROOT
        page.tokens = list(tokens)
        seq.tail_pages.append(pid)
        if tokens and self.enable_prefix_cache:
            self.prefix.register(page)

    def count_copy(self, op: CopyOp) -> CopyOp:
        """Count a copy the engine will run (counters and event log); returns it unchanged."""
        self.counters.copies += 1
        self.counters.copied_tokens += op.num_tokens
        self.log("copy", None, src=(op.src_store, op.src_slot_start),
                 dst=(op.dst_store, op.dst_slot_start), n=op.num_tokens)
        return op

    def grow(self, seq: SeqKV, target: int) -> list[CopyOp]:
        """Storage for positions [0, target) when `target > seq.capacity`; returns the copies
        to run first. OutOfPages (nothing changed) when the pages are not there."""
        if seq.tail_kind == INLINE:
            return self._grow_inline(seq, target)
        return self._grow_pages(seq, target)

    def _grow_pages(self, seq: SeqKV, target: int) -> list[CopyOp]:
        P, p = self.page_tokens, seq.prefix_len
        owns = bool(seq.tail_pages) and self.pool.pages[seq.tail_pages[-1]].owner == seq.seq_id
        n_slots = self.slot_plan(seq, target, owns_last=owns)
        if n_slots is not None:
            return self._pages_to_slots(seq, n_slots)
        n_new, cow = self.pages_needed(seq, target, owns_last=owns)
        self._check_available(n_new, seq.seq_id)
        new_ids, copies = self._allocate(n_new, seq.seq_id), []
        if cow:
            src = self.pool.pages[seq.tail_pages.pop()]
            used = seq.num_tokens - p - len(seq.tail_pages) * P
            dst = new_ids.pop(0)
            copies.append(self.count_copy(CopyOp(PAGES, src.page_id * P, PAGES, dst * P, used)))
            self._new_tail_page(seq, dst, src.tokens[:used])
            self.pool.decref(src.page_id, seq.seq_id)
        for pid in new_ids:
            self._new_tail_page(seq, pid, [])
        self.update_capacity(seq)
        return copies

    def _pages_to_slots(self, seq: SeqKV, n_slots: int) -> list[CopyOp]:
        """Continue a page tail in `n_slots` new slots after its last page (an owned partial
        last page is filled first); a shared partial last page is copied into the slots instead
        (copy-on-write into slots) and remembered, so `finish` can append to it in place."""
        P, S = self.page_tokens, self.inline_tokens
        slots = [self.arena.allocate(seq.seq_id) for _ in range(n_slots)]
        copies, last = [], seq.tail_pages[-1] if seq.tail_pages else None
        full = (seq.num_tokens - seq.prefix_len) // P
        if len(seq.tail_pages) > full and self.pool.pages[last].owner != seq.seq_id:
            seq.tail_pages.pop()
            used = seq.num_tokens - seq.inline_start(P)
            for i in range(0, used, S):
                n = min(S, used - i)
                op = CopyOp(PAGES, last * P + i, INLINE, slots[i // S] * S, n)
                copies.append(self.count_copy(op))
                self.arena.num_tokens[slots[i // S]] = n
            # cached meanwhile, it duplicates our slots: the first page to evict under pressure
            self.pool.decref(last, seq.seq_id, evict_first=True)
            seq.copied_from = last
        seq.tail_kind, seq.inline_slots = INLINE, slots
        self.counters.pages_to_slots += 1
        self.update_capacity(seq)
        return copies

    def _grow_inline(self, seq: SeqKV, target: int) -> list[CopyOp]:
        """More slots (up to a page's worth), copy-on-write of a shared last slot, or, when
        neither fits, the inline end moved into pages."""
        P, S = self.page_tokens, self.inline_tokens
        start = seq.inline_start(P)
        used = seq.num_tokens - start
        last = seq.inline_slots[-1]
        cow = self.arena.owner[last] != seq.seq_id and used % S != 0
        more = ceil_div(target - start, S) - len(seq.inline_slots)
        if target - start > P or more + int(cow) > self.arena.num_free:
            return self._inline_to_pages(seq, target)
        copies = self._copy_slot(seq) if cow else []
        seq.inline_slots += [self.arena.allocate(seq.seq_id) for _ in range(more)]
        self.update_capacity(seq)
        return copies

    def _copy_slot(self, seq: SeqKV) -> list[CopyOp]:
        """Copy-on-write of a shared, partially used last inline slot into a new slot of ours."""
        S, old = self.inline_tokens, seq.inline_slots[-1]
        used = (seq.num_tokens - seq.inline_start(self.page_tokens)) % S
        new = self.arena.allocate(seq.seq_id)
        self.arena.num_tokens[new] = used
        self.arena.decref(old, seq.seq_id)
        seq.inline_slots[-1] = new
        return [self.count_copy(CopyOp(INLINE, old * S, INLINE, new * S, used))] if used else []

    def inline_end_to_page(self, seq: SeqKV) -> list[CopyOp]:
        """At finish: move the committed inline end of a sequence into a page so the next turn
        finds it (the page it was copied from taken back when still there, else a new page);
        returns the copies, [] when there is nothing to keep or no page to put it in. Only when
        the prefix cache is on and the last slot is not another sequence's to extend."""
        if not (seq.tail_kind == INLINE and self.enable_prefix_cache
                and seq.num_tokens > seq.inline_start(self.page_tokens)
                and self.arena.owner[seq.inline_slots[-1]] in (seq.seq_id, None)):
            return []
        if self._page_to_take_back(seq):
            return self._slots_into_page(seq, None)
        if self.pool.num_available > 0:
            return self._slots_into_page(seq, self._allocate(1, seq.seq_id)[0])
        return []

    def _slots_into_page(self, seq: SeqKV, pid: int | None) -> list[CopyOp]:
        """Copy the committed inline end into a page, drop the slots, and make the page the
        tail's last page (registered in the prefix cache when non-empty). `pid` None: the idle
        cached page the end was copied from at its start (still holding a prefix of it) is
        taken back and only the tokens after that prefix are copied."""
        P, S = self.page_tokens, self.inline_tokens
        start = seq.inline_start(P)
        used, skip = seq.num_tokens - start, 0
        if pid is None:
            pid = seq.copied_from
            page = self.pool.pages[pid]
            skip = len(page.tokens)
            self.pool.incref(pid, seq.seq_id)
            page.owner = seq.seq_id
            self.counters.take_overs += 1
        copies = []
        for i, slot in enumerate(seq.inline_slots):
            lo, hi = max(skip, i * S), min(used, (i + 1) * S)
            if hi > lo:
                copies.append(self.count_copy(CopyOp(INLINE, slot * S + lo - i * S, PAGES,
                                                  pid * P + lo, hi - lo)))
            self.arena.decref(slot, seq.seq_id)
        seq.tail_kind, seq.inline_slots = PAGES, []
        if skip:
            self.pool.pages[pid].tokens.extend(seq.token_ids[start + skip:])
            seq.tail_pages.append(pid)
        else:
            self._new_tail_page(seq, pid, seq.token_ids[start:])
        self.counters.inline_to_pages += 1
        return copies

    def _page_to_take_back(self, seq: SeqKV) -> bool:
        """The page this inline end was copied from has no owner (cached, or live only as others'
        read-only prefix), is still a prefix of it, sits where this tail would put it (same
        start and parent) and still has its local part (layer groups): then appending to it in
        place is a take-over."""
        pid = seq.copied_from
        if pid is None:
            return False
        page, start = self.pool.pages[pid], seq.inline_start(self.page_tokens)
        parent = seq.tail_pages[-1] if seq.tail_pages else (
            seq.prefix_pages[-1] if seq.prefix_pages else ROOT)
        n = len(page.tokens)
        return (page.state in (CACHED, LIVE) and page.owner is None and page.start == start
                and self.pool.holds_local(pid)
                and page.parent == parent and 0 < n <= seq.num_tokens - start
                and page.tokens == seq.token_ids[start:start + n])

    def _inline_to_pages(self, seq: SeqKV, target: int) -> list[CopyOp]:
        P = self.page_tokens
        n = ceil_div(target - seq.inline_start(P), P)
        self._check_available(n, seq.seq_id)
        ids = self._allocate(n, seq.seq_id)
        copies = self._slots_into_page(seq, ids[0])
        for pid in ids[1:]:
            self._new_tail_page(seq, pid, [])
        self.update_capacity(seq)
        return copies
