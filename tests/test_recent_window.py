"""The recent-key window (kv/recent_window.py): bookkeeping, attention reads, engine runs.

- KVManager hands out windows at admit/fork and takes them back at finish/release/preempt; a fork's
  window is a copy of its parent's; with every window in use a sequence runs without one; a
  prefix-cache hit is cut back to a multiple of the window.
- FlatKVContext (the CPU back end, C or torch attention) and PagedKVContext (the per-segment
  path) read by the position-only rule: a query at position i reads its block [i - i % W, i]
  exact (fp16) and the older keys from int8, in a decode step and in a prefill chunk alike:
  checked against dense attention over exactly those values, query by query.
- An engine whose window covers every position reads no int8 K/V at all: its greedy tokens equal
  an fp16-KV engine's; with a short window the C decode step and the torch layer loop agree, and
  n > 1 children (forked windows) continue exactly like a single sequence.
"""

import pytest
import torch

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.recent_window import RecentWindows, aligned_cached, exact_from, window_offset
from edge_runtime.kv.storage import KVStorage
from edge_runtime.kv.flat_context import FlatKVContext
from edge_runtime.kv.paged_context import PagedKVContext, SeqStep
from edge_runtime.kernels import cpu_native, hadamard
from engine_helpers import engine_for, greedy, tiny, tiny_prompts
from paged_kv_helpers import D, H, HKV, LAYERS, P, SLOT, dense as _dense, int8_read_back
from paged_kv_helpers import fill_history, use_triton_kernels, write as _write

W = 5


# --- bookkeeping ------------------------------------------------------------------------------
def _write_tokens(kv, sid, tokens):
    kv.reserve(sid, len(tokens))
    kv.commit(sid, tokens)


def test_windows_follow_the_sequences():
    kv = KVManager(8, 16, num_windows=2, window_tokens=4)
    a = kv.admit("a", list(range(10)), 4)
    assert a.window is not None and a.window_start == 0
    _write_tokens(kv, "a", list(range(10)))
    b = kv.admit("b", list(range(12)), 4)  # 9 tokens cached in a's page, 8 used (2 windows)
    assert b.window is not None and b.window != a.window
    assert b.window_start == b.num_cached_tokens == 8
    c = kv.admit("c", [5, 6, 7], 4)  # every window in use: it runs without one
    assert c.window is None
    assert kv.stats()["windows_used"] == 2
    kv.check_invariants()
    kv.release("b")
    child = kv.fork("a", "a2")  # takes b's window and copies a's into it
    assert child.window is not None and child.window_start == a.window_start
    op = kv.window_copy("a", "a2")
    assert (op.src_store, op.dst_store, op.num_tokens) == ("window", "window", 4)
    assert (op.src_slot_start, op.dst_slot_start) == (a.window * 4, child.window * 4)
    assert kv.window_copy("c", "a") is None  # c has none
    kv.check_invariants()
    for sid in ("a", "a2", "c"):
        kv.finish(sid)
    kv.check_leaks()
    assert kv.windows.num_used == 0


def test_fork_of_a_windowless_parent_holds_no_window():
    kv = KVManager(8, 16, num_windows=1, window_tokens=4)
    kv.admit("x", [1, 2, 3], 4)  # holds the only window
    kv.admit("p", [4, 5, 6], 4)
    _write_tokens(kv, "p", [4, 5, 6])
    kv.finish("x")
    child = kv.fork("p", "q")  # a window of its own would miss the parent's block
    assert child.window is None and kv.windows.num_used == 0
    assert kv.window_copy("p", "q") is None
    kv.check_invariants()


def test_cache_hits_are_cut_back_to_the_window():
    """Cut to a multiple of W whether the hit ends in an aligned page, a tail chain or mid-page;
    without windows the whole hit is used."""
    for windows, window_tokens, expect in ((2, 4, [0, 4, 16, 20]), (0, 0, [3, 6, 17, 22])):
        kv = KVManager(12, 8, num_windows=windows, window_tokens=window_tokens)
        first = list(range(100, 123))  # 23 tokens: pages of 8, 8 and a partial 7
        kv.admit("a", first, 2)
        _write_tokens(kv, "a", first)
        kv.finish("a")
        got = [kv.admit(f"b{n}", first[:n] + [7, 7], 2).num_cached_tokens
               for n in (3, 6, 17, 22)]
        assert got == expect
        for n in (3, 6, 17, 22):
            kv.release(f"b{n}")
        kv.check_leaks()


