"""The step runner (engine/step_runner.py) on the CPU back end of a tiny random Llama: its forward
over a sequence's chunk gives the logits its every-position scoring gives for the same positions,
the rows it picks are those rows, greedy sampling takes each row's argmax, and beam search's
candidates are the top of log_softmax + the beams' scores."""

import torch

from engine_helpers import engine_for, tiny, tiny_prompts

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.sampler import SampleRows, SamplerRow, make_generator
from edge_runtime.kv.paged_context import SeqStep


def _admitted(engine, seq_id, ids):
    """A sequence admitted and reserved for all of `ids` (nothing cached) -> its SeqStep."""
    kv = engine.kv
    plan = kv.admit(seq_id, ids, 1)
    assert plan.num_cached_tokens == 0, plan.num_cached_tokens
    for op in kv.reserve(seq_id, len(ids)):
        engine.storage.copy(op)
    return SeqStep.from_segments(kv.segments(seq_id), 0, len(ids))


def test_forward_rows_are_the_every_position_logits_of_those_rows():
    engine = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16,
                        enable_prefix_cache=False)
    ids = tiny_prompts([23], seed=3)[0]
    with engine.lock:
        step = _admitted(engine, "a", ids)
        every = engine.runner.every_position_logits(ids, step)  # [23, vocab]
        rows = [4, 11, 22]
        picked = engine.runner.forward(ids, [step], rows).float().cpu()  # writes the same K/V again
        engine.kv.release("a")
    assert every.shape == (len(ids), engine.model_config.vocab_size)
    assert torch.allclose(picked, every[rows], atol=1e-5), (picked - every[rows]).abs().max()
    assert not torch.equal(every[4], every[11])  # random data: the rows differ


def test_greedy_sampling_takes_each_rows_argmax():
    engine = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=8)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, engine.model_config.vocab_size, generator=gen)
    params = SamplingParams(max_tokens=4)
    rows = SampleRows([2, 0, 2], [SamplerRow(params, make_generator(1), [7, 8], 2)
                                  for _ in range(3)], [None, None, None])
    tokens, _ = engine.runner.sample(logits, rows, engine.constraints)
    assert list(tokens) == [int(logits[2].argmax()), int(logits[0].argmax()), int(logits[2].argmax())]


def test_beam_candidates_are_the_top_of_log_softmax_plus_scores():
    engine = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=8)
    gen = torch.Generator().manual_seed(9)
    rows = [torch.randn(50, generator=gen) for _ in range(3)]
    scores = [0.0, -1.5, -0.25]
    values, flat = engine.runner.top_candidates(rows, scores, keep=6)
    acc = (torch.log_softmax(torch.stack(rows), dim=-1) + torch.tensor(scores)[:, None]).reshape(-1)
    want_values, want_flat = torch.topk(acc, 6)
    assert torch.equal(flat, want_flat)
    assert torch.allclose(values, want_values)
