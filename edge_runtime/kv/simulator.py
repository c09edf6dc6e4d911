"""Replay token-level requests through the real KVManager, without a model (no torch).

Closed loop: every stream sends its next turn as soon as its previous turn finished (think time
and `arrival_s` are ignored: that is the worst case for memory, all streams live at once). One
step = admission then one decode token for every running sequence, like the engine. By default each
admitted request is prefilled before the next is admitted, so the next one already shares its
pages; `admit_together` admits the whole batch first (an engine that plans every admission of a
step before running it): requests arriving together then cannot share what none has written.
The answer's tokens are given; the last one (end of turn) is sampled but its K/V never written,
exactly as in generation. When a decode step cannot get a page, the newest running sequence is
preempted and re-queued at the head with what it generated; on resume it is admitted again with
prompt + generated tokens and recomputes what is no longer cached.

Peaks are measured at the end of every step AND just before any sequence releases its pages
(finish, preemption): a request that ends in its own prefill (a one-token answer) holds its pages
only inside the step, and measuring only at the step's end saw an empty pool.

Invariants: the manager's invariants are checked every `check_every` steps and a leak check runs
at the end; all requests finish (none is dropped).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from edge_runtime.kv.manager import KVManager
from edge_runtime.errors import OutOfPages


@dataclass
class SimRequest:
    stream: str
    turn: int
    prompt_ids: list[int]
    answer_ids: list[int]  # generated tokens, the last one ends the turn
    generated: list[int] = field(default_factory=list)


@dataclass
class SimResult:
    page_tokens: int
    num_pages: int
    sharing: bool
    peak_pages: int = 0  # live + cached at the worst step
    peak_live_pages: int = 0
    peak_inline_slots: int = 0
    peak_kv_bytes: int = 0  # live + cached pages and used slots
    peak_live_kv_bytes: int = 0  # live pages and used slots only (bench trace's "peak KV bytes")
    utilization_at_peak: float = 0.0
    mean_utilization: float = 0.0
    prompt_tokens: int = 0  # the trace's prompts, what a runtime without a cache computes
    computed_prompt_tokens: int = 0  # prompt tokens actually prefilled (incl. resumes)
    cached_prompt_tokens: int = 0  # served from the cache at first admission (not resumes)
    hit_rate: float = 0.0  # cached_prompt_tokens / prompt_tokens
    copies: int = 0
    evictions: int = 0
    preemptions: int = 0
    system_prompt_copies: int = 0  # pages holding position 0 at the peak
    steps: int = 0

    @property
    def computed_fraction(self) -> float:
        return self.computed_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class Simulator:
    def __init__(self, mgr: KVManager, streams: dict[str, list[SimRequest]], max_running: int,
                 page_bytes: int, slot_bytes: int, check_every: int = 1,
                 admit_together: bool = False):
        self.mgr, self.max_running, self.admit_together = mgr, max_running, admit_together
        self.page_bytes, self.slot_bytes, self.check_every = page_bytes, slot_bytes, check_every
        self.pending = {s: deque(turns) for s, turns in streams.items()}
        self.waiting: deque[SimRequest] = deque(q.popleft() for q in self.pending.values() if q)
        self.running: list[tuple[object, SimRequest]] = []
        self.next_id = 0
        self.result = SimResult(mgr.page_tokens, mgr.pool.num_pages, mgr.enable_prefix_cache)
        self._util_sum = 0.0

    def run(self, max_steps: int = 1_000_000) -> SimResult:
        while self.waiting or self.running:
            assert self.result.steps < max_steps, "simulation does not converge"
            self._admit()
            self._decode()
            self._util_sum += self._measure()
            self.result.steps += 1
            if self.result.steps % self.check_every == 0:
                self.mgr.check_invariants()
        self.mgr.check_leaks()
        r, st = self.result, self.mgr.stats()
        r.hit_rate = r.cached_prompt_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
        r.copies, r.evictions, r.preemptions = st["copies"], st["evictions"], st["preemptions"]
        r.mean_utilization = self._util_sum / max(1, r.steps)
        return r

    def _admit(self) -> None:
        batch = []
        while self.waiting and len(self.running) + len(batch) < self.max_running:
            req = self.waiting[0]
            self.next_id += 1
            sid, tokens = self.next_id, req.prompt_ids + req.generated
            try:
                seq = self.mgr.admit(sid, tokens, len(req.answer_ids) - len(req.generated))
            except OutOfPages:
                if not self.running and not batch:
                    raise
                break
            self.waiting.popleft()
            batch.append((sid, req, tokens, seq.num_cached_tokens))
            if not self.admit_together:
                self._prefill(*batch.pop())
        requeue = [b for b in batch if not self._prefill(*b)]
        self.waiting.extendleft(req for _, req, _, _ in reversed(requeue))

    def _prefill(self, sid, req: SimRequest, tokens: list[int], cached: int) -> bool:
        try:
            self.mgr.reserve(sid, len(tokens) - cached)
        except OutOfPages:  # only when admitted together: undo, try again next step
            self.mgr.release(sid)
            return False
        if not req.generated:
            self.result.prompt_tokens += len(req.prompt_ids)
            self.result.cached_prompt_tokens += cached
        self.result.computed_prompt_tokens += len(tokens) - cached
        self.mgr.commit(sid, tokens[cached:])
        req.generated.append(req.answer_ids[len(req.generated)])  # from the prefill's logits
        self.running.append((sid, req))
        self._maybe_finish(sid, req)
        return True

    def _decode(self) -> None:
        for sid, req in list(self.running):
            if (sid, req) not in self.running:
                continue  # preempted earlier in this step
            while True:
                try:
                    self.mgr.reserve(sid, 1)
                    break
                except OutOfPages:
                    victim = self.running[-1]
                    self._preempt(*victim)
                    if victim[0] == sid:
                        break
            if (sid, req) not in self.running:
                continue
            self.mgr.commit(sid, [req.generated[-1]])
            req.generated.append(req.answer_ids[len(req.generated)])
            self._maybe_finish(sid, req)

    def _preempt(self, sid, req: SimRequest) -> None:
        self._measure()
        self.mgr.preempt(sid)
        self.running.remove((sid, req))
        self.waiting.appendleft(req)

    def _maybe_finish(self, sid, req: SimRequest) -> None:
        if len(req.generated) < len(req.answer_ids):
            return
        self._measure()  # its pages are still held: part of the peak
        self.mgr.finish(sid)
        self.running.remove((sid, req))
        queue = self.pending[req.stream]
        if queue:
            self.waiting.append(queue.popleft())

    def _measure(self) -> float:
        """Update the peaks with what is held now; returns the pool's utilization."""
        mgr, r = self.mgr, self.result
        pool = mgr.pool
        held = pool.num_live + pool.num_cached
        kv_bytes = held * self.page_bytes + mgr.arena.num_used * self.slot_bytes
        tokens = sum(len(p.tokens) for p in pool.pages if p.state != "free")
        util = tokens / (held * mgr.page_tokens) if held else 0.0
        live_bytes = pool.num_live * self.page_bytes + mgr.arena.num_used * self.slot_bytes
        r.peak_live_kv_bytes = max(r.peak_live_kv_bytes, live_bytes)
        if kv_bytes > r.peak_kv_bytes:
            r.peak_kv_bytes, r.peak_pages, r.utilization_at_peak = kv_bytes, held, util
            r.system_prompt_copies = sum(1 for p in pool.pages if p.state != "free" and p.start == 0)
        r.peak_live_pages = max(r.peak_live_pages, pool.num_live)
        r.peak_inline_slots = max(r.peak_inline_slots, mgr.arena.num_used)
        return util