def test_window_invariants_catch_a_stolen_window():
    kv = KVManager(8, 16, num_windows=2, window_tokens=4)
    kv.admit("a", [1, 2, 3], 4)
    kv.seqs["a"].window = 1  # not the window the allocator gave it
    with pytest.raises(AssertionError):
        kv.check_invariants()


def test_exact_range():
    assert [exact_from(i, 4) for i in range(9)] == [0, 0, 0, 0, 4, 4, 4, 4, 8]
    assert exact_from(5, 0) == 6  # no window: nothing exact
    assert [window_offset(i, 4) for i in (0, 3, 4, 9)] == [0, 3, 0, 1]
    assert aligned_cached(11, 4) == 8 and aligned_cached(11, 0) == 11
    rw = RecentWindows(3, 0)  # zero-token windows: none at all
    assert rw.num_windows == 0 and rw.allocate("s") is None


# --- attention reads ---------------------------------------------------------------------------
def _fp16(x):
    """What attention reads back from a window: rotated heads in fp16."""
    return hadamard.rotate(hadamard.rotate(x).half().float())


# (prefix pages, prefix_len, tail kind, tail ids, cached tail tokens, new tokens, full pages,
#  window start - prefix_len); W = 5
SPECS = [
    ((3, 5), 13, "pages", (9, 2, 11), 4, 12, (), 2),  # prefill over 3 blocks, 2 carried
    ((), 0, "inline", (1,), 0, 3, (), 0),  # a cold prompt shorter than the window
    ((3, 5), 13, "inline", (0,), 10, 1, (), 2),  # decode: window full and wrapped
    ((7,), 8, "pages", (4, 6), 9, 1, (), 7),  # decode at a block's third position
    ((3, 5), 13, "pages", (12,), 2, 2, (), 2),  # a prefill chunk starting a block
    ((7,), 8, "inline", (3, 4), 28, 1, (10,), 27),  # decode: full page + slots, 2 exact
    ((), 0, "pages", (13, 14), 3, 1, (), 0),  # decode with every position in the window
]


def _run_specs(path: str, monkeypatch):
    if path == "c-attention" and cpu_native.library() is None:
        pytest.skip("no C compiler")
    if path != "c-attention":
        monkeypatch.setattr(cpu_native, "library", lambda: None)
    if path == "per-segment-triton":
        use_triton_kernels(monkeypatch, span_tokens=16, block_n=8)
    tol = dict(atol=2e-2, rtol=2e-2) if path == "per-segment-triton" else dict(atol=2e-5, rtol=1e-4)
    torch.manual_seed(0)
    st = KVStorage(LAYERS, HKV, D, num_pages=16, page_tokens=P, num_inline_slots=6,
                   inline_tokens=SLOT, kv_dtype="int8", num_windows=len(SPECS), window_tokens=W)
    steps = [SeqStep(pages, plen, kind, ids, plen + cached, new, full, i, plen + ws)
             for i, (pages, plen, kind, ids, cached, new, full, ws) in enumerate(SPECS)]
    hist = fill_history(st, steps)
    for (layer, i), (hk, hv) in hist.items():
        step = steps[i]  # the window holds the positions of the step's first block before it
        for pos in range(exact_from(step.start, W), step.start):
            _write(st, "window", layer, hk[pos:pos + 1], hv[pos:pos + 1], [i * W + pos % W])
    context = PagedKVContext if path.startswith("per-segment") else FlatKVContext
    ctx = context(st, steps, sm_scale=D**-0.5)
    total = sum(s.num_new for s in steps)
    for layer in range(LAYERS):
        q, k, v = torch.randn(total, H, D), torch.randn(total, HKV, D), torch.randn(total, HKV, D)
        out = ctx.attend(layer, q, k, v)
        at = 0
        for i, s in enumerate(steps):
            hk, hv = hist[(layer, i)]
            kk, vv = torch.cat([hk, k[at:at + s.num_new]]), torch.cat([hv, v[at:at + s.num_new]])
            for r, pos in enumerate(range(s.start, s.start + s.num_new)):
                lo = exact_from(pos, W)  # int8 before the query's block, fp16 from its start
                rk = torch.cat([int8_read_back(kk[:lo]), _fp16(kk[lo:pos + 1])])
                rv = torch.cat([int8_read_back(vv[:lo]), _fp16(vv[lo:pos + 1])])
                ref = _dense(q[at + r:at + r + 1], rk, rv, pos)
                torch.testing.assert_close(out[at + r:at + r + 1], ref, **tol)
            end = s.start + s.num_new  # and the window now holds the last block's new tokens
            for pos in range(max(s.start, exact_from(end - 1, W)), end):
                row = st.window.k[i, layer, pos % W].float()
                torch.testing.assert_close(row, hadamard.rotate(kk[pos]).half().float())
            at += s.num_new


