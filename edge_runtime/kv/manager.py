"""KVManager: the one facade the engine and the simulator use for KV bookkeeping (no torch).

Life of a sequence: `admit` maps the longest cached prefix (ref += 1 on each page) and picks the
tail storage (an idle cached tail page taken over, an inline slot, or pages later); `reserve` gives
storage for the tokens about to be written and returns the CopyOps the engine must run first
(copy-on-write of a page or slot it does not own, an inline end that outgrows its slots, a page
tail whose end continues in slots: kv/tail_allocator.py says when);
`commit` records the written tokens (first token of a page indexes it in the prefix cache, so a
concurrent request can already share it); `finish` moves an inline tail into a page (CopyOp) so the
next turn finds it, then drops every reference; `release` (cancel) and `preempt` drop every
reference. With layer groups (kv/layer_groups.py: a page is a head slice plus companions, one
per layer group) a sequence drops the local part of each page that falls behind its local
layers' window as its tokens are committed (`local_from`: behind the window of the first token
of the last commit, `read_from`, since a prefill chunk may be committed before its forward
reads) and keeps the global part; a prefix hit is cut to where every local page its first query
reads is still there. A sequence also holds a recent-key window while it runs when windows are
configured (kv/recent_window.py: taken at admit and fork, `window_copy` gives the fork's copy, given back
by finish/release/preempt). Pages whose count reaches 0 stay CACHED when they hold committed tokens and the prefix
cache is on; committed tokens are K/V already written, so they are complete by definition.

Invariants (`check_invariants`, after every step in tests, `check_leaks` when idle):
- pool: free + cached + live == total; ref count of each page == number of block tables holding it;
  with layer groups the ref count of a page's local part == the number of block tables holding
  it at or after their `local_from`, which is `pages_behind` of their `read_from`.
- only a page's (or slot's) owner writes into it, at its end; every block table's view of a page
  equals that page's tokens over the positions it uses (what attention reads is what was written).
- prefix pages are aligned and all but the last fully used; the tail starts at prefix_len.
- a failed admit/reserve (OutOfPages) changes nothing.

Structure: the manager owns the page pool, the prefix cache, the inline arena, the recent-key
windows and the block tables (`seqs`); tail growth (pages, slots, copy-on-write) is its
TailAllocator's (kv/tail_allocator.py), built on the same pool, prefix cache, arena, counters
and log. The memory guard's retire runs kv/pool_shrink.py on those collaborators; the checks
and stats (kv/checks.py) read the manager's public state, listed in the class docstring.
"""

from __future__ import annotations

from edge_runtime.kv import pool_shrink
from edge_runtime.kv.inline_arena import InlineArena
from edge_runtime.kv.layer_groups import page_ends, pages_behind
from edge_runtime.kv.checks import check_manager, manager_stats
from edge_runtime.kv.seq_kv import INLINE, PAGES, CopyOp, Segments, SeqKV
from edge_runtime.kv.observability import EventLog, KVCounters, LowFreePagesDump, dump_state
from edge_runtime.kv.page_math import ceil_div
from edge_runtime.kv.page_pool import PagePool
from edge_runtime.kv.prefix_cache import Match, PrefixCache
from edge_runtime.kv.recent_window import RecentWindows, aligned_cached
from edge_runtime.kv.tail_allocator import TailAllocator
from edge_runtime.errors import OutOfPages, RequestError


