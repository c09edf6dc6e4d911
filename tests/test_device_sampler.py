"""The device sampler (engine/device_sampler.py) against the host sampler (engine/sampler.py) on CPU
tensors, the same code path the CUDA back end runs: bit-equal token ids and log-probs for greedy
and seeded rows, over several steps (the random streams stay in lockstep), with top-k/top-p,
repetition, presence and frequency penalties, n > 1 rows sharing a logits row, grammar bitmasks and log-probs; and what
crosses between host and device (engine/step_transfers.py)."""

from concurrent.futures import Future

import pytest
import torch

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.constraints import Constraints
from edge_runtime.engine.device_sampler import DeviceSampler
from edge_runtime.engine.sampler import HostSampler, SampleRows, SamplerRow, make_generator
from edge_runtime.engine.step_transfers import StepTransfers, SyncCounter, device_region

VOCAB = 300
PARAMS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7, seed=1),
    SamplingParams(temperature=1.3, top_k=5, seed=2),
    SamplingParams(temperature=0.9, top_p=0.8, seed=3, logprobs=3),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.5, repetition_penalty=1.3, seed=4),
    SamplingParams(temperature=0.0, repetition_penalty=0.7, logprobs=0),
    SamplingParams(temperature=2e-3, seed=5),  # tiny temperature: near-greedy, no overflow
    SamplingParams(temperature=0.8, presence_penalty=0.5, frequency_penalty=1.5, seed=6),
    SamplingParams(temperature=0.0, frequency_penalty=2.0, repetition_penalty=1.1),
]


def _batch(params, seeds_from=0, source_rows=None, seen=None):
    rows = [SamplerRow(p, make_generator(p.seed if p.seed is not None else seeds_from + i),
                       list(seen[i]) if seen else [1, 2, 3, 7 + i], num_prompt=2)
            for i, p in enumerate(params)]
    return SampleRows(list(source_rows or range(len(params))), rows, [p.logprobs for p in params])


def _masks(num_rows, mask_rows, seed):
    """A grammar result as engine/grammar.py hands it over: (int32 bitmask, the rows it covers)."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(1 << 31), 1 << 31, (len(mask_rows), -(-VOCAB // 32)), generator=g,
                         dtype=torch.int64).to(torch.int32)
    bits[:, 0] |= 1  # token 0 always allowed: no row is fully masked
    fut = Future()
    fut.set_result((bits, list(mask_rows)))
    return fut


def _run_both(params, steps=4, source_rows=None, mask_rows=None, num_logits=None):
    host_batch = _batch(params, source_rows=source_rows)
    dev_batch = _batch(params, source_rows=source_rows)
    transfers = StepTransfers("cpu", pack=True)
    device, host = DeviceSampler(transfers), HostSampler()
    g = torch.Generator().manual_seed(7)
    for step in range(steps):
        logits = torch.randn(num_logits or len(params), VOCAB, generator=g) * 1.5
        masks = None if mask_rows is None else _masks(len(params), mask_rows, step)
        want = host.choose(logits.clone(), host_batch, Constraints, masks)
        with SyncCounter() as counter, device_region():
            got = device.choose(logits.clone(), dev_batch, Constraints, masks)
        assert got == want, (step, got, want)
        assert counter.total_syncs == 0, dict(counter.syncs)
        assert counter.transfers_outside_helper == 0
        for r, tok in zip(host_batch.rows + dev_batch.rows, want[0] * 2):
            r.seen_ids.append(tok)
    return transfers


def test_device_sampler_equals_host_sampler_seeded_and_greedy():
    transfers = _run_both(PARAMS)
    assert transfers.counters["downloads"] == 4  # one per step: ids and log-probs together
    assert transfers.counters["uploads"] == 4


def test_device_sampler_n_children_share_a_logits_row():
    params = [SamplingParams(temperature=0.8, seed=10 + i) for i in range(3)] + [SamplingParams()]
    _run_both(params, source_rows=[0, 0, 0, 1], num_logits=2)


def test_device_sampler_applies_grammar_masks_like_the_host():
    _run_both(PARAMS, mask_rows=[0, 3, 4])
    _run_both(PARAMS[:1] * 2 + PARAMS[3:4], source_rows=[1, 1, 0], mask_rows=[1], num_logits=2)


@pytest.mark.parametrize("seen", [None, [[5, 5, 9]] * 3])
def test_greedy_only_batch_uploads_nothing(seen):
    params = [SamplingParams(), SamplingParams(), SamplingParams(repetition_penalty=1.5)]
    transfers = StepTransfers("cpu", pack=True)
    batch = _batch(params[:2] if seen is None else params, seen=seen)
    logits = torch.randn(len(batch.rows), VOCAB, generator=torch.Generator().manual_seed(3))
    got = DeviceSampler(transfers).choose(logits, batch, Constraints, None)
    assert got[0] == logits_argmax_after_penalty(logits, batch)
    assert transfers.counters["downloads"] == 1
    assert transfers.counters["uploads"] == (0 if seen is None else 1)  # penalised ids only


def logits_argmax_after_penalty(logits, batch):
    out = []
    for row, r in zip(logits, batch.rows):
        row = row.clone()
        p = r.params.repetition_penalty
        for t in set(r.seen_ids) if p != 1.0 else ():
            row[t] = row[t] * p if row[t] < 0 else row[t] / p
        out.append(int(row.argmax()))
    return out
