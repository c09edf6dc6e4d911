"""Value types of the KV bookkeeping facade (docs/interfaces.md): SeqKV, Segments, CopyOp.

A sequence's KV is two segments: the shared prefix `[0, prefix_len)` in aligned pool pages
(page i holds positions [i*P, i*P+P); read-only; the last may be used partially) and the private
tail `[prefix_len, num_tokens)` whose position prefix_len is slot 0 of its first tail page or, with
no tail page, of its first inline slot. A tail is either pages only ("pages") or full pages
followed by inline slots ("inline": the slots hold the end of the tail that has not filled a page,
at most a page's worth, so a 40-token remainder does not pin a 512-token page). Tail pages and
slots may be shared read-only (fork, or a cached chain matched from an earlier turn); only the
owner appends into a page or slot, anyone else copies it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGES, INLINE = "pages", "inline"
SLICES = "slices"  # the pool addressed by slice, not by page (layer groups; kv/page_pool.py)


@dataclass(frozen=True)
class CopyOp:
    """Copy num_tokens tokens (all layers, K, V, scales) from src to dst flat slots. With layer
    groups a "pages" slot is a page's head slice's, and the copy runs for every group's slice
    of the page (the storage's group map); "slices" copies one slice as it is."""

    src_store: str  # "pages" | "inline" | "window" | "slices"
    src_slot_start: int
    dst_store: str
    dst_slot_start: int
    num_tokens: int


@dataclass(frozen=True)
class Segments:
    prefix_pages: tuple[int, ...]
    prefix_len: int
    tail_kind: str  # "inline" | "pages"
    tail_ids: tuple[int, ...]  # inline: slot ids; pages: tail page ids covering [prefix_len, capacity)
    tail_len: int  # committed tokens in the tail
    tail_capacity: int  # reserved positions in the tail (>= tail_len)
    full_pages: tuple[int, ...] = ()  # inline: the full tail pages before the slots
    window: int | None = None  # its recent-key window (kv/recent_window.py), if it holds one
    window_start: int = 0  # the first position it computed itself: the window's offset 0


@dataclass
class SeqKV:
    """One sequence's block table. Returned by KVManager.admit; read it, do not modify it."""

    seq_id: object
    prompt_len: int
    max_new_tokens: int
    num_cached_tokens: int  # prompt tokens whose K/V already exist: skip their prefill
    prefix_pages: list[int] = field(default_factory=list)
    prefix_len: int = 0
    tail_kind: str = PAGES
    tail_pages: list[int] = field(default_factory=list)  # inline tails: all full
    inline_slots: list[int] = field(default_factory=list)  # non-empty iff tail_kind == INLINE
    token_ids: list[int] = field(default_factory=list)  # committed tokens, positions [0, n)
    capacity: int = 0  # positions [0, capacity) have storage
    took_over: bool = False  # admitted by taking over an idle cached tail page
    copied_from: int | None = None  # the shared partial page an inline end was copied from
    window: int | None = None  # recent-key window held (kv/recent_window.py), None: none
    window_start: int = 0  # first position computed by this sequence (the window's offset 0)
    # layer groups (kv/layer_groups.py): its first `local_from` pages are behind the local
    # layers' window of a query at `read_from`, held without their local part. read_from: the
    # first position of the last tokens committed (the engine may commit a prefill chunk before
    # its forward reads), or the cached prefix's end at admission
    local_from: int = 0
    read_from: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def tail_ids(self) -> tuple[int, ...]:
        if self.tail_kind == INLINE:
            return tuple(self.inline_slots)
        return tuple(self.tail_pages)

    def inline_start(self, page_tokens: int) -> int:
        """Position held by slot 0 of the first inline slot (after the full tail pages)."""
        return self.prefix_len + len(self.tail_pages) * page_tokens

    def all_pages(self) -> list[int]:
        return self.prefix_pages + self.tail_pages

    def replace_page(self, old_id: int, new_id: int) -> None:
        """Point the block table at `new_id` where it held `old_id` (a page relocated by
        kv/pool_shrink.py: same content, same positions)."""
        for table in (self.prefix_pages, self.tail_pages):
            if old_id in table:
                table[table.index(old_id)] = new_id

    def segments(self) -> Segments:
        full = tuple(self.tail_pages) if self.tail_kind == INLINE else ()
        return Segments(tuple(self.prefix_pages), self.prefix_len, self.tail_kind,
                        self.tail_ids(), self.num_tokens - self.prefix_len,
                        self.capacity - self.prefix_len, full, self.window, self.window_start)
