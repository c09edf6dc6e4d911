"""Forced-text drafts: the tokens a grammar's forced text is likely written with, computed in one
chunk and kept as far as the sampler confirms them.

After a token, a grammar often forces a stretch of text (`name": "` after `{"`) that several
tokens could start (`name`, `n`, `na`...), so no single token is forced and which one the model
writes is its own choice. A draft guesses it: the forced text in the tokenizer's own tokens
(whole tokens only, each allowed by the mask at its place), walked on a fork of the sequence's
matcher so the real one stays where the sequence is. The engine computes the sequence's pending
tokens and the draft in one chunk, with logits for the row before each draft token and after the
last; each row is sampled under its own mask (the one recorded while walking) exactly as a
decode step would sample it, and the draft is kept up to its first token the sampler did not pick
(`accepted_count`), whose place takes the sampler's token. So the output is the same as without a
draft; a wrong guess only costs the chunk's extra rows.

Drafts are for greedy rows: a sampled row's random stream would have to be rewound over the rows
after a rejection.

Invariants:
- `Draft.masks` has one row per draft token (the mask before it) and one after the last.
- Every draft token is allowed by the mask before it; a stop token ends the draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge_runtime.engine.grammar import Matcher, allocate_bitmask, allows, single_allowed_token

MAX_DRAFT_TOKENS = 32


@dataclass
class Draft:
    token_ids: list[int]
    masks: list[torch.Tensor]  # int32 [W] each: before token_ids[j], then after the last

    def truncated(self, k: int) -> "Draft":
        """Its first k tokens (1 <= k)."""
        assert 1 <= k <= len(self.token_ids), (k, len(self.token_ids))
        return Draft(self.token_ids[:k], self.masks[:k + 1])


def build_draft(matcher: Matcher, encode, max_tokens: int) -> Draft | None:
    """The draft after the matcher's state, at most `max_tokens` long; None when nothing is
    forced. encode: text -> the tokenizer's ids of it (no special tokens)."""
    fork, ids, masks, spelled = matcher.fork(), [], [], []
    mask = None
    while len(ids) < min(max_tokens, MAX_DRAFT_TOKENS):
        mask = fork.next_mask()
        token = single_allowed_token(mask, fork.vocab_size)
        if token is None:
            spelled = spelled or encode(fork.forced_text())
            if not spelled or not allows(mask, spelled[0]):
                break
            token = spelled.pop(0)
        else:
            spelled = []  # the forced token may split the text otherwise: spell it anew
        assert fork.try_accept(token), token
        ids.append(token)
        masks.append(mask)
        mask = None
        if fork.is_terminated:  # a stop token: nothing follows, the last row allows anything
            mask = allocate_bitmask(1, fork.vocab_size)[0]
            break
    if not ids:
        return None
    masks.append(fork.next_mask() if mask is None else mask)
    return Draft(ids, masks)


def accepted_count(draft_ids: list[int], sampled: list[int]) -> int:
    """How many draft tokens the sampler confirmed: sampled[j] is the row before draft_ids[j]."""
    n = 0
    while n < len(draft_ids) and sampled[n] == draft_ids[n]:
        n += 1
    return n
