"""Determinism by construction: a greedy request's tokens are a function of the request alone.

The same three requests (two sharing a 45-token system prompt) are served cold and alone, then
from the prefix cache, after another request cached their system prompt, sharing it in one step,
prefilled in chunks of 8 and 13 tokens, batched with unrelated requests (admitted together, and
arriving while those decode), after a preemption on a small pool, and as both children of n=2.
Every way gives the tokens of the cold run, with int8 KV (the recent-key window's read rule,
cache/recent_windows.py), fp16 and fp32 KV, on the CPU flat path and on the per-segment path a
GPU runs (torch reference kernels here; the Triton kernels under the interpreter on a shorter
case). On the CPU flat path with int8 or fp16 KV (the C attention and the one-call C layer
stack for every step) the logits of every position are also the same bit for bit.
"""

import pytest
import torch

from edge_runtime.engine import sampler as sampler_module
from edge_runtime.engine.paged_kv import PagedKVContext
from edge_runtime.kernels import cpu_native
from engine_helpers import engine_for, greedy, tiny, tiny_prompts

SYSTEM = tiny_prompts([45], seed=77)[0]
TARGETS = [SYSTEM + t for t in tiny_prompts([9, 22], seed=78)] + tiny_prompts([37], seed=79)
OTHERS = tiny_prompts([30, 60], seed=80)
TOKENS = 10


class LogitsByContext:
    """Records the logits row sampled for every context (prompt + tokens so far), per run."""

    def __init__(self, monkeypatch):
        self.runs: dict[str, dict[tuple, torch.Tensor]] = {}
        self.name = None
        real = sampler_module.sample

        def sample(logits, rows):
            for i, row in enumerate(rows):
                self.runs.setdefault(self.name, {})[tuple(row.seen_ids)] = logits[i].clone()
            return real(logits, rows)

        monkeypatch.setattr(sampler_module, "sample", sample)  # HostSampler's


def _tokens(results) -> list[list[int]]:
    return [r.completions[0].token_ids for r in results]


def _staggered(eng, params) -> list[list[int]]:
    """OTHERS start; TARGETS arrive after three steps, while OTHERS decode."""
    for p in OTHERS:
        eng.add_request(p, params)
    for _ in range(3):
        eng.step()
    ids = [eng.add_request(p, params) for p in TARGETS]
    done = {}
    while eng.has_unfinished():
        done.update({e.request_id: e.result for e in eng.step() if e.result is not None})
    return [done[i].token_ids for i in ids]


def _preempted(eng, params) -> list[list[int]]:
    """TARGETS, the newest preempted after its prefill and again mid-answer (it resumes from what
    the prefix cache still holds of its pages)."""
    ids = [eng.add_request(p, params) for p in TARGETS]
    done = {}
    for step in range(40):
        if step in (1, 5):
            assert eng.preempt_newest(1) == 1
        done.update({e.request_id: e.result for e in eng.step() if e.result is not None})
    assert not eng.has_unfinished() and eng.stats()["preemptions"] == 2
    return [done[i].token_ids for i in ids]


def _runs(kv_dtype: str, rec: LogitsByContext) -> dict[str, list[list[int]]]:
    base = dict(kv_dtype=kv_dtype, page_tokens=16, num_pages=64)
    params = greedy(TOKENS, ignore_eos=True)
    out = {}

    def run(name, prompts, n=1, **cfg):
        rec.name = name
        eng = engine_for(tiny(), **{**base, **cfg})
        return eng, eng.generate(prompts, greedy(TOKENS, ignore_eos=True, n=n))

    out["cold"] = [_tokens(run("cold", [t])[1])[0] for t in TARGETS]
    eng, _ = run("first", TARGETS)
    rec.name = "cached"
    out["cached"] = _tokens(eng.generate(TARGETS, params))
    assert all(r.cached_prompt_tokens > 0 for r in eng.generate(TARGETS, params))
    eng, _ = run("first", [SYSTEM + [5, 6, 7]])
    rec.name = "other_prefix"
    out["other_prefix"] = _tokens(eng.generate(TARGETS, params))
    out["one_step"] = _tokens(run("one_step", TARGETS)[1])
    for chunk in (8, 13):
        out[f"chunks_of_{chunk}"] = _tokens(run(f"chunks_of_{chunk}", TARGETS, max_batch_tokens=chunk,
                                                max_num_seqs=4)[1])
    out["batched"] = _tokens(run("batched", OTHERS + TARGETS)[1])[len(OTHERS):]
    rec.name = "staggered"
    out["staggered"] = _staggered(engine_for(tiny(), **base), params)
    rec.name = "preempted"
    out["preempted"] = _preempted(engine_for(tiny(), **base), params)
    forks = [run("forked", [t], n=2)[1][0] for t in TARGETS]
    out["forked_0"] = [r.completions[0].token_ids for r in forks]
    out["forked_1"] = [r.completions[1].token_ids for r in forks]
    eng.kv.check_leaks()
    return out