@pytest.mark.parametrize("path", ["c-attention", "torch-attention", "per-segment",
                                  "per-segment-triton"])
def test_windowed_attention_matches_dense(path, monkeypatch):
    """The CPU flat path (C and torch decode attention) and the per-segment path the GPU runs
    (through the torch reference kernels, and through the Triton kernels in interpret mode) read
    the same positions from the same places."""
    _run_specs(path, monkeypatch)


# --- the engine -------------------------------------------------------------------------------
def _tokens(engine, prompts, **kw):
    return [r.completions[0].token_ids for r in engine.generate(prompts, greedy(12, ignore_eos=True, **kw))]


def test_a_window_covering_everything_reads_like_fp16_kv():
    """Every position is in the window (W > prompt + answer): nothing is read from int8, so the
    greedy tokens are fp16 KV's (the int8 engine without a window differs on these prompts)."""
    prompts = tiny_prompts([40, 25, 61], seed=3)
    fp16 = _tokens(engine_for(tiny(), kv_dtype="fp16"), prompts)
    wide = engine_for(tiny(), kv_dtype="int8", recent_window=128)
    assert _tokens(wide, prompts) == fp16
    assert wide.storage.window is not None and wide.kv.windows.num_used == 0  # all given back


def test_c_decode_step_and_torch_layers_agree_with_windows(monkeypatch):
    """Same tokens, and the same window contents: decoder.c's fp16 window writes land where the
    torch path's do (windows are handed out in the same order, and keep their rows after use)."""
    prompts = tiny_prompts([30, 47], seed=5)
    fused_engine = engine_for(tiny(), kv_dtype="int8", recent_window=4)
    assert fused_engine.model.fused_decoder is not None or cpu_native.library() is None
    fused = _tokens(fused_engine, prompts)
    loop_engine = engine_for(tiny(), kv_dtype="int8", recent_window=4)
    monkeypatch.setattr(loop_engine.model, "fused_decoder", None)  # the model object is shared
    loop = _tokens(loop_engine, prompts)
    assert fused == loop
    for a, b in ((fused_engine.storage.window.k, loop_engine.storage.window.k),
                 (fused_engine.storage.window.v, loop_engine.storage.window.v)):
        assert bool(a.float().abs().sum() > 0)
        torch.testing.assert_close(a.float(), b.float(), atol=2e-3, rtol=2e-3)


def test_forked_children_continue_with_the_parents_window():
    """n = 3 greedy children fork after the prompt and must all continue like n = 1: with a
    missing or wrong window copy they would read other K/V for the prompt's last positions."""
    prompt = tiny_prompts([33], seed=9)
    single = _tokens(engine_for(tiny(), kv_dtype="int8", recent_window=6), prompt)[0]
    eng = engine_for(tiny(), kv_dtype="int8", recent_window=6)
    res = eng.generate(prompt, greedy(12, ignore_eos=True, n=3))[0]
    assert [c.token_ids for c in res.completions] == [single] * 3


def test_per_segment_engine_reads_windows_like_the_flat_path(monkeypatch):
    """The engine with every step on the per-segment path (as on a GPU, through the torch
    reference kernels here) decodes the same greedy tokens as the CPU flat path, with windows."""
    from edge_runtime.engine.backend import CpuBackend

    prompts = tiny_prompts([30, 47, 12], seed=7)
    flat = _tokens(engine_for(tiny(), kv_dtype="int8", recent_window=4), prompts)
    wide_prompts = tiny_prompts([40, 25, 61], seed=3)  # int8 without a window differs from fp16 KV
    fp16 = _tokens(engine_for(tiny(), kv_dtype="fp16"), wide_prompts)
    monkeypatch.setattr(CpuBackend, "context",
                        lambda self, storage, steps, sm_scale: PagedKVContext(storage, steps, sm_scale))
    assert _tokens(engine_for(tiny(), kv_dtype="int8", recent_window=4), prompts) == flat
    assert _tokens(engine_for(tiny(), kv_dtype="int8", recent_window=128), wide_prompts) == fp16


def test_recent_window_setting_is_validated():
    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="recent_window"):
        EngineConfig(recent_window=-1)
    assert EngineConfig(recent_window=0, kv_dtype="int8").recent_window == 0
