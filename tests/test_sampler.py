"""Sampler: masks vs loop references on random logits, seeded reproducibility, greedy, penalty."""

import itertools

import torch

from edge_runtime.engine import sampler as sampler_module
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.sampler import (SamplerRow, apply_repetition_penalty, make_generator,
                                         sample, top_k_mask, top_p_mask)


def _ref_top_k(row: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= row.numel():
        return row.clone()
    kth = sorted(row.tolist(), reverse=True)[k - 1]
    return torch.tensor([x if x >= kth else float("-inf") for x in row.tolist()])


def _ref_top_p(row: torch.Tensor, p: float) -> torch.Tensor:
    probs = row.softmax(-1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep, total = set(), 0.0
    for i in order:  # most likely first, until the kept mass reaches p
        keep.add(i)
        total += probs[i]
        if total >= p:
            break
    return torch.tensor([x if i in keep else float("-inf") for i, x in enumerate(row.tolist())])


def test_top_k_matches_reference():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    ks = torch.tensor([0, 1, 3, 10, 49, 100])
    got = top_k_mask(logits, ks)
    for i in range(6):
        assert torch.equal(got[i], _ref_top_k(logits[i], int(ks[i])))


def test_top_p_matches_reference():
    torch.manual_seed(1)
    logits = torch.randn(5, 40) * 3
    ps = torch.tensor([1.0, 0.9, 0.5, 0.1, 0.75])
    got = top_p_mask(logits, ps)
    for i in range(5):
        ref = _ref_top_p(logits[i], float(ps[i]))
        assert torch.equal(torch.isinf(got[i]), torch.isinf(ref)), i
        assert int((~torch.isinf(got[i])).sum()) >= 1


def test_repetition_penalty_hf_semantics():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    out = apply_repetition_penalty(logits, [[0, 1, 1]], [2.0])
    assert torch.equal(out, torch.tensor([[1.0, -4.0, 1.0, 0.5]]))


def _rows(params, seeds):
    return [SamplerRow(p, make_generator(s), [1, 2, 3]) for p, s in zip(params, seeds)]


def test_seeded_sampling_is_reproducible_and_batch_independent():
    torch.manual_seed(2)
    logits = torch.randn(1, 100).repeat(3, 1)
    logits[1] = torch.randn(100)
    p = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7)
    a = [sample(logits[:1], _rows([p], [7]))[0] for _ in range(1)]
    rows = _rows([p, p, p], [7, 8, 7])
    seq_batch = [sample(logits, rows) for _ in range(20)]
    rows_alone = _rows([p], [7])
    seq_alone = [sample(logits[:1], rows_alone)[0] for _ in range(20)]
    assert [s[0] for s in seq_batch] == seq_alone
    assert [s[0] for s in seq_batch] == [s[2] for s in seq_batch]
    assert a[0] == seq_alone[0]
    assert len({tuple(s) for s in seq_batch}) > 1  # it really samples


def test_sampling_distribution_follows_probs():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-9]]))
    p = SamplingParams(temperature=1.0, seed=3)
    rows = _rows([p], [3])
    counts = torch.zeros(4)
    for _ in range(2000):
        counts[sample(logits, rows)[0]] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq[:3], torch.tensor([0.5, 0.3, 0.2]), atol=0.05), freq
    assert counts[3] == 0


def test_greedy_rows_take_argmax_and_topk1_is_greedy():
    torch.manual_seed(4)
    logits = torch.randn(4, 30)
    params = [SamplingParams(), SamplingParams(temperature=1.0, top_k=1, seed=1),
              SamplingParams(), SamplingParams(temperature=0.5, top_p=1e-6, seed=2)]
    out = sample(logits, _rows(params, [None, 1, None, 2]))
    assert out == logits.argmax(-1).tolist()


def test_seeds_wrap_modulo_2_64_like_torch():
    """A derived seed (seed + i for the i-th of n samples) past 2**64 - 1 wraps instead of raising
    in torch's uint64 conversion (which used to kill the engine loop thread)."""
    def draws(seed):
        gen = make_generator(seed)
        return [torch.rand((), generator=gen).item() for _ in range(3)]

    assert draws((1 << 64) - 1 + 1) == draws(0)
    assert draws((1 << 64) - 1 + 15) == draws(14)
    assert draws(-1) == draws((1 << 64) - 1)  # torch's own reading of a negative seed


def test_sampling_params_reject_seeds_outside_64_bits():
    import pytest

    from edge_runtime.errors import RequestError

    SamplingParams(seed=(1 << 64) - 1)
    SamplingParams(seed=-(1 << 63))
    for seed in (1 << 64, -(1 << 63) - 1):
        with pytest.raises(RequestError, match="seed"):
            SamplingParams(seed=seed)


def test_sampling_params_bound_top_k_so_the_sampler_cannot_overflow():
    """top_k >= 2**63 passed validation and made the sampler's int64 tensor raise OverflowError,
    which stopped the engine loop for good; the largest k accepted samples like top_k off."""
    import pytest

    from edge_runtime.engine.api import TOP_K_MAX
    from edge_runtime.errors import RequestError

    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(5))
    big = SamplingParams(temperature=1.0, top_k=TOP_K_MAX, seed=9)
    off = SamplingParams(temperature=1.0, top_k=0, seed=9)
    assert sample(logits, _rows([big, big], [9, 10])) == sample(logits, _rows([off, off], [9, 10]))
    for top_k in (TOP_K_MAX + 1, 1 << 63, -1, 2.5, True):
        with pytest.raises(RequestError, match="top_k"):
            SamplingParams(top_k=top_k)


