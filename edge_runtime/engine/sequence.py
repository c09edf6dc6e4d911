"""Request and sequence state (data only; the scheduler and the engine change it).

A `Request` owns one `Sequence` per completion (n > 1 samples or beams). A sequence's `token_ids`
are prompt + generated; `num_computed` of them have their K/V in the cache. The tokens still to be
computed are `token_ids[num_computed:]`; a running decode sequence has exactly one (the token
sampled last step).

Invariants:
- `0 <= num_computed <= len(token_ids)`; `num_computed == 0` while waiting (a preempted sequence
  recomputes from whatever prefix is still cached when it is admitted again).
- `arrival` is unique and increasing in admission order: the scheduler serves FIFO by it and
  preempts the newest (largest) first.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from edge_runtime.engine.api import GenerationResult, RequestTimings, SamplingParams
from edge_runtime.engine.stop import StopChecker


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: str
    request: "Request"
    index: int  # completion index inside the request
    token_ids: list[int]
    arrival: int
    generator: torch.Generator
    stop: StopChecker
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0
    beam_score: float = 0.0  # sum of log-probs of the generated tokens (beam search)
    matcher: object | None = None  # engine/grammar.py Matcher: constrained requests only
    # engine/forced_drafts.py Draft: tokens guessed for the grammar's forced text, computed after
    # token_ids in the next step and kept as far as the sampler confirms them (not in token_ids)
    draft: object | None = None
    logprobs: list = field(default_factory=list)  # TokenLogprob per generated token, if asked

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def num_pending(self) -> int:
        """Tokens whose K/V still has to be computed."""
        return len(self.token_ids) - self.num_computed

    @property
    def num_draft(self) -> int:
        return 0 if self.draft is None else len(self.draft.token_ids)

    @property
    def max_new_remaining(self) -> int:
        return max(1, self.request.params.max_tokens - self.num_generated)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stream_id: str | None = None
    priority: int = 0  # higher survives preemption longer; equal priorities: newest goes first
    seqs: list[Sequence] = field(default_factory=list)
    added_at: float = field(default_factory=time.perf_counter)
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    result: GenerationResult | None = None
    beam_state: object | None = None  # engine/beam.py BeamGroup, for beam requests
    error: str | None = None  # why the request failed (finish_reason "error")
    restarted_cold: bool = False  # out of pages alone once: restarted on an emptied cache
    compiled_grammar: object | None = None  # params.grammar compiled (engine/constraints.py)

    @property
    def is_beam(self) -> bool:
        return self.params.beam_width > 1

    def timings(self) -> RequestTimings:
        def since(t):
            return 0.0 if t is None else t - self.added_at

        return RequestTimings(since(self.first_scheduled_at), since(self.first_token_at),
                              since(self.finished_at))
