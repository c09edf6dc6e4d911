"""Scoring a token sequence through the engine's own paged KV path (perplexity).

A `Scorer` is a client of the KV bookkeeping, the KV storage and the step runner, under the
engine's lock; `Engine.scorer()` hands one out. `Scorer.nll` admits a temporary sequence in the
KVManager, prefills it in chunks of `chunk_tokens` (the engine's `max_batch_tokens`) through the
step runner's forward (the back end's KV context; K/V quantized and stored exactly as for
generation, every chunk attending to the chunks before it from the pages), asks for logits at
every position, and returns the negative log-likelihood of each next token. The sequence is
released at the end, so the pool is as before (its committed pages stay cached, as for any
request).

Invariants: runs under the engine lock between steps; every position is computed (a prefix-cache
hit would skip logits, so one is refused: build the engine with the prefix cache off).
"""

from __future__ import annotations

import itertools

import torch

from edge_runtime.kv.paged_context import SeqStep

_ids = itertools.count()


class Scorer:
    def __init__(self, kv, storage, runner, lock, chunk_tokens: int):
        self.kv = kv  # the KVManager: admit, reserve, commit, release the scored sequence
        self.storage = storage  # runs the reserve's CopyOps
        self.runner = runner  # StepRunner.every_position_logits
        self.lock = lock  # the engine's: scoring runs between its steps
        self.chunk_tokens = chunk_tokens

    def nll(self, token_ids: list[int]) -> torch.Tensor:
        """float64 [len(token_ids) - 1]: -log p(token[t+1] | token[:t+1])."""
        nll = []
        for start, logits in self.logits(token_ids):
            targets = torch.tensor(token_ids[start + 1:start + 1 + logits.shape[0]], dtype=torch.long)
            logp = torch.log_softmax(logits[: targets.numel()].double(), dim=-1)
            nll.append(-logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1))
        return torch.cat(nll)

    def logits(self, token_ids: list[int]):
        """Yields (start, float32 logits [n, vocab]) for consecutive chunks of the positions."""
        assert len(token_ids) >= 2, "need at least two tokens to score"
        seq_id = f"score-{next(_ids)}"
        kv, chunk = self.kv, self.chunk_tokens
        with self.lock:
            plan = kv.admit(seq_id, token_ids, 1)
            try:
                assert plan.num_cached_tokens == 0, \
                    "scoring needs every position computed: use an engine without the prefix cache"
                for start in range(0, len(token_ids), chunk):
                    ids = token_ids[start:start + chunk]
                    for op in kv.reserve(seq_id, len(ids)):
                        self.storage.copy(op)
                    step = SeqStep.from_segments(kv.segments(seq_id), start, len(ids))
                    logits = self.runner.every_position_logits(ids, step)  # [n, vocab]
                    kv.commit(seq_id, ids)
                    yield start, logits
            finally:
                kv.release(seq_id)
