"""Beam search (width <= 4) on the fork mechanism, matching transformers' `generate(num_beams=k,
do_sample=False)` with its defaults (length_penalty 1.0, early_stopping False).

Per step, mirroring transformers/generation/utils.py `_beam_search` (v5):
1. accumulated = log_softmax(logits) + running score, over [num_running_beams * vocab]; take the
   top `beams_to_keep = max(2, 1 + num_eos) * k` candidates (torch.topk, so ties break alike).
2. A candidate "hits a stop" if its token is an eos/stop id, or the generated length reaches
   max_tokens. Among the top k candidates, the ones that hit are finished hypotheses, scored
   accumulated / generated_len ** length_penalty (the stop token counts in the length), and merged
   into the k best finished.
3. The next running beams are the k best candidates that did not hit (in topk order). Each is a
   sequence: the first candidate of a parent reuses the parent's sequence, further ones fork it
   (KVManager.fork: pages shared, copy-on-write for the partial page); parents nobody chose are
   released.
4. Stop when every candidate hit a stop, or (early_stopping False heuristic) all k finished slots
   are filled and best_running_score / generated_len <= the worst finished score.

Differences from transformers, deliberate: repetition penalty, temperature, top-k/p and stop
strings do not apply to beams (refused or ignored: only eos, stop_token_ids and max_tokens end a
beam); completions are all finished hypotheses best first (transformers returns
num_return_sequences of them). Beams do not stream: their tokens are only final when the search
ends, so each completion's tokens arrive in one event at the end.

The first step starts from one sequence (the prompt, prefilled once), which equals transformers'
k identical beams with scores [0, -1e9, ...]: no candidate can come from the -1e9 rows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from edge_runtime.engine.api import Completion, TokenEvent
from edge_runtime.engine.step_transfers import device_region

_NEG = -1.0e9


@dataclass
class BeamGroup:
    width: int
    stop_ids: frozenset[int]
    running: list = field(default_factory=list)  # Sequences, in transformers' running order
    finished: list = field(default_factory=list)  # (score, generated ids), best first, <= width
    improvable: bool = True


def start(engine, req) -> None:
    p = req.params
    stop_ids = set(p.stop_token_ids)
    if not p.ignore_eos:
        stop_ids |= set(engine.model_config.eos_token_ids)
    first = req.seqs[0]
    req.beam_state = BeamGroup(p.beam_width, frozenset(stop_ids), running=[first])
    engine.scheduler.add(first)


def step(engine, req, group: list, events: list) -> None:
    """group: [(seq, logits row)] for the beams that computed their last token this step."""
    state: BeamGroup = req.beam_state
    rows = dict((id(s), r) for s, r in group)
    assert set(rows) == {id(s) for s in state.running}, "beams out of lockstep"
    k, num_prompt = state.width, len(req.prompt_ids)
    vocab = group[0][1].shape[-1]
    keep = min(max(2, 1 + len(state.stop_ids)) * k, len(state.running) * vocab)
    top_vals, top_idx = _top_candidates(engine.transfers, [rows[id(s)] for s in state.running],
                                        [s.beam_score for s in state.running], keep)
    parents, tokens = (top_idx // vocab).tolist(), (top_idx % vocab).tolist()
    gen_len = state.running[0].num_generated + 1  # generated tokens including this one
    at_max = gen_len >= req.params.max_tokens
    hits = [at_max or t in state.stop_ids for t in tokens]
    _add_finished(state, req, parents, tokens, top_vals.tolist(), hits, gen_len)
    masked = top_vals + torch.tensor(hits, dtype=torch.float32) * _NEG
    next_vals, next_pos = torch.topk(masked, min(k, keep))
    best_running = float(next_vals[0])
    if state.improvable and len(state.finished) >= k:
        worst = min(score for score, _ in state.finished)
        state.improvable = best_running / gen_len > worst
    if all(hits) or not state.improvable:
        _finish(engine, req, state, events)
        return
    chosen = [(parents[j], tokens[j], float(next_vals[i])) for i, j in enumerate(next_pos.tolist())]
    _advance(engine, req, state, chosen)


def _top_candidates(transfers, logits_rows: list, scores: list[float], keep: int):
    """The `keep` best (beam, token) candidates, computed where the logits are; only those cross
    to the host (one upload of the scores, one download) -> (float32 values, long flat indices)."""
    dev = transfers.upload({"scores": torch.tensor(scores, dtype=torch.float32)})
    with device_region():
        logits = torch.stack(logits_rows).float()  # [nb, V]
        acc = (torch.log_softmax(logits, dim=-1) + dev["scores"][:, None]).reshape(-1)  # [nb * V]
        top_vals, top_idx = torch.topk(acc, keep)
        flat = transfers.download(torch.cat([top_vals.double(), top_idx.double()]))
    return (torch.tensor(flat[:keep], dtype=torch.float32),
            torch.tensor([int(i) for i in flat[keep:]], dtype=torch.long))


def _add_finished(state, req, parents, tokens, vals, hits, gen_len) -> None:
    if not state.improvable:
        return
    for j in range(min(state.width, len(tokens))):
        if hits[j]:
            parent = state.running[parents[j]]
            ids = parent.token_ids[len(req.prompt_ids):] + [tokens[j]]
            state.finished.append((vals[j] / gen_len ** 1.0, ids))
    state.finished.sort(key=lambda x: -x[0])  # stable: earlier finished win ties, as in topk
    del state.finished[state.width:]


def _advance(engine, req, state: BeamGroup, chosen: list) -> None:
    old = state.running
    used: set[int] = set()
    new_running = []
    forks = []
    for parent_idx, token, score in chosen:
        parent = old[parent_idx]
        if parent_idx not in used:
            used.add(parent_idx)
            new_running.append((parent, token, score))
        else:
            forks.append((len(new_running), parent, token, score))
            new_running.append(None)
    for slot, parent, token, score in forks:  # fork before any parent gets its new token
        child = engine.new_seq(req, len(req.seqs), list(parent.token_ids))
        engine.fork_kv(parent, child)
        child.num_computed = parent.num_computed
        engine.scheduler.add_running(child)
        new_running[slot] = (child, token, score)
    for i, seq in enumerate(old):
        if i not in used:
            engine.drop_seq(seq, cached=False)
    state.running = []
    for seq, token, score in new_running:
        seq.token_ids.append(token)
        seq.beam_score = score
        state.running.append(seq)
    if req.first_token_at is None:
        req.first_token_at = time.perf_counter()


def cut_short_completions(engine, req, reason: str) -> list[Completion]:
    """A search cancelled or failed midway: its running beams, best score first, ending `reason`
    (sequence 0 may have been dropped long before, so req.seqs[0] says nothing)."""
    comps = []
    for seq in sorted(req.beam_state.running, key=lambda s: -s.beam_score):
        ids = seq.token_ids[len(req.prompt_ids):]
        comps.append(Completion(engine.tokenizer.decode(ids), list(ids), reason))
    return comps


def _finish(engine, req, state: BeamGroup, events: list) -> None:
    for seq in state.running:
        engine.drop_seq(seq, cached=True)
    comps = []
    for index, (_, ids) in enumerate(state.finished):
        text_ids = [t for t in ids if t not in state.stop_ids]
        reason = "stop" if ids and ids[-1] in state.stop_ids else "length"
        text = engine.tokenizer.decode(text_ids)
        comps.append(Completion(text, list(ids), reason))
        events.append(TokenEvent(req.request_id, index, list(ids), text))
    if req.first_token_at is None:
        req.first_token_at = time.perf_counter()
    engine.counters["requests_finished"] += 1
    engine.finish_request(req, events, completions=comps)
