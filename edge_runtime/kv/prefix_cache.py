"""Prefix cache: a tree of pages, matched against a new prompt by comparing tokens.

Why a tree of unaligned nodes (docs/pool.md has the long version): a sequence's KV is a shared
prefix `[0, p)` of *aligned* pages (page i holds positions [i*P, i*P + P), the last may be used
partially) plus a private tail whose first page starts at the unaligned position p. When the tail is
registered, it becomes a chain of pages hanging off the last prefix page at offset
`p - prefix_page.start`. The next turn of the same stream matches: aligned pages (system prompt),
then that tail chain; it shares the chain's full pages and, when the chain's last partial page is
idle (no owner), *takes it over* and keeps appending into it, so 12 turns fill one page instead of
leaving 12 mostly empty ones.

Keys: a page is indexed under (parent page id, start position, first token). The parent id chains
the key to everything before the page (the parent's own key, recursively), the start pins the
position, and the hit is confirmed by comparing the page's tokens with the prompt. Whole-page
content hashes (vLLM) do not fit here: pages are matched *partially* (a prompt may diverge
mid-page and still use the first k tokens read-only) and an owned page grows while indexed.

Invariants:
- A page is indexed iff it holds at least one committed token and the cache is enabled; its
  `tokens` never change except by appending (only its owner appends).
- `parent.children` holds exactly the indexed pages whose parent it is; a live page's parent is
  live (the holder's block table contains the whole chain).
- A returned Match uses at most `limit` tokens; prefix pages are aligned (page i starts at i*P) and
  all but the last are full and fully matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_runtime.kv.page_math import pages_for_tokens
from edge_runtime.kv.page_pool import LIVE, ROOT, Page, PagePool


@dataclass
class Match:
    prefix_pages: list[int] = field(default_factory=list)  # aligned, read-only
    prefix_len: int = 0
    tail_pages: list[int] = field(default_factory=list)  # chain starting at prefix_len
    num_cached: int = 0  # prefix_len + matched tokens of the tail chain
    take_over: bool = False  # the last tail page is idle and fully matched: append in place

    def score(self) -> tuple:
        return (self.num_cached, self.take_over, -len(self.tail_pages))

    def truncated(self, n: int, page_tokens: int) -> "Match":
        """The same match using only its first n tokens (n <= num_cached): the pages past them
        are dropped, and a page then used partially is read-only (never taken over)."""
        assert 0 <= n <= self.num_cached, (n, self.num_cached)
        if n == self.num_cached:
            return self
        if n <= self.prefix_len:
            return Match(self.prefix_pages[:pages_for_tokens(n, page_tokens)], n, [], n)
        tail = self.tail_pages[:pages_for_tokens(n - self.prefix_len, page_tokens)]
        return Match(list(self.prefix_pages), self.prefix_len, tail, n)


def common_len(page_tokens: list[int], tokens: list[int], pos: int) -> int:
    """Length of the common prefix of page_tokens and tokens[pos:]."""
    n = min(len(page_tokens), len(tokens) - pos)
    if page_tokens[:n] == tokens[pos:pos + n]:
        return n
    i = 0
    while i < n and page_tokens[i] == tokens[pos + i]:
        i += 1
    return i


class PrefixCache:
    """Index of pages by (parent, start, first token); `match` finds the longest cached prefix."""

    def __init__(self, pool: PagePool, page_tokens: int):
        self.pool = pool
        self.page_tokens = page_tokens
        self.index: dict[tuple[int, int, int], list[int]] = {}

    @staticmethod
    def key(page: Page) -> tuple[int, int, int]:
        return (page.parent, page.start, page.tokens[0])

    def register(self, page: Page) -> None:
        assert page.tokens and not page.indexed and page.state == LIVE, page
        if page.parent != ROOT:
            parent = self.pool.pages[page.parent]
            assert parent.state == LIVE and parent.indexed, (page, parent)
            assert parent.start < page.start <= parent.start + len(parent.tokens), (page, parent)
            parent.children.add(page.page_id)
        self.index.setdefault(self.key(page), []).append(page.page_id)
        page.indexed = True

    def unregister(self, page: Page) -> None:
        assert page.indexed and not page.children, page
        bucket = self.index[self.key(page)]
        bucket.remove(page.page_id)
        if not bucket:
            del self.index[self.key(page)]
        if page.parent != ROOT:
            self.pool.pages[page.parent].children.discard(page.page_id)
        page.indexed = False

    def move(self, old: Page, new: Page) -> None:
        """`old`'s content is being relocated to `new` (same key and tree position): re-point the
        index, the parent's children and the children's parent (their keys include it)."""
        if old.indexed:
            bucket = self.index[self.key(old)]
            bucket[bucket.index(old.page_id)] = new.page_id
            if old.parent != ROOT:
                siblings = self.pool.pages[old.parent].children
                siblings.discard(old.page_id)
                siblings.add(new.page_id)
        for cid in old.children:
            child = self.pool.pages[cid]
            bucket = self.index[self.key(child)]
            bucket.remove(cid)
            if not bucket:
                del self.index[self.key(child)]
            child.parent = new.page_id
            self.index.setdefault(self.key(child), []).append(cid)

    def _best(self, candidates, tokens: list[int], pos: int) -> tuple[Page | None, int]:
        best, best_n = None, 0
        for pid in candidates:
            page = self.pool.pages[pid]
            n = common_len(page.tokens, tokens, pos)
            if n > best_n:
                best, best_n = page, n
        return best, best_n

    def match(self, tokens: list[int], max_nodes: int = 4096) -> Match:
        """Longest cached prefix of `tokens` (pass the prompt minus its last token).

        Depth-first over every aligned page that matches fully: identical pages can exist (requests
        admitted in the same step each computed the same system prompt), and only one of them
        leads to this prompt's own history. `max_nodes` bounds the walk.
        """
        best, stack, seen = Match(), [([], ROOT, 0)], 0
        while stack and seen < max_nodes:
            chain, parent, start = stack.pop()
            if start >= len(tokens):
                continue
            cands = []
            for pid in self.index.get((parent, start, tokens[start]), ()):
                page = self.pool.pages[pid]
                cands.append((common_len(page.tokens, tokens, start), page))
            cands.sort(key=lambda c: -c[0])  # stable: ties keep registration order
            for m, page in cands:
                seen += 1
                best = self._options(best, chain, start, page, m, tokens)
            full = [page for m, page in cands if m == self.page_tokens]
            stack.extend((chain + [pg.page_id], pg.page_id, start + self.page_tokens)
                         for pg in reversed(full))
        return best

    def _options(self, best: Match, chain: list[int], start: int, page: Page, m: int,
                 tokens: list[int]) -> Match:
        """Best of `best` and the matches that use aligned page `page` (m tokens of it match)."""
        ids = chain + [page.page_id]
        best = max(best, Match(ids, start + m, [], start + m), key=Match.score)
        if m == len(page.tokens) and m < self.page_tokens and page.owner is None:
            best = max(best, Match(list(chain), start, [page.page_id], start + m, True),
                       key=Match.score)
        for child_id in page.children:
            child = self.pool.pages[child_id]
            offset = child.start - start
            if offset > m or offset == self.page_tokens:  # unreachable, or aligned continuation
                continue
            tail, n_tail, take = self._follow_tail(child, tokens)
            if n_tail:
                cand = Match(ids, child.start, tail, child.start + n_tail, take)
                best = max(best, cand, key=Match.score)
        return best

    def _follow_tail(self, page: Page, tokens: list[int]) -> tuple[list[int], int, bool]:
        """Match a tail chain starting with `page`: (pages, tokens matched, take-over possible)."""
        P, pages, total = self.page_tokens, [], 0
        pos = page.start
        while page is not None:
            n = common_len(page.tokens, tokens, pos)
            if n == 0:
                break
            pages.append(page.page_id)
            total += n
            if n < P:
                take = n == len(page.tokens) and page.owner is None
                return pages, total, take
            pos += P
            cands = [c for c in page.children if self.pool.pages[c].start == pos]
            page = self._best(cands, tokens, pos)[0] if pos < len(tokens) else None
        return pages, total, False

    def check_invariants(self) -> None:
        seen = set()
        for key, bucket in self.index.items():
            for pid in bucket:
                page = self.pool.pages[pid]
                assert page.indexed and self.key(page) == key, (key, page)
                seen.add(pid)
        for page in self.pool.pages:
            assert page.indexed == (page.page_id in seen), page
            for cid in page.children:
                child = self.pool.pages[cid]
                assert child.indexed and child.parent == page.page_id, (page, child)
                if child.state == LIVE:
                    assert page.state == LIVE, f"live child {child} of non-live {page}"
