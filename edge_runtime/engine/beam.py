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

This module decides; the emitter acts (engine/emission.py): `step` returns the beams to go on with
(or None: the search is over, `completions` says with what), `advance` says which parents go on,
which fork and which are dropped, and the emitter forks, drops and schedules the sequences
(engine/seq_lifecycle.py). The candidates are computed on the device by the step runner
(StepRunner.top_candidates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from edge_runtime.engine.api import Completion

_NEG = -1.0e9


@dataclass
class BeamGroup:
    width: int
    stop_ids: frozenset[int]
    running: list = field(default_factory=list)  # Sequences, in transformers' running order
    finished: list = field(default_factory=list)  # (score, generated ids), best first, <= width
    improvable: bool = True


def start(req, eos_token_ids) -> None:
    """The search's state on `req`, running its first sequence (the prompt)."""
    p = req.params
    stop_ids = set(p.stop_token_ids)
    if not p.ignore_eos:
        stop_ids |= set(eos_token_ids)
    req.beam_state = BeamGroup(p.beam_width, frozenset(stop_ids), running=[req.seqs[0]])


def step(runner, req, group: list) -> list | None:
    """group: [(seq, logits row)] for the beams that computed their last token this step ->
    the next beams, [(parent index in the running beams, token, score)], or None: the search is
    over (`completions(state)` holds its result)."""
    state: BeamGroup = req.beam_state
    rows = dict((id(s), r) for s, r in group)
    assert set(rows) == {id(s) for s in state.running}, "beams out of lockstep"
    k, num_prompt = state.width, len(req.prompt_ids)
    vocab = group[0][1].shape[-1]
    keep = min(max(2, 1 + len(state.stop_ids)) * k, len(state.running) * vocab)
    top_vals, top_idx = runner.top_candidates([rows[id(s)] for s in state.running],
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
        return None
    return [(parents[j], tokens[j], float(next_vals[i])) for i, j in enumerate(next_pos.tolist())]


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


def advance(state: BeamGroup, chosen: list):
    """-> (next: [(parent seq or None, token, score)] in the new running order, forks: [(slot in
    next, parent, token, score)], dropped: parents nobody chose). A parent's first pick keeps its
    sequence; a further pick of the same parent is a fork (None in `next` until the emitter makes
    it), made before any parent gets its new token."""
    old = state.running
    used: set[int] = set()
    next_beams, forks = [], []
    for parent_idx, token, score in chosen:
        parent = old[parent_idx]
        if parent_idx not in used:
            used.add(parent_idx)
            next_beams.append((parent, token, score))
        else:
            forks.append((len(next_beams), parent, token, score))
            next_beams.append(None)
    return next_beams, forks, [seq for i, seq in enumerate(old) if i not in used]


def take_tokens(state: BeamGroup, next_beams: list) -> None:
    """The chosen beams, each with its new token and score, are the running ones."""
    state.running = []
    for seq, token, score in next_beams:
        seq.token_ids.append(token)
        seq.beam_score = score
        state.running.append(seq)


def cut_short_completions(req, tokenizer, reason: str) -> list[Completion]:
    """A search cancelled or failed midway: its running beams, best score first, ending `reason`
    (sequence 0 may have been dropped long before, so req.seqs[0] says nothing)."""
    comps = []
    for seq in sorted(req.beam_state.running, key=lambda s: -s.beam_score):
        ids = seq.token_ids[len(req.prompt_ids):]
        comps.append(Completion(tokenizer.decode(ids), list(ids), reason))
    return comps


def completions(state: BeamGroup, tokenizer) -> list[Completion]:
    """The finished hypotheses, best first: their text without the stop tokens."""
    comps = []
    for ids in (ids for _, ids in state.finished):
        text_ids = [t for t in ids if t not in state.stop_ids]
        reason = "stop" if ids and ids[-1] in state.stop_ids else "length"
        comps.append(Completion(tokenizer.decode(text_ids), list(ids), reason))
    return comps
