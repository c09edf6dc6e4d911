"""Hypothesis state machine over KVManager: random admit/prefill/decode/fork/finish/cancel/preempt/
resume/evict/retire/restore on tiny pools, every invariant checked after every step.

Besides `check_invariants`, the machine keeps a model of the K/V tensors (`store`: flat slot ->
token whose K/V is there), applies every CopyOp the manager returns and writes committed tokens
where `slot_of` says. After every step, every position of every running sequence must read back its
own token: this is what attention would see, so a wrong copy, a missed copy-on-write or a page
reused while still referenced fails here. A failed allocation must leave the state unchanged.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition,
                                 rule, run_state_machine_as_test)

from edge_runtime.kv.manager import KVManager
from edge_runtime.errors import OutOfPages

STEPS = {"n": 0}
COVER = {"pages_to_slots": 0, "inline_to_pages": 0, "take_overs": 0}  # paths the run must reach
BASES = [[7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 1, 3], [7, 3, 9, 1, 5], [2, 2, 2, 2, 2, 2, 2, 2, 2]]


def snapshot(mgr: KVManager):
    pages = [(p.state, p.ref_count, p.owner, tuple(p.tokens), p.start, p.parent,
              tuple(sorted(p.children)), p.indexed) for p in mgr.pool.pages]
    seqs = {k: (tuple(s.prefix_pages), s.prefix_len, s.tail_kind, tuple(s.tail_pages),
                tuple(s.inline_slots), tuple(s.token_ids), s.capacity) for k, s in mgr.seqs.items()}
    arena = (tuple(mgr.arena.ref_count), tuple(mgr.arena.owner), tuple(mgr.arena.num_tokens),
             tuple(mgr.arena.free_queue))
    return pages, seqs, arena, tuple(mgr.pool.free_queue), tuple(mgr.pool.lru_ids())


class KVMachine(RuleBasedStateMachine):
    @initialize(page_tokens=st.sampled_from([1, 2, 4, 8]), num_pages=st.integers(3, 16),
                slots=st.integers(0, 6), cache=st.sampled_from([True, True, False]),
                slots_per_page=st.sampled_from([1, 2, 4]))
    def setup(self, page_tokens, num_pages, slots, cache, slots_per_page):
        # a slot as large as a page: short requests use it often; smaller: page tails continue
        # in slots (kv/tail_allocator.py) and inline ends spill into pages
        inline = max(1, page_tokens // slots_per_page)
        self.mgr = KVManager(num_pages, page_tokens, slots, inline, enable_prefix_cache=cache,
                             enable_inline=slots > 0)
        self.store: dict[tuple[str, int], int] = {}
        self.pending: dict[int, list[int]] = {}  # seq -> prompt tokens not yet prefilled
        self.preempted: list[list[int]] = []
        self.histories: list[list[int]] = []  # finished sequences: the next turn extends one
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _apply(self, copies) -> None:
        for op in copies:
            vals = [self.store.get((op.src_store, op.src_slot_start + i)) for i in range(op.num_tokens)]
            for i, v in enumerate(vals):
                self.store[(op.dst_store, op.dst_slot_start + i)] = v

    def _try(self, fn, *args):
        before = snapshot(self.mgr)
        try:
            return fn(*args)
        except OutOfPages:
            assert snapshot(self.mgr) == before, "a failed allocation changed the state"
            return None

    def _write(self, sid: int, tokens: list[int]) -> bool:
        seq, P = self.mgr.seqs[sid], self.mgr.page_tokens
        owned = [pid * P for pid in seq.tail_pages if self.mgr.pool.pages[pid].owner == sid]
        copies = self._try(self.mgr.reserve, sid, len(tokens))
        if copies is None:
            return False
        # a sequence never copies a page it owns (it appends in place)
        assert not [op for op in copies if op.src_store == "pages" and op.src_slot_start in owned]
        self._apply(copies)
        start = self.mgr.seqs[sid].num_tokens
        for i, tok in enumerate(tokens):
            self.store[self.mgr.slot_of(sid, start + i)] = tok
        self.mgr.commit(sid, tokens)
        return True

    def _admit(self, prompt: list[int], max_new: int) -> None:
        sid = self._new_id()
        seq = self._try(self.mgr.admit, sid, prompt, max_new)
        if seq is not None:
            assert seq.token_ids == prompt[:seq.num_cached_tokens] and seq.num_cached_tokens < len(prompt)
            self.pending[sid] = prompt[seq.num_cached_tokens:]
        return sid if seq is not None else None

    @precondition(lambda self: len(self.pending) < 4)
    @rule(base=st.sampled_from(BASES), cut=st.integers(1, 12),
          suffix=st.lists(st.integers(0, 9), max_size=6), max_new=st.integers(1, 6))
    def admit(self, base, cut, suffix, max_new):
        self._admit(base[:cut] + suffix or [1], max_new)

    @precondition(lambda self: len(self.pending) < 4)
    @rule(base=st.sampled_from(BASES), cut=st.integers(1, 12), extra=st.integers(0, 9))
    def admit_short(self, base, cut, extra):
        # mostly cached, one new token, one to generate: the inline path, prefilled at once
        sid = self._admit(base[:cut] + [extra], 1)
        if sid is not None and self._write(sid, self.pending[sid]):
            self.pending[sid] = []

    @precondition(lambda self: self.histories and len(self.pending) < 4)
    @rule(data=st.data(), suffix=st.lists(st.integers(0, 9), min_size=1, max_size=4))
    def next_turn(self, data, suffix):
        history = self.histories.pop(data.draw(st.integers(0, len(self.histories) - 1)))
        self._admit(history + suffix, 3)

    @precondition(lambda self: self.preempted)
    @rule(data=st.data())
    def resume(self, data):
        self._admit(self.preempted.pop(data.draw(st.integers(0, len(self.preempted) - 1))), 4)

    @precondition(lambda self: any(self.pending.values()))
    @rule(data=st.data())
    def prefill(self, data):
        sid = data.draw(st.sampled_from(sorted(k for k, v in self.pending.items() if v)))
        n = data.draw(st.integers(1, len(self.pending[sid])))
        if self._write(sid, self.pending[sid][:n]):
            self.pending[sid] = self.pending[sid][n:]

    def _running(self):
        return sorted(k for k, v in self.pending.items() if not v)

    @precondition(lambda self: any(not v for v in self.pending.values()))
    @rule(data=st.data(), tok=st.integers(0, 9), n=st.integers(1, 3))
    def decode(self, data, tok, n):
        self._write(data.draw(st.sampled_from(self._running())), [tok] * n)

    @precondition(lambda self: any(not v for v in self.pending.values()) and len(self.pending) < 5)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self._running()))
        child = self._new_id()
        self.mgr.fork(parent, child)
        self.pending[child] = []

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), how=st.sampled_from(["finish", "release", "preempt"]))
    def end(self, data, how):
        sid = data.draw(st.sampled_from(sorted(self.pending)))
        tokens = list(self.mgr.seqs[sid].token_ids) + self.pending.pop(sid)
        if how == "finish":
            self._apply(self.mgr.finish(sid))
            self.histories.append(tokens)
        elif how == "release":
            self.mgr.release(sid)
        else:
            self.mgr.preempt(sid)
            self.preempted.append(tokens)

    @rule(k=st.integers(0, 3))
    def evict(self, k):
        self.mgr.evict(k)

    @rule(start=st.integers(0, 15), length=st.integers(1, 4))
    def retire(self, start, length):
        n = self.mgr.pool.num_pages
        start = min(start, n - 1)
        copies = self._try(self.mgr.retire_pages, start, min(n, start + length))
        if copies is not None:
            self._apply(copies)
            for i in range(start, min(n, start + length)):
                assert self.mgr.pool.pages[i].state == "retired"
                # the memory is handed back: whatever was there is gone
                for j in range(self.mgr.page_tokens):
                    self.store.pop(("pages", i * self.mgr.page_tokens + j), None)

    @precondition(lambda self: self.mgr.pool.num_retired)
    @rule()
    def restore(self):
        self.mgr.restore_pages(0, self.mgr.pool.num_pages)

    @invariant()
    def consistent(self):
        if not hasattr(self, "mgr"):
            return
        STEPS["n"] += 1
        self.mgr.check_invariants()
        for sid, seq in self.mgr.seqs.items():
            for pos, tok in enumerate(seq.token_ids):
                assert self.store.get(self.mgr.slot_of(sid, pos)) == tok, (sid, pos, self.mgr.dump())
        # every cached page holds what its tokens say (a later hit will read it)
        for page in self.mgr.pool.pages:
            if page.state != "free":
                for i, tok in enumerate(page.tokens):
                    assert self.store.get(("pages", page.page_id * self.mgr.page_tokens + i)) == tok

    def teardown(self):
        if not hasattr(self, "mgr"):
            return
        for name in COVER:
            COVER[name] += getattr(self.mgr.counters, name)
        for sid in list(self.pending):
            self.mgr.release(sid)
        self.mgr.check_leaks()


def test_kv_manager_state_machine_10k_steps():
    STEPS["n"] = 0
    COVER.update(dict.fromkeys(COVER, 0))
    run_state_machine_as_test(KVMachine, settings=settings(
        max_examples=185, stateful_step_count=80, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    assert STEPS["n"] >= 10_000, f"only {STEPS['n']} steps ran"
    assert all(COVER.values()), f"a tail path was never reached: {COVER}"
