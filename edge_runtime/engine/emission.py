"""Tokens out: after the forward, a token for each sequence that reached its logits, appended
with its grammar and stop checks, and the events.

`Emitter.sample_and_emit` forks the other choices of an n > 1 request at its first token (they
sample from the same logits row), has the step runner sample the plain sequences, appends each
token (engine/stop.py: detokenize, stop strings, eos, max_tokens; the context length; the grammar's
end) and hands each beam search its logits rows (engine/beam.py decides, the emitter forks and
drops). A finished sequence leaves through the lifecycle (engine/seq_lifecycle.py), and its
request ends when its last sequence does.

Jump-forward: after a constrained sequence's token is appended, every token its grammar then
forces (the mask allows exactly that one, `Matcher.forced_token`) is appended too, with the same
grammar and stop checks and one event each, before the next forward. The sequence then has more
than one token pending, and the scheduler computes them as one chunk (a prefill-style extend of a
decoding sequence: the normal KV paths write them), whose last row's logits give the next free
token. A forced token is what any sampler picks under that mask, so outputs are unchanged; a
sampled (temperature > 0) row still takes the one uniform from its generator that the step it
skips would have drawn, so seeded outputs are unchanged too. Requests that ask for log-probs do
not jump (their forced tokens' log-probs are the model's, computed a step each); beam search takes
no grammar. `EngineConfig.jump_forward` turns it off.

Drafts (engine/forced_drafts.py): then a greedy sequence drafts the forced text that several
tokens could start; the next forward gives a row per draft token, and `_take_draft` keeps the
draft as far as the sampler picked it (committing those tokens' K/V: they were computed), then
appends the sampler's next token as any sampled one. `EngineConfig.forced_text_drafts`.

Invariants: called with the engine lock held, once per step, after the step's tokens were
committed; the plain sequences' tokens are appended in choice order (index) per request.
"""

from __future__ import annotations

import time

import torch

from edge_runtime.engine import beam
from edge_runtime.engine.api import TokenEvent
from edge_runtime.engine.forced_drafts import accepted_count, build_draft
from edge_runtime.engine.sampler import SampleRows, SamplerRow, skip_draw
from edge_runtime.engine.seq_lifecycle import SeqLifecycle
from edge_runtime.engine.sequence import Request, Sequence, SeqStatus


