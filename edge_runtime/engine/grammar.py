"""Constrained decoding: per-request grammars compiled with xgrammar, one matcher per sequence.

Why xgrammar (tools/grammar_mask_bench.py, docs/constrained.md): its per-token mask on this CPU is
~10x cheaper than llguidance's (it precomputes which tokens each grammar position accepts), its
tokenizer set-up is 10x faster, and its structural tags give the tool-call formats.

The flow per step (engine.py): `GrammarMasks.start(seqs)` fills the next-token bitmask of every
constrained sequence on a worker thread while the forward runs (torch releases the GIL);
`.wait()` returns it; `apply_bitmask` sets the logits of disallowed tokens to -inf before
sampling; the engine then calls `accept` on the sequence's matcher with the sampled token.
Jump-forward (engine/emission.py) asks `Matcher.forced_token` after each appended token: the one
token the grammar allows next, if it allows exactly one.

Invariants:
- A sequence's matcher has accepted exactly its generated tokens, in order (the matcher advances on
  sampling, not on the forward, so a preempted sequence that recomputes its KV keeps its state).
- A compiled grammar is immutable and shared by every request with the same spec (LRU cache);
  matchers are per sequence (n > 1: each sample has its own).
- A spec the library cannot compile is a RequestError naming what to fix; nothing is cached then.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from edge_runtime.engine.api import GrammarSpec
from edge_runtime.errors import RequestError

_CACHE_SIZE = 64
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] [^ ]+:\d+: (Check failed: \(.*?\) is false: )?")
_SHIFTS = torch.arange(32, dtype=torch.int32)


def _xgr():
    import xgrammar
    return xgrammar


class GrammarCompiler:
    """Compiles GrammarSpecs for one tokenizer, caching the result per spec."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
        xgr = _xgr()
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=list(stop_token_ids))
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        self._cache: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._lock = threading.Lock()
        self.compile_s: dict[GrammarSpec, float] = {}  # seconds of the (one) real compile
        self.hits = self.misses = 0

    def compile(self, spec: GrammarSpec):
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                self.hits += 1
                return self._cache[spec]
        t0 = time.perf_counter()
        compiled = self._compile_uncached(spec)
        with self._lock:
            self.misses += 1
            self.compile_s[spec] = time.perf_counter() - t0
            self._cache[spec] = compiled
            while len(self._cache) > _CACHE_SIZE:
                old, _ = self._cache.popitem(last=False)
                self.compile_s.pop(old, None)
        return compiled

    def _compile_uncached(self, spec: GrammarSpec):
        c = self._compiler
        try:
            if spec.kind in ("json_object", "json_schema"):
                # json_object: any object (the builtin JSON grammar would allow any value);
                # a schema: strict (no properties beyond those it lists), as OpenAI's strict mode
                text = '{"type": "object"}' if spec.kind == "json_object" else spec.text
                return c.compile_json_schema(text, any_whitespace=False, separators=(", ", ": "),
                                             strict_mode=spec.kind == "json_schema"
                                             and spec.strict)
            if spec.kind == "structural_tag":
                return c.compile_structural_tag(spec.text)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise RequestError(f"{spec.what} cannot be used as a grammar: "
                               f"{library_message(exc)}") from None
        raise AssertionError(f"unknown grammar kind {spec.kind!r}")

    def matcher(self, compiled) -> "Matcher":
        return Matcher(_xgr().GrammarMatcher(compiled), self.vocab_size)


def library_message(exc: Exception) -> str:
    """xgrammar's C++ error without its log prefix ('[04:44:46] /project/cpp/x.cc:42: ')."""
    text = " ".join(str(exc).split())
    return _LOG_PREFIX.sub("", text) or type(exc).__name__


