"""Layer groups in the KV bookkeeping (kv/layer_groups.py, kv/page_pool.py, kv/manager.py).

The state machine of tests/test_kv_manager_stateful.py on a pool of slices (a page = global
slices + local slices), with a content model per slice: a "pages" CopyOp runs for every group's
slice of the page (the group map), and each committed token is written to every group's slice.
After every step, besides every invariant: a running sequence reads back every position from its
global slices and every position its next query reads (its window) from its local slices; before
each write, the positions the first new token reads are there in every local slice. So a local
part dropped too early, a prefix hit without its window, or a copy that missed a group fails here.

White-box scenarios check the release itself: a long sequence holds at most ceil(W / P) + 1
local parts, the dropped ones are cached and evicted before global pages, and a prefix hit is cut
to where its window's local parts are still there.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import initialize, invariant, rule, run_state_machine_as_test
from test_kv_manager_stateful import KVMachine

from edge_runtime.kv.layer_groups import LayerGroups
from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.page_math import ceil_div

STEPS = {"n": 0, "released": 0, "local_evictions": 0}


class GroupedKVMachine(KVMachine):
    @initialize(page_tokens=st.sampled_from([1, 2, 4]), pages=st.integers(3, 10),
                slots=st.integers(0, 4), cache=st.sampled_from([True, True, False]),
                slots_per_page=st.sampled_from([1, 2]), global_slices=st.integers(1, 2),
                local_slices=st.integers(1, 3), window=st.integers(1, 9))
    def setup(self, page_tokens, pages, slots, cache, slots_per_page, global_slices,
              local_slices, window):
        inline = max(1, page_tokens // slots_per_page)
        n = global_slices + local_slices
        self.mgr = KVManager(pages * n, page_tokens, slots, inline, enable_prefix_cache=cache,
                             enable_inline=slots > 0, global_slices=global_slices,
                             local_slices=local_slices, local_window=window)
        self.store = {}
        self.pending, self.preempted, self.histories, self.next_id = {}, [], [], 0

    # -- the content model: one entry per (slice, offset) of the pool ---------------------------
    def _addrs(self, store: str, flat: int) -> list:
        pool, P = self.mgr.pool, self.mgr.page_tokens
        if store == "slices":
            return [("pool", flat)]
        if store == "pages":
            return [("pool", pool.group_map[g][flat // P] * P + flat % P)
                    for g in range(pool.page_slices)]
        return [(store, g, flat) for g in range(pool.page_slices)]

    def _apply(self, copies) -> None:
        for op in copies:
            for i in range(op.num_tokens):
                src = self._addrs(op.src_store, op.src_slot_start + i)
                dst = self._addrs(op.dst_store, op.dst_slot_start + i)
                if len(src) != len(dst):  # a slice (one group) with no inline counterpart
                    raise AssertionError(f"slices copied to another store: {op}")
                for s, d in zip(src, dst):
                    self.store[d] = self.store.get(s)

    def _read(self, sid, pos: int, groups) -> list:
        store, flat = self.mgr.slot_of(sid, pos)
        addrs = self._addrs(store, flat)
        return [self.store.get(addrs[g]) for g in groups]

    def _write(self, sid: int, tokens: list[int]) -> bool:
        seq = self.mgr.seqs[sid]
        copies = self._try(self.mgr.reserve, sid, len(tokens))
        if copies is None:
            return False
        self._apply(copies)
        start, W = seq.num_tokens, self.mgr.local_window
        local = range(self.mgr.pool.global_slices, self.mgr.pool.page_slices)
        for pos in range(max(0, start - W + 1), start):  # what the first new token reads
            assert self._read(sid, pos, local) == [seq.token_ids[pos]] * len(local), \
                (sid, pos, self.mgr.dump())
        for i, tok in enumerate(tokens):
            for addr in self._addrs(*self.mgr.slot_of(sid, start + i)):
                self.store[addr] = tok
        self.mgr.commit(sid, tokens)
        return True

    @rule(start=st.integers(0, 40), length=st.integers(1, 6))
    def retire(self, start, length):  # the pool's ids are slices
        n, P = self.mgr.pool.num_pages, self.mgr.page_tokens
        start = min(start, n - 1)
        copies = self._try(self.mgr.retire_pages, start, min(n, start + length))
        if copies is not None:
            self._apply(copies)
            for i in range(start, min(n, start + length)):
                assert self.mgr.pool.pages[i].state == "retired"
                for j in range(P):
                    self.store.pop(("pool", i * P + j), None)

    @invariant()
    def consistent(self):
        if not hasattr(self, "mgr"):
            return
        STEPS["n"] += 1
        mgr, P = self.mgr, self.mgr.page_tokens
        mgr.check_invariants()
        gs, n = mgr.pool.global_slices, mgr.pool.page_slices
        for sid, seq in mgr.seqs.items():
            L = seq.num_tokens
            for pos, tok in enumerate(seq.token_ids):
                groups = range(n) if pos > L - mgr.local_window else range(gs)
                assert self._read(sid, pos, groups) == [tok] * len(groups), (sid, pos, mgr.dump())
        for page in mgr.pool.pages:  # every cached or live page holds its tokens
            if page.state in ("free", "retired") or page.head is not None:
                continue
            ids = [page.page_id] + page.companions
            for i, tok in enumerate(page.tokens):
                assert [self.store.get(("pool", s * P + i)) for s in ids] == [tok] * len(ids), page

    def teardown(self):
        if hasattr(self, "mgr"):
            STEPS["released"] += self.mgr.counters.local_pages_released
        super().teardown()


def test_grouped_kv_manager_state_machine():
    STEPS.update(dict.fromkeys(STEPS, 0))
    run_state_machine_as_test(GroupedKVMachine, settings=settings(
        max_examples=120, stateful_step_count=80, deadline=None, derandomize=True,
        suppress_health_check=list(HealthCheck)))
    assert STEPS["n"] >= 5_000, f"only {STEPS['n']} steps ran"
    assert STEPS["released"] > 0, "no local part was ever released"


def _manager(window: int, local_slices: int = 2, pages: int = 40) -> KVManager:
    return KVManager(pages * (1 + local_slices), 4, global_slices=1, local_slices=local_slices,
                     local_window=window)


def _local_held(mgr: KVManager, seq_id) -> int:
    seq = mgr.seqs[seq_id]
    return len(seq.all_pages()) - seq.local_from


def test_a_long_sequence_holds_its_window_of_local_pages():
    """4-token pages, window 6: decoding 60 tokens, a sequence holds the local part of at most
    ceil(6 / 4) + 1 = 3 pages (2 live local slices each), every global page, and the dropped
    local parts are cached at the LRU's head: evicted before any global page."""
    mgr, W, P = _manager(6), 6, 4
    mgr.admit("a", [1, 2], 60)
    mgr.reserve("a", 2)
    mgr.commit("a", [1, 2])
    most = 0
    for t in range(60):
        mgr.reserve("a", 1)
        mgr.commit("a", [3 + t])
        mgr.check_invariants()
        most = max(most, _local_held(mgr, "a"))
        live_local = sum(1 for pg in mgr.pool.pages if pg.local and pg.state == "live")
        assert live_local == 2 * _local_held(mgr, "a")
    assert most == ceil_div(W, P) + 1
    seq = mgr.seqs["a"]
    assert len(seq.all_pages()) == 16 and seq.local_from == 14
    assert mgr.counters.local_pages_released == 14
    assert mgr.pool.num_cached == 14 * 2  # the dropped local parts, indexed: cached
    assert mgr.pool.lru.front().local
    mgr.evict(14)  # every dropped local part goes before a global page
    assert mgr.pool.num_cached == 0 and mgr.pool.num_free == (40 - 16) * 3 + 14 * 2
    mgr.finish("a")
    mgr.check_leaks()