class Emitter:
    def __init__(self, runner, constraints, lifecycle: SeqLifecycle, tokenizer,
                 max_positions: int, counters: dict[str, int], jump_forward: bool = True,
                 drafts: bool = True, window: int = 0):
        self.runner = runner  # samples, and computes beam candidates, where the logits are
        self.constraints = constraints
        self.lifecycle = lifecycle
        self.tokenizer = tokenizer
        self.max_positions = max_positions  # the model's context: a sequence ends there
        self.counters = counters
        self.jump_forward = jump_forward  # append grammar-forced tokens without a forward each
        self.drafts = drafts  # greedy rows: draft the forced text (engine/forced_drafts.py)
        # int8 KV's recent-key window (kv/recent_window.py): a chunk that reaches a new block
        # moves the window there, so a draft stays inside the block of the last certain token
        self.window = window

    def sample_and_emit(self, sampled: list[tuple[int, Sequence]], logits: torch.Tensor,
                        events: list[TokenEvent], masks=None) -> None:
        """A token for each sampled (row, sequence) (row of `logits`; a sequence with a draft has
        one more row per draft token; beam requests go to their search), the choices of an n > 1
        request forked at its first token, the events out."""
        plain_rows, plain_seqs, seen = [], [], []  # plain_rows: the logits row of each plain row
        beam_groups: dict[str, list[tuple[Sequence, torch.Tensor]]] = {}
        for row, seq in sampled:
            if seq.request.is_beam:
                beam_groups.setdefault(seq.request.request_id, []).append((seq, logits[row]))
                continue
            if seq.draft is not None:  # a row before each draft token, one after the last
                for j in range(seq.num_draft + 1):
                    plain_rows.append(row + j)
                    plain_seqs.append(seq)
                    seen.append(seq.token_ids + seq.draft.token_ids[:j])
                continue
            for s in self._fork_choices(seq) + [seq]:  # n > 1: children share the prompt's pages
                plain_rows.append(row)
                plain_seqs.append(s)
                seen.append(s.token_ids)
        if plain_seqs:
            rows = SampleRows(plain_rows,
                              [SamplerRow(s.request.params, s.generator, ids, s.num_prompt)
                               for s, ids in zip(plain_seqs, seen)],
                              [s.request.params.logprobs for s in plain_seqs])
            tokens, lps = self.runner.sample(logits, rows, self.constraints, masks)
            per_seq: dict[int, tuple[Sequence, list, list]] = {}
            for seq, tok, lp in zip(plain_seqs, tokens, lps):
                per_seq.setdefault(id(seq), (seq, [], []))[1].append(tok)
                per_seq[id(seq)][2].append(lp)
            for seq, toks, seq_lps in sorted(per_seq.values(), key=lambda x: x[0].index):
                if seq.draft is not None:
                    self._take_draft(seq, toks, events)
                else:
                    self._append_token(seq, toks[0], events, seq_lps[0])
        for group in beam_groups.values():
            self._beam_step(group[0][0].request, group, events)

    def _take_draft(self, seq: Sequence, tokens: list[int], events: list[TokenEvent]) -> None:
        """Keep `seq`'s draft as far as the sampler picked it (tokens[j]: row j's pick), then the
        first token it did not (or the one after the draft) as a sampled token."""
        draft, seq.draft = seq.draft, None
        kept = accepted_count(draft.token_ids, tokens)
        self.counters["draft_tokens_kept"] += kept
        for token in draft.token_ids[:kept]:
            if not self._append_one(seq, token, events, computed=True):
                return
        self._append_token(seq, tokens[kept], events)

    def _fork_choices(self, parent: Sequence) -> list[Sequence]:
        """The other n - 1 choices of `parent`'s request at its first token, sharing its KV."""
        req = parent.request
        if req.params.n == 1 or len(req.seqs) > 1 or parent.num_generated > 0:
            return []
        return [self.lifecycle.fork(parent, i, seed_offset=i) for i in range(1, req.params.n)]

    def _append_token(self, seq: Sequence, token: int, events: list[TokenEvent], logprob=None) -> None:
        """`token` onto `seq`, then the tokens its grammar forces after it (jump-forward)."""
        going = self._append_one(seq, token, events, logprob)
        if not (going and self.jump_forward and self._may_jump(seq)):
            return
        while going and (forced := self.constraints.forced_token(seq)) is not None:
            if seq.request.params.temperature > 0:
                skip_draw(seq.generator)  # the draw the skipped step would have taken
            self.counters["forced_tokens"] += 1
            going = self._append_one(seq, forced, events)
        if going and self.drafts and seq.request.params.temperature == 0:
            room = self._draft_room(seq)
            if room > 0:
                seq.draft = build_draft(seq.matcher, self._encode, room)

    def _draft_room(self, seq: Sequence) -> int:
        """How many draft tokens may follow: within max_tokens and the context with a token to
        spare (the one sampled after the draft), and inside the recent-key window's block."""
        room = min(seq.request.params.max_tokens - seq.num_generated,
                   self.max_positions - len(seq.token_ids)) - 1
        if self.window:
            room = min(room, self.window - 1 - (len(seq.token_ids) - 1) % self.window)
        return room

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @staticmethod
    def _may_jump(seq: Sequence) -> bool:
        """Constrained, and not asking for log-probs (a forced token's is the model's, which
        takes the forward a jump skips)."""
        params = seq.request.params
        assert seq.matcher is None or not seq.request.is_beam, "beam search takes no grammar"
        return seq.matcher is not None and params.logprobs is None

    def _append_one(self, seq: Sequence, token: int, events: list[TokenEvent], logprob=None,
                    computed: bool = False) -> bool:
        """`token` onto `seq`: grammar, stop checks, the event; a finished sequence leaves the
        scheduler and its request ends when its last sequence does. True while `seq` goes on.
        computed: its K/V is written already (a kept draft token): committed with it."""
        req = seq.request
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        seq.token_ids.append(int(token))
        if computed:
            self.lifecycle.kv.commit(seq.seq_id, [int(token)])
            seq.num_computed += 1
        grammar_ended = self.constraints.accept(seq, int(token))
        if logprob is not None:
            seq.logprobs.append(logprob)
        delta, reason = seq.stop.append(int(token))
        if reason is None and len(seq.token_ids) >= self.max_positions:
            delta += seq.stop.finish_cancelled()
            seq.stop.finish_reason = reason = "length"
        if reason is None and grammar_ended:  # e.g. under ignore_eos: nothing more may follow
            delta += seq.stop.finish_cancelled()
            seq.stop.finish_reason = reason = "stop"
        events.append(TokenEvent(req.request_id, seq.index, [int(token)], delta,
                                 logprobs=None if logprob is None else [logprob]))
        if reason is not None:
            self.lifecycle.drop_seq(seq, cached=True)
            if all(s.status is SeqStatus.FINISHED for s in req.seqs):
                self.counters["requests_finished"] += 1
                self.lifecycle.finish_request(req, events)
        return reason is None

    def _beam_step(self, req: Request, group: list, events: list[TokenEvent]) -> None:
        """One step of `req`'s beam search (engine/beam.py decides): the chosen beams forked and
        carried on, the others dropped; or, when the search is over, its completions out."""
        chosen = beam.step(self.runner, req, group)
        state = req.beam_state
        if chosen is not None:
            next_beams, forks, dropped = beam.advance(state, chosen)
            for slot, parent, token, score in forks:  # fork before any parent gets its new token
                next_beams[slot] = (self.lifecycle.fork(parent, len(req.seqs)), token, score)
            for seq in dropped:
                self.lifecycle.drop_seq(seq, cached=False)
            beam.take_tokens(state, next_beams)
        else:
            for seq in state.running:
                self.lifecycle.drop_seq(seq, cached=True)
            comps = beam.completions(state, self.tokenizer)
            for index, comp in enumerate(comps):
                events.append(TokenEvent(req.request_id, index, list(comp.token_ids), comp.text))
            self.counters["requests_finished"] += 1
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        if chosen is None:
            self.lifecycle.finish_request(req, events, completions=comps)
