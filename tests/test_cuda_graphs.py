"""Decode buckets (engine/cuda_graphs.py, kv/decode_shape.py): which bucket a step takes, the
fixed-shape context (padding rows read and write nothing; the real rows' attention is the same
bits as unpadded), that a step padded to its bucket gives the real rows the logits of the
unpadded eager step bit for bit, linears row by row (the CUDA back end on CPU tensors under the
Triton interpreter runs the padded static step eagerly), the fall-back to eager steps, and, on a CUDA device only,
the captured graphs."""

import pytest
import torch

from backend_helpers import engine_on
from model_helpers import random_ids

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.cuda_graphs import bucket_for
from edge_runtime.kv.decode_shape import DecodeShape, DoesNotFit
from edge_runtime.kv.storage import KVStorage
from edge_runtime.kv.paged_context import PagedKVContext, SeqStep
from edge_runtime.kernels.positional_attention_ref import NO_INLINE
from paged_kv_helpers import D, H, HKV, LAYERS
from edge_runtime.errors import ConfigError
from edge_runtime.kernels import dispatch

needs_triton = pytest.mark.skipif(not dispatch.triton_importable(), reason="needs triton (interpreter)")
GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def test_bucket_is_the_smallest_that_holds_the_batch():
    buckets = (8, 1, 2, 4)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, None]


def test_decode_buckets_setting_is_checked():
    assert EngineConfig(decode_buckets=[4, 1, 4]).decode_buckets == (1, 4)
    for bad in ([0], [1.5], "4", [300]):
        with pytest.raises(ConfigError, match="decode_buckets"):
            EngineConfig(decode_buckets=bad)


P, SLOT, W = 16, 8, 4  # page, inline slot and window tokens: up to 2 inline slots a sequence


def _decode_steps():
    """Decode rows of every kind: prefix + inline tail, a full tail page then slots, page tails,
    windowed and not (window None), on a storage with inline slots and recent-key windows."""
    return [SeqStep((3, 5), 20, "inline", (0,), 25, 1, window=1, window_start=24),
            SeqStep((7,), 16, "pages", (4, 6), 40, 1),
            SeqStep((3, 5), 20, "inline", (1, 2), 45, 1, (10,), window=0, window_start=44),
            SeqStep((), 0, "pages", (12, 13), 30, 1, window=2)]


def _storage():
    return KVStorage(LAYERS, HKV, D, num_pages=16, page_tokens=P, num_inline_slots=6,
                     inline_tokens=SLOT, kv_dtype="int8", num_windows=3, window_tokens=W)


def test_padded_context_has_the_shapes_fixed_and_padding_rows_read_and_write_nothing():
    st, steps = _storage(), _decode_steps()
    shape = DecodeShape.for_storage(st, 8, max_positions=100)
    padded, empty = PagedKVContext(st, steps, 1.0, shape), PagedKVContext(st, [], 1.0, shape)
    got, static = padded.metadata(), empty.metadata()
    def layout(parts):
        return {name: (t.dtype, t.shape) for name, t in parts.items()}

    assert layout(got) == layout(static)
    eager = PagedKVContext(st, steps, 1.0)
    idx, n = padded.index, len(steps)
    assert padded.num_tokens == 8 and idx.num_spans == shape.num_spans == empty.index.num_spans
    assert idx.pool_table.shape == (8, shape.pool_pages)
    assert idx.arena_table.shape == (8, shape.arena_slots)
    assert idx.key_end.tolist() == eager.index.key_end.tolist() + [0] * 4
    assert idx.seq_idx.tolist() == list(range(8))
    assert idx.row_bounds[n:].tolist() == [[0, 0, NO_INLINE]] * 4
    assert torch.equal(idx.row_bounds[:n], eager.index.row_bounds)
    for store, slots in padded.slot_mapping.items():
        assert slots.tolist() == eager.slot_mapping[store].tolist() + [-1] * 4, store
    assert padded.window_slots.tolist() == eager.window_slots.tolist() + [-1] * 4
    kv_lens = padded.exact[8]
    assert kv_lens.tolist() == eager.exact[8].tolist() + [0] * 4 and kv_lens[1] == 0  # no window
    assert padded.exact[4] == empty.exact[4] == 8  # one exact block per row
    with pytest.raises(DoesNotFit):
        PagedKVContext(st, steps, 1.0, DecodeShape.for_storage(st, 2, max_positions=100))  # rows
    with pytest.raises(DoesNotFit):
        PagedKVContext(st, [SeqStep((), 0, "pages", (12,), 0, 2)], 1.0, shape)  # a prefill
    with pytest.raises(DoesNotFit):
        PagedKVContext(st, steps, 1.0, DecodeShape.for_storage(st, 8, max_positions=16))  # widths