class Matcher:
    """The grammar state of one sequence."""

    def __init__(self, matcher, vocab_size: int):
        self._m = matcher
        self.vocab_size = vocab_size

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(bitmask, row)

    def forced_token(self) -> int | None:
        """The next token if the grammar allows exactly one (of the model's vocabulary), else None.

        Whole tokens only, read off the same mask sampling uses: a token so forced is the one any
        sampler picks under that mask, so appending it without a forward changes no output. (The
        library's `find_jump_forward_tokens` tokenizes the forced text its own way, which need not
        be the way the model would have written it.)"""
        return single_allowed_token(self.next_mask(), self.vocab_size)

    def accept(self, token_id: int) -> None:
        ok = self._m.accept_token(int(token_id))
        assert ok, f"token {token_id} was sampled under a mask that did not allow it"

    def next_mask(self) -> torch.Tensor:
        """int32 [W]: the bitmask row of the tokens allowed next."""
        bitmask = allocate_bitmask(1, self.vocab_size)
        self.fill(bitmask, 0)
        return bitmask[0]

    def forced_text(self) -> str:
        """The text the grammar forces next, whatever tokens spell it ('' when none)."""
        return self._m.find_jump_forward_string()

    def fork(self) -> "Matcher":
        """An independent matcher in this one's state (a draft walks it ahead)."""
        return Matcher(self._m.fork(), self.vocab_size)

    def try_accept(self, token_id: int) -> bool:
        return bool(self._m.accept_token(int(token_id)))

    @property
    def is_terminated(self) -> bool:
        return self._m.is_terminated()


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    # bitmask: int32 [num_rows, ceil(vocab / 32)]; bit j of word w allows token 32 * w + j
    return torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def single_allowed_token(row: torch.Tensor, vocab_size: int) -> int | None:
    """The token id whose bit is the only one set in the bitmask row, if it is below vocab_size.
    A set bit past the vocabulary counts as a second token (None: no jump, never a wrong one)."""
    # row: int32 [W]
    words = row.nonzero()
    if words.numel() != 1:
        return None
    w = int(words[0, 0])
    bits = int(row[w]) & 0xFFFFFFFF
    if bits & (bits - 1):
        return None
    token = 32 * w + bits.bit_length() - 1
    return token if token < vocab_size else None


def allows(row: torch.Tensor, token_id: int) -> bool:
    """Whether the bitmask row allows `token_id`."""
    return bool((int(row[token_id // 32]) >> (token_id % 32)) & 1)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """-inf for every token whose bit is 0, in the given rows of logits (in place, also returned).

    Plain torch (unpack the words into booleans, masked_fill): the same on every device, and 10x
    faster on this CPU than xgrammar's own CPU apply (tools/grammar_mask_bench.py)."""
    # logits: [B, V] float; bitmask: int32 [len(rows), W], W * 32 >= V
    vocab = logits.shape[-1]
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS.to(bitmask.device)) & 1  # [R, W, 32]
    banned = (bits == 0).view(bitmask.shape[0], -1)[:, :vocab].to(logits.device)
    if rows == list(range(logits.shape[0])):  # every row: in place, no gather
        return logits.masked_fill_(banned, float("-inf"))
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    logits[index] = logits[index].masked_fill(banned, float("-inf"))
    return logits


class GrammarMasks:
    """Next-token bitmasks for the constrained rows of one step, filled on a worker thread."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
        self.fill_s = 0.0  # total seconds spent filling masks (worker thread)
        self.masks_filled = 0

    def start(self, matchers: list[tuple[int, Matcher]],
              filled: list[tuple[int, torch.Tensor]] = ()) -> Future | None:
        """matchers: (row of the batch's logits, matcher); filled: (row, bitmask row) already
        known (a draft's rows). None when no row is constrained."""
        if not matchers and not filled:
            return None
        return self._pool.submit(self._fill, list(matchers), list(filled))

    def _fill(self, matchers: list[tuple[int, Matcher]], filled: list[tuple[int, torch.Tensor]]
              ) -> tuple[torch.Tensor, list[int]]:
        t0 = time.perf_counter()
        bitmask = allocate_bitmask(len(matchers) + len(filled), self.vocab_size)
        for i, (_, m) in enumerate(matchers):
            m.fill(bitmask, i)
        for i, (_, row) in enumerate(filled, start=len(matchers)):
            bitmask[i] = row
        self.fill_s += time.perf_counter() - t0
        self.masks_filled += len(matchers)
        return bitmask, [row for row, _ in matchers] + [row for row, _ in filled]

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def schema_text(schema) -> str:
    """Compact JSON text of a schema object (the cache key: equal schemas share a compile). Keys
    keep their order: a schema's property order is the order the answer must follow."""
    return json.dumps(schema, separators=(",", ":"))
