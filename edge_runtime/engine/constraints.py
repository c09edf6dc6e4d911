"""The engine's side of constrained decoding and log-probs: what one step does for the rows that
asked (engine.py calls these; engine/grammar.py wraps the grammar library).

Invariants:
- The grammar compiler (a tokenizer table, ~0.3 s) is built on the first constrained request.
- Each sampled row of a step has at most one mask row; n > 1 children forked at their first
  token use their parent's mask row (a fresh matcher is in the same state as the parent's).
- Log-probs come from the model's logits before the mask and any sampling transform.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import torch

from edge_runtime.engine.api import TokenLogprob
from edge_runtime.engine.grammar import GrammarCompiler, GrammarMasks, apply_bitmask


class Constraints:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
        self._args = (tokenizer, vocab_size, tuple(stop_token_ids))
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()
        self.masks = GrammarMasks(vocab_size)

    @property
    def compiler(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._compiler = GrammarCompiler(*self._args)
            return self._compiler

    def compile(self, params):
        """The compiled grammar of `params` (cached), or None; RequestError if it cannot be."""
        return None if params.grammar is None else self.compiler.compile(params.grammar)

    def matcher_for(self, request):
        if request.compiled_grammar is None:
            return None
        return self.compiler.matcher(request.compiled_grammar)

    def start_masks(self, sampled: list) -> Future | None:
        """Begin filling the masks of the constrained rows (run while the forward runs).
        sampled: (first logits row, sequence); a sequence with a draft has its rows' masks
        already (engine/forced_drafts.py), one per row from the first."""
        filled = [(row + j, mask) for row, s in sampled if s.draft is not None
                  for j, mask in enumerate(s.draft.masks)]
        return self.masks.start([(row, s.matcher) for row, s in sampled
                                 if s.matcher is not None and s.draft is None], filled)

    @staticmethod
    def apply_masks(logits: torch.Tensor, source_rows: list[int], masks: Future | None) -> None:
        """logits[k] was taken from the step's row source_rows[k]; mask it if that row has one."""
        if masks is None:
            return
        bitmask, mask_rows = masks.result()
        mask_of = {row: j for j, row in enumerate(mask_rows)}
        targets = [k for k, row in enumerate(source_rows) if row in mask_of]
        picks = torch.tensor([mask_of[source_rows[k]] for k in targets], dtype=torch.long)
        apply_bitmask(logits, bitmask[picks], targets)

    @staticmethod
    def accept(seq, token_id: int) -> bool:
        """Advance the sequence's grammar; True when the grammar has ended (nothing may follow)."""
        if seq.matcher is None:
            return False
        seq.matcher.accept(token_id)
        return seq.matcher.is_terminated

    @staticmethod
    def forced_token(seq) -> int | None:
        """The token the sequence's grammar allows next if it allows exactly one, else None."""
        return None if seq.matcher is None else seq.matcher.forced_token()

    def stats(self) -> dict:
        c = self._compiler
        return dict(grammar_masks=self.masks.masks_filled, grammar_mask_s=self.masks.fill_s,
                    grammar_compiles=0 if c is None else c.misses,
                    grammar_cache_hits=0 if c is None else c.hits)


def token_logprobs(logits: torch.Tensor, token_ids: list[int], tops: list[int | None]
                   ) -> list[TokenLogprob | None]:
    """Per row: the log-prob of its token and its `tops[k]` most likely tokens (None: not asked)."""
    # logits: [B, V] raw model logits
    rows = [k for k, top in enumerate(tops) if top is not None]
    out: list[TokenLogprob | None] = [None] * len(tops)
    if not rows:
        return out
    logp = torch.log_softmax(logits[torch.tensor(rows)].float(), dim=-1)  # [R, V]
    k_max = max(tops[k] for k in rows)
    top_vals, top_ids = logp.topk(k_max, dim=-1) if k_max else (None, None)
    for j, k in enumerate(rows):
        top = tuple(zip(top_ids[j, :tops[k]].tolist(), top_vals[j, :tops[k]].tolist())) \
            if tops[k] else ()
        out[k] = TokenLogprob(int(token_ids[k]), float(logp[j, token_ids[k]]), top)
    return out
