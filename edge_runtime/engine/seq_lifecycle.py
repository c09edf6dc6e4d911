"""Sequences and requests coming and going: a request's sequences made (its first, the choices of
an n > 1 request, forked beams), taken out of the scheduler with their KV given back, and the
request's one final event.

`SeqLifecycle` holds what those touch: the KV bookkeeping and storage (forks share pages, a
finished tail moves into a page), the scheduler, the tokenizer and grammar constraints a new
sequence's stop checker and matcher need, the Engine's table of live requests and its counters.
Every method is called with the engine lock held.

Invariants:
- A dropped sequence is FINISHED and out of the scheduler; its KV is cached (it finished) or
  released (cancelled, failed, a beam that lost), never both.
- A request ends once: `finish_request` sets its result and appends its final event the first
  time, and does nothing on later calls.
"""

from __future__ import annotations

import time

from edge_runtime.engine import beam
from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent
from edge_runtime.engine.sampler import make_generator
from edge_runtime.engine.sequence import Request, Sequence, SeqStatus
from edge_runtime.engine.stop import StopChecker


class SeqLifecycle:
    def __init__(self, kv, storage, scheduler, constraints, tokenizer, eos_token_ids, arrival,
                 requests: dict[str, Request], counters: dict[str, int]):
        self.kv = kv
        self.storage = storage
        self.scheduler = scheduler
        self.constraints = constraints
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.arrival = arrival  # the Engine's counter: request ids and sequences' arrival order
        self.requests = requests  # the Engine's live requests; a finished one leaves it
        self.counters = counters

    def fork(self, parent: Sequence, index: int, seed_offset: int = 0) -> Sequence:
        """A running sequence `index` of the parent's request over the parent's tokens, sharing
        its KV (KVManager.fork) with a copy of its recent-key window."""
        child = self.new_seq(parent.request, index, list(parent.token_ids), seed_offset)
        self.kv.fork(parent.seq_id, child.seq_id)
        op = self.kv.window_copy(parent.seq_id, child.seq_id)
        if op is not None:
            self.storage.copy(op)
        child.num_computed = parent.num_computed
        self.scheduler.add_running(child)
        return child

    def new_seq(self, req: Request, index: int, token_ids: list[int], seed_offset: int = 0):
        """A sequence of `req` (choice or beam `index`) over `token_ids`, with its sampler (seed:
        the request's + `seed_offset`), stop checker and grammar matcher; appended to `req.seqs`,
        not yet scheduled."""
        p = req.params
        seed = None if p.seed is None else p.seed + seed_offset
        seq = Sequence(f"{req.request_id}/{index}", req, index, token_ids, next(self.arrival),
                       make_generator(seed), StopChecker(self.tokenizer, p, self.eos_token_ids))
        seq.matcher = self.constraints.matcher_for(req)
        req.seqs.append(seq)
        return seq

    def drop_seq(self, seq: Sequence, cached: bool) -> None:
        """Take a sequence out of the scheduler and give its KV back: kept in the prefix cache
        (`cached`: it finished) or released (cancelled, failed, a beam that lost)."""
        if seq.status is SeqStatus.RUNNING:
            if cached:
                for op in self.kv.finish(seq.seq_id):  # an inline tail moved into a page
                    self.storage.copy(op)
            else:
                self.kv.release(seq.seq_id)
        self.scheduler.remove(seq)
        seq.status = SeqStatus.FINISHED

    def fail_seq(self, seq: Sequence, message: str, events: list[TokenEvent]) -> None:
        """End `seq`'s request with `message` as its error: every sequence of it dropped."""
        req = seq.request
        comps = beam.cut_short_completions(req, self.tokenizer, "error") if req.is_beam else None
        for s in req.seqs:
            if s.status is not SeqStatus.FINISHED:
                self.drop_seq(s, cached=False)
                s.stop.finish_cancelled()
                s.stop.finish_reason = "error"
        req.error = message
        self.counters["requests_failed"] += 1
        self.finish_request(req, events, completions=comps)

    def finish_request(self, req: Request, events: list[TokenEvent],
                       completions: list[Completion] | None = None) -> None:
        """End `req` once (later calls do nothing): its result, `completions` or one per choice
        from its sequences, goes out as a final event appended to `events`."""
        if req.result is not None:
            return
        req.finished_at = time.perf_counter()
        comps = completions or [
            Completion(s.stop.text, s.token_ids[s.num_prompt:], s.stop.finish_reason,
                       list(s.logprobs) if req.params.logprobs is not None else None)
            for s in sorted(req.seqs, key=lambda s: s.index) if s.index < max(1, req.params.n)
        ]
        req.result = GenerationResult(req.request_id, len(req.prompt_ids),
                                      req.cached_prompt_tokens, comps, req.timings(), req.error)
        self.requests.pop(req.request_id, None)  # finished: only the event holds it now
        events.append(TokenEvent(req.request_id, 0, [], "", result=req.result))
