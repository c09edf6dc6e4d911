"""A step's sampled tokens into its sequences and out as events (the Engine calls
`sample_and_emit` after each forward): the choices of an n > 1 request fork at their first token,
each token passes the grammar and stop checks, and a sequence that stops gives its KV back."""

from __future__ import annotations

import time

import torch

from edge_runtime.engine import beam
from edge_runtime.engine.api import TokenEvent
from edge_runtime.engine.sampler import SampleRows, SamplerRow
from edge_runtime.engine.sequence import Sequence, SeqStatus
from edge_runtime.engine.step_transfers import device_region



def sample_and_emit(engine, seqs: list[Sequence], logits: torch.Tensor,
                    events: list[TokenEvent], masks=None) -> None:
    """Sample a token for each of `seqs` (row i of `logits`: seqs[i]; beam requests go to
    beam.step), fork the choices of an n > 1 request at its first token, and emit the events."""
    plain_rows, plain_seqs = [], []  # plain_rows: the logits row of each plain sequence
    beam_groups: dict[str, list[tuple[Sequence, torch.Tensor]]] = {}
    for i, seq in enumerate(seqs):
        if seq.request.is_beam:
            beam_groups.setdefault(seq.request.request_id, []).append((seq, logits[i]))
            continue
        for s in _fork_children(engine, seq) + [seq]:  # n > 1: children share the prompt's pages
            plain_rows.append(i)
            plain_seqs.append(s)
    if plain_seqs:
        batch = SampleRows(plain_rows,
                           [SamplerRow(s.request.params, s.generator, s.token_ids, s.num_prompt)
                            for s in plain_seqs],
                           [s.request.params.logprobs for s in plain_seqs])
        with torch.inference_mode(), device_region():
            tokens, lps = engine.sampler.choose(logits, batch, engine.constraints, masks)
        for seq, tok, lp in sorted(zip(plain_seqs, tokens, lps), key=lambda x: x[0].index):
            append_token(engine, seq, tok, events, lp)
    for rid, group in beam_groups.items():
        beam.step(engine, group[0][0].request, group, events)


def _fork_children(engine, parent: Sequence) -> list[Sequence]:
    """The other n - 1 choices of `parent`'s request at its first token, sharing its KV."""
    req = parent.request
    if req.params.n == 1 or len(req.seqs) > 1 or parent.num_generated > 0:
        return []
    children = []
    for i in range(1, req.params.n):
        child = engine.new_seq(req, i, list(parent.token_ids), seed_offset=i)
        engine.fork_kv(parent, child)
        child.num_computed = parent.num_computed
        engine.scheduler.add_running(child)
        children.append(child)
    return children


def append_token(engine, seq: Sequence, token: int, events: list[TokenEvent], logprob=None) -> None:
    """`token` onto `seq`: grammar, stop checks, the event; a finished sequence leaves the
    scheduler and its request ends when its last sequence does."""
    req = seq.request
    if req.first_token_at is None:
        req.first_token_at = time.perf_counter()
    seq.token_ids.append(int(token))
    grammar_ended = engine.constraints.accept(seq, int(token))
    if logprob is not None:
        seq.logprobs.append(logprob)
    delta, reason = seq.stop.append(int(token))
    if reason is None and len(seq.token_ids) >= engine.model_config.max_position_embeddings:
        delta += seq.stop.finish_cancelled()
        seq.stop.finish_reason = reason = "length"
    if reason is None and grammar_ended:  # e.g. under ignore_eos: nothing more may follow
        delta += seq.stop.finish_cancelled()
        seq.stop.finish_reason = reason = "stop"
    events.append(TokenEvent(req.request_id, seq.index, [int(token)], delta,
                             logprobs=None if logprob is None else [logprob]))
    if reason is not None:
        engine.drop_seq(seq, cached=True)
        if all(s.status is SeqStatus.FINISHED for s in req.seqs):
            engine.counters["requests_finished"] += 1
            engine.finish_request(req, events)
