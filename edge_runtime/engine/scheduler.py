"""Continuous batching: decide, each step, which sequences compute how many tokens.

Policy (one `schedule()` call per engine step):
1. Every running sequence that is decoding (one pending token) is scheduled first, oldest first,
   so prefills never starve decode. Each takes one token of the step's token budget.
2. Running sequences still in prefill get chunks of what is left of the budget (chunked prefill).
3. Waiting sequences are admitted in FIFO order (preempted ones sit at the head, oldest first)
   while there is budget, a free sequence slot, the admission gate allows it (memory guard) and the
   KVManager can plan their KV. Admission never skips ahead of a request that does not fit now.
4. When storage for a scheduled token cannot be reserved (OutOfPages), the running sequence with
   the lowest priority, newest first among equals, is preempted (its private storage released, full pages stay cached) and put back at
   the head of the queue; on resume it recomputes only what is no longer cached. No request is
   dropped, unless it cannot fit even alone (then it fails with a RequestError message). "Alone"
   means on an empty cache: a request that runs out of pages with nothing else running is first
   restarted once with every cached page evicted, since a prefix hit can make it need more pages
   than a cold start (it pins the matched pages and copies a shared partial page per fork).

5. Requests that arrive together with one uncached prefix (five streams, one system prompt): the
   first computes it; the others are admitted into the same step, after it, reading its pages.
   For that the step's prefill tokens are committed when the step is planned ("ahead": their K/V
   is written in the forward before any attention reads it, layer by layer, on every path), so
   the prefix cache matches them; `committed` tells the engine not to commit them again. Only a
   sequence that needs no copy is admitted so (a copy runs before the forward, when those pages
   are not written yet); nothing is preempted after the commit. Before this the others waited a
   step (`_waits_for_inflight_prefix`), as they still do for a prefill longer than the step.

6. A sequence scheduled with all its pending tokens also computes its draft of grammar-forced
   text (engine/forced_drafts.py), cut to what is left of the budget and to the storage already
   reserved for those tokens (the rest of their page or inline slot), after every decode and
   prefill chunk and before admissions; a draft reserves nothing and never preempts. Only the
   kept part of a draft is committed (by the emitter); its rejected positions are written again.

Beam groups (a beam-search request's sequences) move together: admitted all-or-nothing, never
chunked, preempted together, so every beam has its logits in the same step.

Invariants: a sequence is in at most one of `waiting` / `running`; the KVManager holds a plan for
exactly the running sequences. No torch here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from edge_runtime.engine.sequence import Sequence, SeqStatus
from edge_runtime.errors import OutOfPages

# A waiting request that shares this many more tokens with a prefill in flight than the cache
# can give it waits for that prefill instead of computing its own copy.
SHARE_WAIT_TOKENS = 32


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, num_new_tokens)
    copies: list = field(default_factory=list)  # (seq, CopyOp) to run before the forward
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[tuple[Sequence, str]] = field(default_factory=list)  # can never fit: error
    committed: set = field(default_factory=set)  # seq_ids whose scheduled tokens are committed

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, kv_manager, max_num_seqs: int, max_batch_tokens: int,
                 admission_gate: Callable[[], bool] | None = None):
        assert max_batch_tokens >= max_num_seqs, (max_batch_tokens, max_num_seqs)
        self.kv = kv_manager
        self.max_num_seqs = max_num_seqs
        self.max_batch_tokens = max_batch_tokens
        self.admission_gate = admission_gate or (lambda: True)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    # --- queue management -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """A forked sequence: its KV plan already exists in the KVManager."""
        seq.status = SeqStatus.RUNNING
        self.running.append(seq)

    def remove(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- the step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_batch_tokens
        for seq in sorted(self.running, key=lambda s: s.arrival):
            if seq.num_pending == 1 and seq.status is SeqStatus.RUNNING:
                budget -= self._reserve_or_preempt(seq, 1, out)
        for seq in sorted(self.running, key=lambda s: s.arrival):
            if seq.num_pending > 1 and seq.status is SeqStatus.RUNNING and budget > 0:
                n = seq.num_pending if seq.request.is_beam else min(seq.num_pending, budget)
                budget -= self._reserve_or_preempt(seq, n, out)
        budget -= self._add_drafts(out, budget)
        budget, held = self._admit(out, budget)
        if held and budget > 0:  # policy 5: share a prefix computed in this very step
            self._commit_ahead(out)
            self._admit(out, budget, copies_allowed=False)
        return out

    def _admit(self, out: SchedulerOutput, budget: int,
               copies_allowed: bool = True) -> tuple[int, bool]:
        """Admit from the head of the queue; returns (budget left, whether the head waits for a
        prefix being computed in this step)."""
        while self.waiting and budget > 0 and self.admission_gate():
            group = self._waiting_group(self.waiting[0])
            width = max(len(group), self._width(group[0]))
            if self.running and len(self.running) + width > self.max_num_seqs:
                break
            if self._waits_for_inflight_prefix(group[0]):
                return budget, True
            admitted = self._admit_group(group, budget, out, copies_allowed)
            if admitted is None:
                break
            budget -= admitted
        return budget, False

    def _add_drafts(self, out: SchedulerOutput, budget: int) -> int:
        """Policy 6: a sequence scheduled with all its pending tokens also computes its draft
        (engine/forced_drafts.py) when the budget and its storage allow; returns tokens added."""
        added = 0
        for i, (seq, n) in enumerate(out.scheduled):
            if not seq.num_draft or n != seq.num_pending:
                continue
            # only inside the storage reserved for the pending tokens (a page or slot ends the
            # draft): its rejected positions then sit past the committed ones in the last page
            # or slot, which the KV bookkeeping allows
            segs = self.kv.segments(seq.seq_id)
            room = segs.prefix_len + segs.tail_capacity - seq.num_computed - n
            k = min(seq.num_draft, room, budget - added)
            if k <= 0:
                continue
            seq.draft = seq.draft.truncated(k)
            out.scheduled[i] = (seq, n + k)
            added += k
        return added

    def _commit_ahead(self, out: SchedulerOutput) -> None:
        """Commit the prefill tokens of this step now, so that the prefix cache matches them
        (not a draft's: it is committed as far as it is kept)."""
        for seq, n in out.scheduled:
            if n > 1 and seq.seq_id not in out.committed:
                real = min(n, seq.num_pending)
                self.kv.commit(seq.seq_id, seq.token_ids[seq.num_computed:seq.num_computed + real])
                out.committed.add(seq.seq_id)

    def _admit_group(self, group: list[Sequence], budget: int, out: SchedulerOutput,
                     copies_allowed: bool = True) -> int | None:
        """Plan KV for every sequence of the group, or for none. Returns tokens scheduled;
        None when it must wait (no pages now, or a copy where `copies_allowed` is False)."""
        planned, used, copies = [], 0, []
        try:
            for seq in group:
                plan = self.kv.admit(seq.seq_id, list(seq.token_ids), seq.max_new_remaining)
                planned.append(seq)
                seq.num_computed = plan.num_cached_tokens
                n = seq.num_pending if seq.request.is_beam else min(seq.num_pending, budget - used)
                copies += [(seq, op) for op in self.kv.reserve(seq.seq_id, n)]
                used += n
            if copies and not copies_allowed:
                for seq in planned:
                    self.kv.release(seq.seq_id, [op for s, op in copies if s is seq])
                    seq.num_computed = 0
                return None
        except OutOfPages as exc:
            for seq in planned:
                self.kv.release(seq.seq_id)
                seq.num_computed = 0
            if not self.running:  # nothing will ever free pages for it
                if self._restart_cold(group[0], out):
                    return 0
                for seq in group:
                    self.waiting.remove(seq)
                    out.failed.append((seq, f"the KV pool cannot hold this request ({exc})"))
                return 0
            return None
        for seq in group:
            self.waiting.remove(seq)
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            req = seq.request
            if seq.index == 0 and req.first_scheduled_at is None:
                req.cached_prompt_tokens = min(seq.num_computed, len(req.prompt_ids))
        out.copies += copies
        remaining = budget
        for seq in group:
            n = seq.num_pending if seq.request.is_beam else min(seq.num_pending, remaining)
            out.scheduled.append((seq, n))
            remaining -= n
        return used

    def _reserve_or_preempt(self, seq: Sequence, n: int, out: SchedulerOutput) -> int:
        """Reserve storage for n tokens of a running seq, preempting newer ones if needed."""
        while True:
            try:
                out.copies += [(seq, op) for op in self.kv.reserve(seq.seq_id, n)]
                out.scheduled.append((seq, n))
                return n
            except OutOfPages as exc:
                victim = min(self.running, key=_victim_order)
                if victim.request is seq.request and len(self._running_groups()) == 1:
                    if self._restart_cold(seq, out):
                        return 0
                    self._preempt_group(victim, out)
                    for s in self._waiting_group(seq):
                        self.waiting.remove(s)
                        out.failed.append((s, f"the KV pool cannot hold this request ({exc})"))
                    return 0
                self._preempt_group(victim, out)
                if seq.status is not SeqStatus.RUNNING:
                    return 0

    def preempt_newest(self, k: int) -> list[Sequence]:
        """Memory-guard hook: preempt the k newest running groups."""
        out = SchedulerOutput()
        for _ in range(k):
            if not self.running:
                break
            self._preempt_group(max(self.running, key=lambda s: s.arrival), out)
        return out.preempted

    def _preempt_group(self, victim: Sequence, out: SchedulerOutput) -> None:
        group = [s for s in self.running if s.request is victim.request] \
            if victim.request.is_beam else [victim]
        for seq in group:
            self.kv.preempt(seq.seq_id)
            self.running.remove(seq)
            seq.status = SeqStatus.WAITING
            seq.num_computed = 0
            out.scheduled = [(s, n) for s, n in out.scheduled if s is not seq]
            out.copies = [(s, op) for s, op in out.copies if s is not seq]
            out.preempted.append(seq)
            seq.request.num_preemptions += 1
            self.num_preemptions += 1
        # back to the head of the queue, oldest first among the preempted
        for seq in sorted(group, key=lambda s: s.arrival, reverse=True):
            self.waiting.appendleft(seq)

    def _restart_cold(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """The request of `seq` is out of pages with no other request running. Once, preempt all
        of it and evict every cached page, so it starts again as on a fresh engine; True if done."""
        req = seq.request
        if req.restarted_cold:
            return False
        req.restarted_cold = True
        for s in [s for s in self.running if s.request is req]:
            if s in self.running:  # a beam group is preempted as a whole
                self._preempt_group(s, out)
        self.kv.evict(None)
        return True

    def _waits_for_inflight_prefix(self, seq: Sequence) -> bool:
        """True when `seq` shares at least SHARE_WAIT_TOKENS more prompt tokens with a sequence
        still in prefill than the prefix cache can give it now. Admitting it would compute (and
        store) a second copy of that prefix in the same step; waiting one step lets it match the
        pages the other sequence commits (streams that arrive together with one system prompt)."""
        if not self.kv.enable_prefix_cache or seq.request.is_beam or seq.num_computed:
            return False
        prompt = seq.token_ids
        shared = max((_common_prefix_len(prompt, r.token_ids) for r in self.running
                      if r.num_pending > 1), default=0)
        if shared < SHARE_WAIT_TOKENS:
            return False
        cached = self.kv.cached_prefix(prompt).num_cached
        return shared - cached >= SHARE_WAIT_TOKENS

    # --- helpers ----------------------------------------------------------------------------
    def _waiting_group(self, seq: Sequence) -> list[Sequence]:
        if not seq.request.is_beam:
            return [seq]
        return [s for s in self.waiting if s.request is seq.request]

    def _running_groups(self) -> set[int]:
        return {id(s.request) for s in self.running}

    @staticmethod
    def _width(seq: Sequence) -> int:
        p = seq.request.params
        if seq.num_computed == 0 and not seq.request.seqs[1:]:
            return max(p.n, p.beam_width)  # children will be forked after the prompt
        return 1


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _victim_order(seq: Sequence) -> tuple[int, int]:
    """Preempt the lowest priority first, then the newest."""
    return (seq.request.priority, -seq.arrival)
