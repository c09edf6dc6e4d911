"""Decode buckets (engine/cuda_graphs.py): which bucket a step takes, that a step padded to its
bucket gives the real rows the logits of the unpadded eager step (the CUDA back end on CPU tensors
under the Triton interpreter runs the padded static step eagerly), the fall-back to eager steps,
and, on a CUDA device only, the captured graphs."""

import pytest
import torch

from backend_helpers import engine_on
from model_helpers import random_ids

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.cuda_graphs import NotFit, bucket_for, padded_parts
from edge_runtime.engine.paged_kv import _Call
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


class _Ctx:
    def __init__(self, calls, fresh=None):
        self.calls, self.fresh = calls, fresh
        self.slot_mapping = {"pages": torch.tensor([70, 9], dtype=torch.long)}
        self.window_slots = None


def _call(kind, width, lens):
    return _Call("pages", torch.arange(2 * width, dtype=torch.int32).view(2, width),
                 torch.arange(2, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32), kind)


def test_padded_parts_put_padding_rows_at_kv_len_zero_and_slot_minus_one():
    layout = {"prefix": 3, "tail_pages": 3}
    inputs = {"ids": torch.tensor([11, 12]), "positions": torch.tensor([70, 9])}
    parts = padded_parts(_Ctx([_call("tail_pages", 2, [71, 10])]), inputs, 4, layout)
    assert parts["ids"].tolist() == [11, 12, 0, 0] and parts["positions"].tolist() == [70, 9, 0, 0]
    assert parts["tail_pages.kv_lens"].tolist() == [71, 10, 0, 0]
    assert parts["tail_pages.block_table"].tolist() == [[0, 1, 0], [2, 3, 0], [0, 0, 0], [0, 0, 0]]
    assert parts["prefix.kv_lens"].tolist() == [0, 0, 0, 0]  # a kind the step does not use
    assert parts["slots.pages"].tolist() == [70, 9, -1, -1]
    assert parts["last_rows"].tolist() == [0, 1, 2, 3]
    for ctx in (_Ctx([_call("tail_pages", 4, [1, 1])]),  # wider than the layout
                _Ctx([_call("fresh", 1, [1, 1])], fresh=()),  # a prefill call
                _Ctx([_call("tail_inline", 1, [1, 1])])):  # a kind the layout lacks
        with pytest.raises(NotFit):
            padded_parts(ctx, inputs, 4, layout)
    with pytest.raises(NotFit):
        padded_parts(_Ctx([]), inputs, 1, layout)  # more rows than the bucket


def _eager_and_padded_logits(engine, prompts):
    """Every decode step run twice on the same engine, eagerly and then padded to its bucket (a
    decode step writes the same K/V to the same slots both times) -> [(eager, padded) logits]."""
    pairs, graphs, forward, context = [], engine.graphs, engine._forward, engine.backend.context
    engine.kinds = set()

    def recorded_context(*args):
        ctx = context(*args)
        engine.kinds |= {c.kind for c in ctx.calls}
        return ctx

    def both(ids, steps, rows):
        if len(ids) != len(steps):  # a prefill: once, eagerly
            return forward(ids, steps, rows)
        engine.graphs = None
        eager = forward(ids, steps, rows).clone()
        engine.graphs = graphs
        pairs.append((eager, forward(ids, steps, rows).clone()))
        return pairs[-1][1]

    engine._forward = both
    engine.backend.context = recorded_context
    engine.generate(prompts, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    return pairs


@needs_triton
def test_padded_decode_step_gives_the_real_rows_the_eager_logits():
    # a cached system prompt (prefix pages), an inline tail and page tails, recent-key windows
    system = random_ids(40, 500, seed=1)
    engine = engine_on("cuda", decode_buckets=(1, 4))
    engine.generate([system + [7]], SamplingParams(max_tokens=1))  # caches the system prompt
    prompts = [system + random_ids(3, 500, seed=2), random_ids(36, 500, seed=3), system[:33]]
    pairs = _eager_and_padded_logits(engine, prompts)
    assert engine.graphs.counters["padded_eager_steps"] == len(pairs) == 1
    assert engine.kinds >= {"window", "prefix", "tail_pages", "tail_inline"}, engine.kinds
    for want, got in pairs:
        assert got.shape == want.shape == (3, want.shape[1])
        # the padded step has every call kind at fixed table widths: the kernels may split the
        # keys differently, so the sums agree to rounding, and the greedy tokens exactly
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_triton
def test_steps_that_do_not_fit_a_bucket_run_eagerly():
    engine = engine_on("cuda", decode_buckets=(1, 2))
    prompts = [random_ids(3 + i, 500, seed=10 + i) for i in range(3)]
    results = engine.generate(prompts, GREEDY)  # 3 running sequences: larger than every bucket
    assert engine.graphs.counters["eager_steps"] == 2 and engine.graphs.counters["padded_eager_steps"] == 0
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
