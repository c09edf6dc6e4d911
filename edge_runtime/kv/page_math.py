"""Page counts: the KV pages a run of tokens, a sequence and a request's choices take (no torch).

The one place this arithmetic is written, for everyone who counts pages before allocating any:
the service's admission check, the memory plan, the commands and benchmarks that size a pool, the
prefix cache cutting a match short. Each function names which count it is, because they differ:
`pages_for_tokens` is exact for tokens written from a page boundary, `pages_for_sequence_at_most`
bounds a sequence whose shared prefix may end mid-page, and `request_pages_lenient` is the
service's deliberately lenient count for n choices (it refuses only what cannot fit).
tests/test_page_math.py checks them against KVManager, growing requests to full length on a tiny
pool and counting the pages it holds.
"""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up (b > 0): blocks of b that hold a items, pages or inline slots alike."""
    return -(-a // b)


def pages_for_tokens(num_tokens: int, page_tokens: int) -> int:
    """Pages that `num_tokens` tokens written from a page boundary cover (a partial last page
    counts): a prefix match, a sequence with nothing shared, a pool of so many tokens."""
    assert num_tokens >= 0 and page_tokens > 0, (num_tokens, page_tokens)
    return ceil_div(num_tokens, page_tokens)


def pages_for_sequence_at_most(num_tokens: int, page_tokens: int) -> int:
    """The most pages one sequence of `num_tokens` tokens holds, wherever its shared prefix
    ends: a prefix ending mid-page keeps that partial page and the private tail starts a page of
    its own at the unaligned position, so it is one page more than `pages_for_tokens` at most."""
    return pages_for_tokens(num_tokens, page_tokens) + 1


def request_pages_lenient(num_prompt: int, max_tokens: int, n: int, page_tokens: int,
                          inline_slots: int = 0, inline_tokens: int = 0) -> int:
    """The pages a request's `n` choices hold when all of them reach `max_tokens`, counted
    leniently: the prompt's full pages shared by the choices (n > 1: they fork from one prefill),
    each choice's own pages after those, and a choice's partial last page left out while it fits
    an inline slot and one of the `inline_slots` is free (0: inline storage off). Positions held:
    num_prompt + max_tokens - 1 (the last token sampled is never fed back).

    Lenient on purpose, for refusing a request before it runs (service/generate.py): the
    allocator keeps a fresh prompt's tail in pages unless the whole request fits one slot, and a
    cached prefix ending mid-page costs a page more, so a request may need more than this. With
    max_tokens 1 and n > 1 it counts more than is held: the choices then write nothing of their
    own (their one token is never fed back) and share the prompt's partial last page too."""
    kv_tokens = num_prompt + max_tokens - 1
    shared = num_prompt // page_tokens if n > 1 else 0
    inline = min(inline_tokens, page_tokens)  # a slot holds at most a page
    own_pages, tail = divmod(kv_tokens - shared * page_tokens, page_tokens)
    if tail == 0:
        tail_pages = 0
    elif tail <= inline:
        tail_pages = n - min(n, inline_slots)  # the choices that find no free slot
    else:
        tail_pages = n
    return shared + n * own_pages + tail_pages
