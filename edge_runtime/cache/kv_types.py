"""Value types of the KV bookkeeping facade (docs/interfaces.md): SeqKV, Segments, CopyOp.

A sequence's KV is two segments: the shared prefix `[0, prefix_len)` in aligned pool pages
(page i holds positions [i*P, i*P+P); read-only; the last may be used partially) and the private
tail `[prefix_len, num_tokens)` whose position prefix_len is slot 0 of its inline slot or of its
first tail page. Tail pages may be shared read-only (fork, or a cached chain matched from an
earlier turn); only the page's owner appends into it, anyone else copies it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGES, INLINE = "pages", "inline"


@dataclass(frozen=True)
class CopyOp:
    """Copy num_tokens tokens (all layers, K, V, scales) from src to dst flat slots."""

    src_store: str  # "pages" | "inline"
    src_slot_start: int
    dst_store: str
    dst_slot_start: int
    num_tokens: int


@dataclass(frozen=True)
class Segments:
    prefix_pages: tuple[int, ...]
    prefix_len: int
    tail_kind: str  # "inline" | "pages"
    tail_ids: tuple[int, ...]  # (slot id,) or tail page ids covering [prefix_len, capacity)
    tail_len: int  # committed tokens in the tail
    tail_capacity: int  # reserved positions in the tail (>= tail_len)


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
    tail_pages: list[int] = field(default_factory=list)
    inline_slot: int | None = None
    token_ids: list[int] = field(default_factory=list)  # committed tokens, positions [0, n)
    capacity: int = 0  # positions [0, capacity) have storage
    took_over: bool = False  # admitted by taking over an idle cached tail page

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def tail_ids(self) -> tuple[int, ...]:
        if self.tail_kind == INLINE:
            return (self.inline_slot,)
        return tuple(self.tail_pages)

    def all_pages(self) -> list[int]:
        return self.prefix_pages + self.tail_pages

    def segments(self) -> Segments:
        return Segments(tuple(self.prefix_pages), self.prefix_len, self.tail_kind,
                        self.tail_ids(), self.num_tokens - self.prefix_len,
                        self.capacity - self.prefix_len)