def _per_segment(monkeypatch):
    """Every step of the CPU back end on the CUDA back end's per-segment context."""
    from edge_runtime.engine.backend import CpuBackend

    monkeypatch.setattr(CpuBackend, "context",
                        lambda self, storage, steps, sm_scale: PagedKVContext(storage, steps,
                                                                              sm_scale))


@pytest.mark.parametrize("path,kv_dtype", [("flat", "int8"), ("flat", "fp16"), ("flat", "fp32"),
                                           ("per-segment", "int8"), ("per-segment", "fp32")])
def test_greedy_tokens_do_not_depend_on_how_a_request_was_served(path, kv_dtype, monkeypatch):
    if path == "per-segment":
        _per_segment(monkeypatch)
    rec = LogitsByContext(monkeypatch)
    runs = _runs(kv_dtype, rec)
    for name, tokens in runs.items():
        assert tokens == runs["cold"], name
    if path == "flat" and kv_dtype != "fp32" and cpu_native.library() is not None:
        cold = rec.runs["cold"]
        for name, logits in rec.runs.items():
            shared = [ctx for ctx in logits if ctx in cold]
            assert len(shared) >= TOKENS or name == "first", (name, len(shared))
            differ = [len(ctx) for ctx in shared if not torch.equal(logits[ctx], cold[ctx])]
            assert not differ, f"{name}: logits differ from the cold run's at lengths {differ}"


def test_per_segment_triton_kernels_read_like_a_cold_run(monkeypatch):
    """The CUDA back end's kernels (TRITON_INTERPRET=1 on CPU tensors), int8 KV: the same greedy
    tokens cold, from the prefix cache (cut back to the window), and prefilled in chunks of 3.
    Tiny, as the interpreter is slow."""
    from edge_runtime.engine import paged_kv
    from edge_runtime.kernels import kv_write, paged_attention

    if kv_write.triton is None:
        pytest.skip("needs triton")
    _per_segment(monkeypatch)
    monkeypatch.setattr(paged_kv, "write_kv", kv_write.write_kv_triton)
    monkeypatch.setattr(paged_kv, "paged_attention", paged_attention.paged_attention_triton)
    monkeypatch.setattr(paged_kv, "merge_attention", paged_attention.merge_attention_triton)
    system = tiny_prompts([10], seed=90)[0]
    prompts = [system + tiny_prompts([3], seed=91)[0], system + tiny_prompts([4], seed=92)[0]]
    params = greedy(2, ignore_eos=True)
    base = dict(kv_dtype="int8", page_tokens=8, num_pages=16, recent_window=4, enable_inline=False)
    eng = engine_for(tiny(), **base)
    cold = eng.generate(prompts[:1], params)[0].token_ids
    cached = eng.generate(prompts[1:], params)[0]
    assert cached.cached_prompt_tokens == 8  # 10 shared, cut back to two windows of 4
    chunked = engine_for(tiny(), **base, max_batch_tokens=3, max_num_seqs=2).generate(prompts, params)
    assert [r.token_ids for r in chunked] == [cold, cached.token_ids]


@pytest.mark.slow
def test_smollm2_logits_are_bit_identical_cold_cached_and_chunked(monkeypatch):
    """SmolLM2-135M (head_dim 64: the C attention's vectorized task), int8 KV: a chat turn after a
    shared system prompt, cold, with the system prompt from the cache, and prefilled in chunks of
    40 while another request decodes; every position's logits the same bit for bit."""
    from engine_helpers import smollm2

    if cpu_native.library() is None:
        pytest.skip("the bit-exact path needs the C library")
    from edge_runtime.model.chat import encode_prompt

    tok = smollm2().tokenizer
    system_text = "You are a terse home assistant. Answer in one short sentence. " * 3
    turn = encode_prompt(tok, "Turn the kitchen lights off.", chat=True, system=system_text)
    other = encode_prompt(tok, "Hi", chat=True, system=system_text)
    assert turn[:40] == other[:40]
    params = greedy(12, ignore_eos=True)
    rec = LogitsByContext(monkeypatch)
    base = dict(kv_dtype="int8", page_tokens=64, num_pages=24)
    rec.name = "cold"
    cold = engine_for(smollm2(), **base).generate([turn], params)[0].token_ids
    eng = engine_for(smollm2(), **base)
    rec.name = "first"
    eng.generate([other], params)
    rec.name = "cached"
    cached = eng.generate([turn], params)[0]
    assert cached.cached_prompt_tokens > 0 and cached.cached_prompt_tokens % 16 == 0
    rec.name = "chunked"
    chunked = engine_for(smollm2(), **base, max_batch_tokens=40, max_num_seqs=2).generate(
        [encode_prompt(tok, "Tell me a story about a lighthouse.", chat=True), turn],
        params)[1].token_ids
    assert cached.token_ids == cold and chunked == cold
    for name in ("cached", "chunked"):
        differ = [len(c) for c, x in rec.runs[name].items()
                  if c in rec.runs["cold"] and not torch.equal(x, rec.runs["cold"][c])]
        assert not differ and len(rec.runs[name]) >= 12, (name, differ)
