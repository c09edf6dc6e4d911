"""Tail storage growth for KVManager: pages, copy-on-write, inline slots (a mixin, no torch).

Split out of kv_manager.py to keep modules small; these methods use KVManager's fields (pool,
prefix, arena, counters, log) and are only called by it. Rules: only a page's or slot's owner
writes into it (at its end); anyone else gets a copy first; a failed allocation raises OutOfPages
before anything changes.
"""

from __future__ import annotations

from edge_runtime.cache.kv_types import INLINE, PAGES, CopyOp, SeqKV
from edge_runtime.cache.observability import LOG
from edge_runtime.cache.page_pool import ROOT
from edge_runtime.errors import OutOfPages


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class TailStorage:
    def _pages_needed(self, seq: SeqKV, target: int, owns_last: bool) -> tuple[int, bool]:
        """(new pages, copy-on-write of the last tail page) to hold positions [0, target)."""
        P, p, have = self.page_tokens, seq.prefix_len, len(seq.tail_pages)
        used = seq.num_tokens - p  # committed tail tokens
        cow = have > 0 and target > seq.num_tokens and used < have * P and not owns_last
        return max(0, _ceil_div(target - p, P) - have) + int(cow), cow

    def _update_capacity(self, seq: SeqKV) -> None:
        p, P = seq.prefix_len, self.page_tokens
        if seq.tail_kind == INLINE:
            owns = self.arena.owner[seq.inline_slot] == seq.seq_id
            seq.capacity = p + self.inline_tokens if owns else seq.num_tokens
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
        if self.pool.num_free < self.dump_below_free and not self._dumped:
            self._dumped = True
            LOG.warning("free KV pages below %d:\n%s", self.dump_below_free, self.dump())
        elif self.pool.num_free >= self.dump_below_free:
            self._dumped = False
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

    def _copied(self, op: CopyOp) -> CopyOp:
        self.counters.copies += 1
        self.counters.copied_tokens += op.num_tokens
        self.log("copy", None, src=(op.src_store, op.src_slot_start),
                 dst=(op.dst_store, op.dst_slot_start), n=op.num_tokens)
        return op

    def _grow_pages(self, seq: SeqKV, target: int) -> list[CopyOp]:
        P, p = self.page_tokens, seq.prefix_len
        owns = bool(seq.tail_pages) and self.pool.pages[seq.tail_pages[-1]].owner == seq.seq_id
        n_new, cow = self._pages_needed(seq, target, owns_last=owns)
        self._check_available(n_new, seq.seq_id)
        new_ids, copies = self._allocate(n_new, seq.seq_id), []
        if cow:
            src = self.pool.pages[seq.tail_pages.pop()]
            used = seq.num_tokens - p - len(seq.tail_pages) * P
            dst = new_ids.pop(0)
            copies.append(self._copied(CopyOp(PAGES, src.page_id * P, PAGES, dst * P, used)))
            self._new_tail_page(seq, dst, src.tokens[:used])
            self.pool.decref(src.page_id, seq.seq_id)
        for pid in new_ids:
            self._new_tail_page(seq, pid, [])
        self._update_capacity(seq)
        return copies

    def _copy_slot(self, seq: SeqKV) -> list[CopyOp]:
        """Copy-on-write of a shared inline slot into a new slot of our own."""
        S, old = self.inline_tokens, seq.inline_slot
        used = seq.num_tokens - seq.prefix_len
        new = self.arena.allocate(seq.seq_id)
        self.arena.num_tokens[new] = used
        self.arena.decref(old, seq.seq_id)
        seq.inline_slot = new
        self._update_capacity(seq)
        return [self._copied(CopyOp(INLINE, old * S, INLINE, new * S, used))] if used else []

    def _inline_to_pages(self, seq: SeqKV, target: int) -> list[CopyOp]:
        P, S, p = self.page_tokens, self.inline_tokens, seq.prefix_len
        n = _ceil_div(target - p, P)
        self._check_available(n, seq.seq_id)
        ids, used, slot = self._allocate(n, seq.seq_id), seq.num_tokens - p, seq.inline_slot
        copies = [self._copied(CopyOp(INLINE, slot * S, PAGES, ids[0] * P, used))] if used else []
        seq.tail_kind, seq.inline_slot = PAGES, None
        self.arena.decref(slot, seq.seq_id)
        self._new_tail_page(seq, ids[0], seq.token_ids[p:])
        for pid in ids[1:]:
            self._new_tail_page(seq, pid, [])
        self.counters.inline_to_pages += 1
        self._update_capacity(seq)
        return copies