def test_sampling_params_reject_non_finite_temperature_and_penalty():
    import pytest

    from edge_runtime.errors import RequestError

    for value in (float("nan"), float("inf")):
        with pytest.raises(RequestError, match="temperature"):
            SamplingParams(temperature=value)
        with pytest.raises(RequestError, match="repetition_penalty"):
            SamplingParams(repetition_penalty=value)
    with pytest.raises(RequestError, match="n must be an integer"):
        SamplingParams(n=2.5)


def _float32_edges():
    """Every float parameter at the lower and upper edge the API or SamplingParams accepts."""
    from edge_runtime.engine.api import (FLOAT32_MAX, GREEDY_BELOW_TEMPERATURE,
                                         REPETITION_PENALTY_MIN)

    return [dict(temperature=t) for t in (1e-300, GREEDY_BELOW_TEMPERATURE,
                                          GREEDY_BELOW_TEMPERATURE * 1.5, 1e-30, 2.0, FLOAT32_MAX)] \
        + [dict(temperature=1.0, top_p=p) for p in (5e-324, 1e-9, 1.0 - 1e-9, 1.0)] \
        + [dict(temperature=t, repetition_penalty=p) for t in (0.0, 1.0)
           for p in (REPETITION_PENALTY_MIN, 10.0, 1e30)]


def _reference_probs(logits: torch.Tensor, params: SamplingParams, seen: list[int]) -> torch.Tensor:
    """What the sampler should draw from, in float64: penalty -> temperature -> top-p."""
    row = logits.double().clone()
    for i in set(seen):
        p = params.repetition_penalty
        row[i] = row[i] * p if row[i] < 0 else row[i] / p
    if params.temperature == 0:
        return torch.nn.functional.one_hot(row.argmax(), row.numel()).double()
    probs = ((row - row.max()) / params.temperature).softmax(-1)
    order = probs.argsort(descending=True)
    keep = probs[order].cumsum(0) - probs[order] < params.top_p  # the smallest set reaching top_p
    keep[0] = True
    out = torch.zeros_like(probs)
    out[order[keep]] = probs[order[keep]]
    return out / out.sum()


def test_every_float_param_at_its_float32_edges_samples_from_the_right_distribution():
    """temperature 1e-300 became 0 in the sampler's float32 tensor: NaN logits, the same (wrong)
    token every step. Each edge must draw only tokens the float64 reference gives probability,
    and spread its draws like it (a NaN row lands on one index every time)."""
    vocab, draws = 6, 600
    seen = [0, 1]
    for kwargs, scale in itertools.product(_float32_edges(), (1.0, 30.0)):
        logits = torch.tensor([[2.0, -1.5, 0.5, 1.9, -3.0, 0.0]]) * scale
        params = SamplingParams(**kwargs)
        rows = [SamplerRow(params, make_generator(seed), list(seen)) for seed in range(draws)]
        tokens = sample(logits.expand(draws, vocab), rows)
        ref = _reference_probs(logits[0], params, seen)
        counts = torch.bincount(torch.tensor(tokens), minlength=vocab).double() / draws
        assert all(ref[t] > 0 for t in tokens), (kwargs, scale, counts, ref)
        assert (counts - ref).abs().max() < 0.08, (kwargs, scale, counts, ref)


def test_a_temperature_float32_cannot_hold_is_greedy_and_one_past_its_range_is_refused():
    import pytest

    from edge_runtime.engine.api import FLOAT32_MAX, GREEDY_BELOW_TEMPERATURE
    from edge_runtime.errors import RequestError

    for tiny in (1e-300, 5e-324, GREEDY_BELOW_TEMPERATURE / 2):
        assert SamplingParams(temperature=tiny).temperature == 0.0
    assert SamplingParams(temperature=GREEDY_BELOW_TEMPERATURE).temperature > 0
    for bad in (FLOAT32_MAX * 2, 1e300, -1e-300):
        with pytest.raises(RequestError, match="temperature"):
            SamplingParams(temperature=bad)
    with pytest.raises(RequestError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=1e-10)


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    """OpenAI semantics: logit -= presence * (count > 0) + frequency * count, over the generated
    tokens (seen_ids[num_prompt:]), after the repetition penalty."""
    logits = torch.tensor([[3.0, 2.9, 2.0, 1.0]])
    seen = [0, 0, 1, 2, 2, 2]  # prompt: [0, 0]; generated: 1 once, 2 three times
    row = lambda **kw: SamplerRow(SamplingParams(**kw), make_generator(0), seen, num_prompt=2)
    assert sample(logits, [row()]) == [0]
    assert sample(logits, [row(presence_penalty=2.0)]) == [0]  # token 0 is only in the prompt
    terms = sampler_module.count_penalty_terms([row(presence_penalty=0.5, frequency_penalty=1.0)])
    assert [t.tolist() for t in terms] == [[0, 0], [1, 2], [1.5, 3.5]]
    logits = torch.tensor([[1.0, 2.9, 3.0, 1.0]])
    assert sample(logits, [row(frequency_penalty=0.1)]) == [1]  # 3.0 - 0.3 < 2.9 - 0.1
    assert sample(logits, [row(presence_penalty=-2.0)]) == [2]  # a negative one favours them


def test_presence_and_frequency_penalties_are_checked():
    import pytest

    from edge_runtime.errors import RequestError

    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(presence_penalty=True),
                dict(frequency_penalty=0.5, beam_width=2)):
        with pytest.raises(RequestError, match="penalty"):
            SamplingParams(**bad)