class KVManager:
    """Public state, read by kv_checks.py, the simulator and tests, and changed only through the
    methods below: `pool`, `prefix`, `arena`, `windows`, `seqs` (seq id -> SeqKV), `counters`,
    `log`, `tail_allocator`, and the settings `page_tokens`, `inline_tokens`,
    `enable_prefix_cache`, `enable_inline`."""

    def __init__(self, num_pages: int, page_tokens: int, num_inline_slots: int = 0,
                 inline_tokens: int = 0, enable_prefix_cache: bool = True,
                 enable_inline: bool = True, debug: bool | None = None,
                 dump_below_free: int = 0, num_windows: int = 0, window_tokens: int = 0,
                 global_slices: int = 1, local_slices: int = 0, local_window: int | None = None):
        """num_pages: slices (a page is global_slices + local_slices of them, 1 without layer
        groups); local_window: the window of the local groups (kv/layer_groups.py)."""
        assert page_tokens > 0 and inline_tokens <= page_tokens, (page_tokens, inline_tokens)
        assert (local_slices > 0) == (local_window is not None), (local_slices, local_window)
        self.local_window = local_window
        self.page_tokens = page_tokens
        self.inline_tokens = inline_tokens
        self.enable_prefix_cache = enable_prefix_cache
        self.enable_inline = enable_inline and num_inline_slots > 0 and inline_tokens > 0
        self.log = EventLog(debug)
        self.pool = PagePool(num_pages, on_evict=self._on_evict, on_event=self.log,
                             global_slices=global_slices, local_slices=local_slices)
        self.prefix = PrefixCache(self.pool, page_tokens)
        self.arena = InlineArena(num_inline_slots if self.enable_inline else 0, inline_tokens)
        self.windows = RecentWindows(num_windows, window_tokens)
        self.seqs: dict[object, SeqKV] = {}
        self.counters = KVCounters()
        self.tail_allocator = TailAllocator(
            self.pool, self.prefix, self.arena, self.counters, self.log,
            LowFreePagesDump(dump_below_free, self.dump), page_tokens,
            enable_prefix_cache=enable_prefix_cache, enable_inline=self.enable_inline)

    def _on_evict(self, page) -> None:
        self.prefix.unregister(page)

    # -- admission ----------------------------------------------------------------------------
    def admit(self, seq_id, prompt_ids, max_new_tokens: int) -> SeqKV:
        """Map the cached prefix and choose the tail; OutOfPages (nothing changed) if the
        uncached prompt cannot get storage now."""
        assert seq_id not in self.seqs, f"sequence {seq_id!r} already admitted"
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise RequestError("the prompt is empty; send at least one token")
        m = self.cached_prefix(prompt)
        seq = SeqKV(seq_id, len(prompt), max_new_tokens, m.num_cached, list(m.prefix_pages),
                    m.prefix_len, PAGES, list(m.tail_pages), [], prompt[:m.num_cached])
        uncached = len(prompt) - m.num_cached
        use_inline = (self.enable_inline and not m.tail_pages and self.arena.num_free > 0
                      and uncached + max_new_tokens <= self.inline_tokens)
        # an idle cached last page is taken over (appended in place) unless the rest of this
        # turn fits in fewer slots than a page: then it is copied into slots by reserve
        tails = self.tail_allocator
        slots = tails.slot_plan(seq, len(prompt), owns_last=False)
        take_over = m.take_over and slots is None
        if take_over:  # taken over, the last page is ours: slots only past its end
            slots = tails.slot_plan(seq, len(prompt), owns_last=True)
        seq.read_from = m.num_cached
        seq.local_from = self._pages_behind(seq)
        if not use_inline and slots is None:
            pinned = sum(self.pool.cached_slices(pid, i >= seq.local_from)
                         for i, pid in enumerate(seq.all_pages()))
            n_new, _ = tails.pages_needed(seq, len(prompt), owns_last=take_over)
            if n_new > self.pool.available_pages(pinned):
                self.counters.failed_allocations += 1
                raise OutOfPages(f"prompt of {len(prompt)} tokens ({m.num_cached} cached) needs "
                                 f"{n_new} new KV pages, {self.pool.available_pages(pinned)} "
                                 f"are free or evictable")
        for i, pid in enumerate(seq.all_pages()):
            self.pool.incref(pid, seq_id, local=i >= seq.local_from)
        if take_over:
            last = self.pool.pages[seq.tail_pages[-1]]
            assert last.owner is None, last
            last.owner, seq.took_over = seq_id, True
            self.counters.take_overs += 1
        if use_inline:
            seq.tail_kind, seq.inline_slots = INLINE, [self.arena.allocate(seq_id)]
        seq.window, seq.window_start = self.windows.allocate(seq_id), m.num_cached
        self.seqs[seq_id] = seq
        tails.update_capacity(seq)
        self.counters.admitted += 1
        self.counters.prompt_tokens += len(prompt)
        self.counters.cached_prompt_tokens += m.num_cached
        self.log("admit", seq_id, prompt=len(prompt), cached=m.num_cached, tail=seq.tail_kind)
        return seq

    def cached_prefix(self, prompt_ids) -> Match:
        """The prefix-cache hit a prompt gets: the longest cached prefix of all but its last
        token, cut back to a multiple of the recent-key window when windows are on (the read
        rule, kv/recent_window.py: a block's exact K/V are computed by the one sequence)."""
        if not self.enable_prefix_cache:
            return Match()
        m = self.prefix.match(list(prompt_ids[:-1]))
        window = self.windows.window_tokens if self.windows.num_windows else 0
        while True:  # each cut can only shorten the match; stop where neither moves it
            n = aligned_cached(self._local_usable(m), window)
            if n == m.num_cached:
                return m
            m = m.truncated(n, self.page_tokens)

    def _local_usable(self, m: Match) -> int:
        """The match's length, or, where a local page its first query would read (positions
        [n - W + 1, n)) is gone, the start of the last such page: the longest usable prefix
        is no longer (kv/layer_groups.py)."""
        n, W = m.num_cached, self.local_window
        if W is None:
            return n
        view = SeqKV(None, 0, 0, 0, m.prefix_pages, m.prefix_len, PAGES, m.tail_pages)
        pages = view.all_pages()
        behind = pages_behind(view, self.page_tokens, W, n)
        usable, start = n, 0
        for i, end in enumerate(page_ends(view, self.page_tokens)):
            if i >= behind and start < n and not self.pool.holds_local(pages[i]):
                usable = start
            start = end
        return usable

    # -- growth -------------------------------------------------------------------------------
    def reserve(self, seq_id, num_new_tokens: int) -> list[CopyOp]:
        """Storage for positions [num_tokens, num_tokens + n); returns copies to run first."""
        seq = self.seqs[seq_id]
        target = seq.num_tokens + num_new_tokens
        if target <= seq.capacity:
            return []
        return self.tail_allocator.grow(seq, target)

    def commit(self, seq_id, token_ids) -> None:
        """The K/V of these tokens (positions num_tokens...) are now written."""
        seq, P = self.seqs[seq_id], self.page_tokens
        p, first = seq.prefix_len, seq.num_tokens
        for tok in token_ids:
            pos = seq.num_tokens
            assert pos < seq.capacity, f"commit past reserved storage: {seq_id!r} pos {pos}"
            off = pos - seq.inline_start(P)
            if seq.tail_kind == INLINE and off >= 0:
                self.arena.append(seq.inline_slots[off // self.inline_tokens], seq_id, 1)
            else:
                page = self.pool.pages[seq.tail_pages[(pos - p) // P]]
                assert page.owner == seq_id and len(page.tokens) == (pos - p) % P, (seq_id, page)
                page.tokens.append(int(tok))
                if len(page.tokens) == 1 and self.enable_prefix_cache:
                    self.prefix.register(page)
            seq.token_ids.append(int(tok))
        if token_ids:
            seq.read_from = first
        self._release_behind(seq)

    def _pages_behind(self, seq: SeqKV) -> int:
        if self.local_window is None:
            return 0
        return pages_behind(seq, self.page_tokens, self.local_window, seq.read_from)

    def _release_behind(self, seq: SeqKV) -> None:
        """Drop the local part of the pages the window of a query at `read_from` has left
        (cached, first to evict, where indexed: a prefix ending where they are still read can
        use them)."""
        behind = self._pages_behind(seq)
        pages = seq.all_pages()
        for pid in pages[seq.local_from:behind]:
            self.pool.decref_local(pid, seq.seq_id, evict_first=True)
            self.counters.local_pages_released += 1
        seq.local_from = max(seq.local_from, behind)

    # -- sharing and the end of a sequence -----------------------------------------------------
    def fork(self, parent_id, child_id) -> SeqKV:
        """The child shares every page (and the inline slot) of the parent; it copies on write."""
        assert child_id not in self.seqs, f"sequence {child_id!r} already admitted"
        par = self.seqs[parent_id]
        used_pages = ceil_div(par.num_tokens - par.prefix_len, self.page_tokens)
        slots = []
        if par.tail_kind == INLINE:
            used = max(0, par.num_tokens - par.inline_start(self.page_tokens))
            slots = par.inline_slots[:ceil_div(used, self.inline_tokens)]
        child = SeqKV(child_id, par.prompt_len, par.max_new_tokens, par.num_cached_tokens,
                      list(par.prefix_pages), par.prefix_len, INLINE if slots else PAGES,
                      list(par.tail_pages[:used_pages]), list(slots), list(par.token_ids))
        child.local_from, child.read_from = par.local_from, par.read_from
        for i, pid in enumerate(child.all_pages()):
            self.pool.incref(pid, child_id, local=i >= child.local_from)
        for slot in slots:
            self.arena.incref(slot)
        # the child's window is a copy of the parent's (window_copy), and so is what it computed;
        # a windowless parent's child holds none either (its window would miss the parent's block)
        child.window = self.windows.allocate(child_id) if par.window is not None else None
        child.window_start = par.window_start
        self.seqs[child_id] = child
        self.tail_allocator.update_capacity(child)
        self.log("fork", child_id, parent=parent_id)
        return child

    def window_copy(self, parent_id, child_id) -> CopyOp | None:
        """After `fork`: the copy of the parent's recent-key window into the child's (run it
        before the next step), or None when either holds none."""
        par, child, W = self.seqs[parent_id], self.seqs[child_id], self.windows.window_tokens
        if par.window is None or child.window is None:
            return None
        return CopyOp("window", par.window * W, "window", child.window * W, W)

    def finish(self, seq_id) -> list[CopyOp]:
        """Done: keep the K/V cached for the next turn; returns copies to run now (an inline
        tail moved into a page), then drops every reference."""
        seq = self.seqs[seq_id]
        copies = self.tail_allocator.inline_end_to_page(seq)
        self.counters.finished += 1
        self._drop(seq)
        return copies

    def release(self, seq_id, planned_copies=()) -> None:
        """Cancel: drop every reference. Committed K/V in pages stays cached (it is complete);
        an inline tail is dropped. Released before computing anything (an admission the engine
        takes back), the sequence leaves the admission, hit-rate and copy counters as they were
        (`planned_copies`: the CopyOps its reserve returned, never run)."""
        seq = self.seqs[seq_id]
        if seq.num_tokens == seq.num_cached_tokens:
            self.counters.copies -= len(planned_copies)
            self.counters.copied_tokens -= sum(op.num_tokens for op in planned_copies)
            self.counters.admitted -= 1
            self.counters.prompt_tokens -= seq.prompt_len
            self.counters.cached_prompt_tokens -= seq.num_cached_tokens
            self.counters.take_overs -= int(seq.took_over)
        else:
            self.counters.cancelled += 1
        self._drop(seq)

    def preempt(self, seq_id) -> None:
        """Free the sequence's storage for others; its committed pages stay cached, so on resume
        (admit again with prompt + generated tokens) it recomputes only what was evicted."""
        self.counters.preemptions += 1
        self._drop(self.seqs[seq_id])

    def _drop(self, seq: SeqKV) -> None:
        # deepest first, so leaves enter the LRU before (older than) their parents
        pages = seq.all_pages()
        for i in reversed(range(len(pages))):
            self.pool.decref(pages[i], seq.seq_id, local=i >= seq.local_from)
        for slot in seq.inline_slots:
            self.arena.decref(slot, seq.seq_id)
        if seq.window is not None:
            self.windows.release(seq.window, seq.seq_id)
        del self.seqs[seq.seq_id]
        self.log("drop", seq.seq_id, tokens=seq.num_tokens)

    def evict(self, max_pages: int | None = None) -> int:
        """Evict up to max_pages cached pages (all when None); returns how many."""
        return self.pool.evict(max_pages)

    def retire_pages(self, start: int, end: int) -> list[CopyOp]:
        """Take pages [start, end) out of service (memory guard): cached ones evicted, live ones
        relocated (run the returned copies before the next step). OutOfPages changes nothing."""
        copies = pool_shrink.retire_pages(self.pool, self.prefix, self.seqs.values(),
                                          self.page_tokens, self.log, start, end)
        for seq in self.seqs.values():
            self.tail_allocator.update_capacity(seq)
        self.counters.copies += len(copies)
        self.counters.copied_tokens += sum(op.num_tokens for op in copies)
        return copies

    def restore_pages(self, start: int, end: int) -> int:
        """Put retired pages in [start, end) back in service; returns how many."""
        return self.pool.restore(range(start, end))

    # -- addressing ---------------------------------------------------------------------------
    def segments(self, seq_id) -> Segments:
        return self.seqs[seq_id].segments()

    def slot_of(self, seq_id, position: int) -> tuple[str, int]:
        """(store, flat slot) of a position with storage: "pages" page*P+off or "inline"."""
        seq, P = self.seqs[seq_id], self.page_tokens
        assert 0 <= position < seq.capacity, (seq_id, position, seq.capacity)
        if position < seq.prefix_len:
            return PAGES, seq.prefix_pages[position // P] * P + position % P
        off = position - seq.prefix_len
        if seq.tail_kind == INLINE and off >= len(seq.tail_pages) * P:
            off -= len(seq.tail_pages) * P
            S = self.inline_tokens
            return INLINE, seq.inline_slots[off // S] * S + off % S
        return PAGES, seq.tail_pages[off // P] * P + off % P

    # -- observability ------------------------------------------------------------------------
    def dump(self) -> str:
        return dump_state(self.pool, self.seqs, self.arena)

    def check_invariants(self) -> None:
        check_manager(self)

    def check_leaks(self) -> None:
        """When idle: no live page, no inline slot in use, all invariants hold."""
        assert not self.seqs, f"check_leaks with running sequences: {list(self.seqs)}"
        self.check_invariants()
        assert self.pool.num_live == 0 and self.arena.num_used == 0 and self.windows.num_used == 0, \
            "KV leak: references held with no sequence running\n" + self.dump()

    def stats(self) -> dict:
        return manager_stats(self)