def test_a_prefix_hit_after_release_is_cut_to_where_its_window_is_there():
    """A 41-token history, window 6, 4-token pages. Its local parts behind the window were
    dropped (cached). With them all there the next turn hits all 41 tokens; with the local part
    of positions [36, 40) and of [0, 16) evicted it hits 36 (the window of position 36 reads
    [31, 36): pages 7 and 8, still there); with page 7's gone too, 28, and so on."""
    mgr = _manager(6, local_slices=1)
    history = list(range(1, 42))
    mgr.admit("a", history, 1)
    mgr.reserve("a", 40)
    mgr.commit("a", history[:40])
    mgr.reserve("a", 1)
    mgr.commit("a", history[40:])
    pages = list(mgr.seqs["a"].all_pages())
    assert mgr.seqs["a"].local_from == 8  # pages 0-7 end at or before 40 - 6 + 1
    mgr.finish("a")
    assert mgr.admit("b", history + [99], 4).num_cached_tokens == 41
    mgr.release("b")
    for i in (0, 1, 2, 3, 9):
        mgr.pool.evict_local(mgr.pool.pages[pages[i]])
    mgr.check_invariants()
    b = mgr.admit("b", history + [99], 4)
    assert b.num_cached_tokens == 36 and b.local_from == 7
    mgr.check_invariants()
    mgr.release("b")
    mgr.pool.evict_local(mgr.pool.pages[pages[7]])
    assert mgr.admit("c", history + [99], 4).num_cached_tokens == 28  # [23, 28): pages 5, 6
    mgr.release("c")
    mgr.check_leaks()


def test_layer_groups_of_gemma3_shapes():
    """Gemma 3 270M: 18 layers, every sixth global: G = 3, one global and five local groups;
    a model with one kind of layer, or two windows, has none."""
    windows = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
    groups = LayerGroups.of(windows)
    assert groups.layers[0] == (5, 11, 17) and groups.num_global_groups == 1
    assert groups.num_groups == 6 and groups.layers_per_group == 3 and groups.window == 512
    assert groups.slot_of(11) == (0, 1) and groups.slot_of(0) == (1, 0) and groups.slot_of(16) == (5, 2)
    one_b = [None if (i + 1) % 6 == 0 else 512 for i in range(26)]  # 4 global, 22 local: G = 2
    assert (LayerGroups.of(one_b).num_global_groups, LayerGroups.of(one_b).num_groups) == (2, 13)
    assert LayerGroups.of([None] * 4) is None and LayerGroups.of([8] * 4) is None
    assert LayerGroups.of([None, 8, 16, None]) is None