@needs_triton
def test_padded_context_gives_the_real_rows_the_eager_attention_bits():
    st, steps = _storage(), _decode_steps()
    g = torch.Generator().manual_seed(0)
    for t in (st.pool.k, st.pool.v, st.inline.k, st.inline.v):
        t.copy_(torch.randint(-127, 128, t.shape, generator=g, dtype=torch.int8))
    st.window.k.copy_(torch.randn(st.window.k.shape, generator=g))
    st.window.v.copy_(torch.randn(st.window.v.shape, generator=g))
    q = torch.randn(8, H, D, generator=g)
    k, v = torch.randn(8, HKV, D, generator=g), torch.randn(8, HKV, D, generator=g)
    shape = DecodeShape.for_storage(st, 8, max_positions=100)
    with dispatch.prefer_triton():
        eager = PagedKVContext(st, steps, D ** -0.5).attend(0, q[:4], k[:4], v[:4])
        padded = PagedKVContext(st, steps, D ** -0.5, shape).attend(0, q, k, v)  # same writes
    assert torch.equal(padded[:4], eager)


def _eager_and_padded_logits(engine, prompts):
    """Every decode step run twice on the same engine, eagerly and then padded to its bucket (a
    decode step writes the same K/V to the same slots both times) -> [(eager, padded) logits];
    engine.decode_contexts: the eager steps' contexts."""
    runner = engine.runner
    pairs, graphs, forward, context = [], runner.graphs, runner.forward, engine.backend.context
    engine.decode_contexts = []

    def both(ids, steps, rows):
        if len(ids) != len(steps):  # a prefill: once, eagerly
            return forward(ids, steps, rows)
        engine.runner.graphs = None
        engine.backend.context = lambda *a: engine.decode_contexts.append(context(*a)) or \
            engine.decode_contexts[-1]
        eager = forward(ids, steps, rows).clone()
        engine.runner.graphs, engine.backend.context = graphs, context
        pairs.append((eager, forward(ids, steps, rows).clone()))
        return pairs[-1][1]

    engine.runner.forward = both
    engine.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    return pairs


def _row_by_row(linear):
    """F.linear one row at a time: the CPU's matmul blocks 3 rows and 4 rows differently (the real
    rows' logits moved by 4.6e-5), which is no property of the padding."""
    def rows(x, w, b=None):
        if x.dim() != 2 or x.shape[0] < 2:
            return linear(x, w, b)
        return torch.cat([linear(x[i:i + 1], w, b) for i in range(x.shape[0])])
    return rows


@needs_triton
def test_padded_decode_step_gives_the_real_rows_the_eager_logits(monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "linear", _row_by_row(torch.nn.functional.linear))
    # a cached system prompt (prefix pages), an inline tail and page tails, recent-key windows
    system = random_ids(40, 500, seed=1)
    engine = engine_on("cuda", decode_buckets=(1, 4))
    engine.generate([system + [7]], SamplingParams(max_tokens=1))  # caches the system prompt
    prompts = [system + random_ids(3, 500, seed=2), random_ids(36, 500, seed=3), system[:33]]
    pairs = _eager_and_padded_logits(engine, prompts)
    assert engine.runner.graphs.counters["padded_eager_steps"] == len(pairs) == 1
    (ctx,) = engine.decode_contexts
    assert bool((ctx.index.row_bounds[:, 0] > 0).any()), "no row reads a shared prefix"
    assert bool((ctx.index.row_bounds[:, 2] != NO_INLINE).any()), "no row has an inline tail"
    assert bool((ctx.slot_mapping["pages"] >= 0).any()), "no row writes a tail page"
    assert ctx.exact is not None and bool((ctx.exact[8] > 0).any()), "no row reads its window"
    for want, got in pairs:
        assert got.shape == want.shape == (3, want.shape[1])
        # position-ordered attention: a real row reads what it reads unpadded, by per-token
        # programs, so the padding rows change none of its bits
        assert torch.equal(got, want)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_triton
def test_steps_that_do_not_fit_a_bucket_run_eagerly():
    engine = engine_on("cuda", decode_buckets=(1, 2))
    prompts = [random_ids(3 + i, 500, seed=10 + i) for i in range(3)]
    results = engine.generate(prompts, GREEDY)  # 3 running sequences: larger than every bucket
    counters = engine.runner.graphs.counters
    assert counters["eager_steps"] == 2 and counters["padded_eager_steps"] == 0
    assert all(len(r.completions[0].token_ids) == 3 for r in results)
    # the eager steps are the engine's own path without buckets (tests/test_engine_backends.py)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs are captured on a CUDA device only")
def test_captured_graphs_replay_the_eager_tokens_on_cuda():
    from backend_helpers import tiny_folder
    from edge_runtime.engine.engine import Engine
    from edge_runtime.engine.placement import load_for, resolve

    loaded = load_for(str(tiny_folder()), resolve("cuda", "cuda"), progress=lambda msg: None)
    prompts = [random_ids(9 + i, 500, seed=30 + i) for i in range(3)]
    runs = {}
    for buckets in ((), (1, 2, 4)):
        engine = Engine(loaded, EngineConfig(device="cuda", backend="cuda", page_tokens=64, num_pages=12,
                                             decode_buckets=buckets))
        runs[buckets] = [r.completions[0].token_ids for r in engine.generate(prompts, GREEDY)]
        if buckets:
            stats = engine.stats()["decode_graphs"]
            assert stats["captured"] == [1, 2, 4] and stats["graph_steps"] > 0, stats
            assert stats["capture_s"] > 0
    assert runs[()] == runs[(1, 2, 4)]
