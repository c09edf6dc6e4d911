"""ContiguousKVCache and causal_attention against a naive softmax(QK^T)V written out here, on random
data with GQA, ragged lengths, prefill after a past, and the batched decode path."""

from __future__ import annotations

import math

import pytest
import torch

from edge_runtime.model.contiguous_kv import ContiguousKVCache, causal_attention

H, HKV, D = 6, 2, 8


def naive(q, k, v, num_past):
    # q: [Tq, H, D]; k, v: [Tk, Hkv, D]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / math.sqrt(q.shape[-1])
    q_pos = torch.arange(num_past, num_past + q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double()).float()


def rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("num_past,tq", [(0, 1), (0, 9), (5, 1), (5, 4), (17, 17)])
def test_causal_attention_matches_naive(num_past, tq):
    q = rand(tq, H, D, seed=1)
    k, v = rand(num_past + tq, HKV, D, seed=2), rand(num_past + tq, HKV, D, seed=3)
    torch.testing.assert_close(causal_attention(q, k, v, num_past), naive(q, k, v, num_past),
                               rtol=1e-5, atol=1e-5)


def run_steps(cache, seq_ids, steps, seed):
    """Feed `steps` (list of per-sequence new-token counts) through cache; return outputs."""
    outs = []
    for j, counts in enumerate(steps):
        t = sum(counts)
        q, k, v = rand(t, H, D, seed=seed + 3 * j), rand(t, HKV, D, seed=seed + 3 * j + 1), \
            rand(t, HKV, D, seed=seed + 3 * j + 2)
        ctx = cache.step(seq_ids, counts)
        outs.append((q, k, v, ctx.attend(0, q, k, v)))
        ctx.attend(1, q, k, v)  # layer 1 too, so every layer of the cache stays in step
    return outs


def test_batch_steps_equal_per_sequence_naive():
    cache = ContiguousKVCache(2, HKV, D)
    for s in "abc":
        cache.add(s)
    steps = [[5, 1, 12], [1, 1, 1], [3, 1, 2], [1, 1, 1]]  # prefill, decode, mixed, decode
    outs = run_steps(cache, list("abc"), steps, seed=10)
    keys = {s: [] for s in "abc"}
    vals = {s: [] for s in "abc"}
    for counts, (q, k, v, out) in zip(steps, outs):
        start = 0
        for s, n in zip("abc", counts):
            past = sum(t.shape[0] for t in keys[s])
            keys[s].append(k[start:start + n])
            vals[s].append(v[start:start + n])
            ref = naive(q[start:start + n], torch.cat(keys[s]), torch.cat(vals[s]), past)
            torch.testing.assert_close(out[start:start + n], ref, rtol=1e-5, atol=1e-5)
            start += n
    assert [cache.length(s) for s in "abc"] == [10, 4, 16]
    assert cache.positions(["b", "a"], [2, 1]).tolist() == [4, 5, 10]


def test_cache_grows_and_removes():
    cache = ContiguousKVCache(2, HKV, D)
    cache.add("x", capacity=2)
    run_steps(cache, ["x"], [[40], [1]], seed=3)
    assert cache.length("x") == 41 and "x" in cache
    cache.remove("x")
    assert "x" not in cache
