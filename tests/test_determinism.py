"""Determinism by construction: a greedy request's tokens are a function of the request alone.

The same three requests (two sharing a system prompt) are served cold and alone, then from the
prefix cache, after another request cached their system prompt, sharing it in one step,
prefilled in chunks, batched with unrelated requests (admitted together, and arriving while those
decode), after a preemption on a small pool, and as both children of n=2. Every way gives the
tokens of the cold run, with int8 KV (the recent-key window's read rule, cache/recent_windows.py),
fp16 and fp32 KV, on the CPU flat path and on the CUDA back end's context (engine/paged_kv.py)
with the torch reference kernels. The logits of every position are the same bit for bit on the
CPU flat path with int8 or fp16 KV (the C attention and the one-call C layer stack for every
step), and on the CUDA back end's context with its Triton kernels (under the interpreter, on a
smaller case with chunks of 1 and 5 tokens, small spans and tiles so that tiny sequences cross
several) with int8, fp16 and fp32 KV.
"""

from dataclasses import dataclass

import pytest
import torch

from edge_runtime.engine import sampler as sampler_module
from edge_runtime.engine.paged_kv import PagedKVContext
from edge_runtime.kernels import cpu_native
from engine_helpers import engine_for, greedy, tiny, tiny_prompts
from paged_kv_helpers import use_triton_kernels


@dataclass(frozen=True)
class Case:
    system: list[int]
    targets: list[list[int]]  # two after the system prompt, one unrelated
    others: list[list[int]]  # unrelated requests to batch with
    tokens: int
    config: dict
    chunks: tuple[int, ...]  # prefill chunk sizes (max_batch_tokens)
    preempt_at: tuple[int, ...]  # the steps before which the newest sequence is preempted


def _case(system_len, suffixes, unrelated, others, tokens, chunks, preempt_at, seed, **config) -> Case:
    system = tiny_prompts([system_len], seed=seed)[0]
    targets = [system + t for t in tiny_prompts(suffixes, seed=seed + 1)]
    return Case(system, targets + tiny_prompts([unrelated], seed=seed + 2),
                tiny_prompts(others, seed=seed + 3), tokens, config, chunks, preempt_at)


FULL = _case(45, [9, 22], 37, [30, 60], 10, (8, 13), (1, 5), seed=77, page_tokens=16, num_pages=64)
# under the interpreter (slow): pages of 4 and inline slots of 8 (tails in pages and in slots),
# windows of 4 (int8 KV), a system prompt over a partial page
SMALL = _case(6, [2, 4], 5, [3, 6], 3, (1, 5), (1, 2), seed=90, page_tokens=4, num_pages=48,
              inline_tokens=8, recent_window=4)


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


def _staggered(eng, params, case: Case) -> list[list[int]]:
    """The others start; the targets arrive after three steps, while the others decode."""
    for p in case.others:
        eng.add_request(p, params)
    for _ in range(3):
        eng.step()
    ids = [eng.add_request(p, params) for p in case.targets]
    done = {}
    while eng.has_unfinished():
        done.update({e.request_id: e.result for e in eng.step() if e.result is not None})
    return [done[i].token_ids for i in ids]


def _preempted(eng, params, case: Case) -> list[list[int]]:
    """The targets, the newest preempted after its prefill and again mid-answer (it resumes from
    what the prefix cache still holds of its pages)."""
    ids = [eng.add_request(p, params) for p in case.targets]
    done = {}
    for step in range(40):
        if step in case.preempt_at:
            assert eng.preempt_newest(1) == 1
        done.update({e.request_id: e.result for e in eng.step() if e.result is not None})
    assert not eng.has_unfinished() and eng.stats()["preemptions"] == 2
    return [done[i].token_ids for i in ids]


def _runs(kv_dtype: str, rec: LogitsByContext, case: Case) -> dict[str, list[list[int]]]:
    base = dict(kv_dtype=kv_dtype, **case.config)
    params = greedy(case.tokens, ignore_eos=True)
    targets, out = case.targets, {}

    def run(name, prompts, n=1, **cfg):
        rec.name = name
        eng = engine_for(tiny(), **{**base, **cfg})
        return eng, eng.generate(prompts, greedy(case.tokens, ignore_eos=True, n=n))

    out["cold"] = [_tokens(run("cold", [t])[1])[0] for t in targets]
    eng, _ = run("first", targets)
    rec.name = "cached"
    out["cached"] = _tokens(eng.generate(targets, params))
    assert all(r.cached_prompt_tokens > 0 for r in eng.generate(targets, params))
    eng, _ = run("first", [case.system + [5, 6, 7]])
    rec.name = "other_prefix"
    out["other_prefix"] = _tokens(eng.generate(targets, params))
    out["one_step"] = _tokens(run("one_step", targets)[1])
    for chunk in case.chunks:
        out[f"chunks_of_{chunk}"] = _tokens(run(f"chunks_of_{chunk}", targets, max_batch_tokens=chunk,
                                                max_num_seqs=min(chunk, 4))[1])
    out["batched"] = _tokens(run("batched", case.others + targets)[1])[len(case.others):]
    rec.name = "staggered"
    out["staggered"] = _staggered(engine_for(tiny(), **base), params, case)
    rec.name = "preempted"
    out["preempted"] = _preempted(engine_for(tiny(), **base), params, case)
    forks = [run("forked", [t], n=2)[1][0] for t in targets]
    out["forked_0"] = [r.completions[0].token_ids for r in forks]
    out["forked_1"] = [r.completions[1].token_ids for r in forks]
    eng.kv.check_leaks()
    return out


def _assert_logits_equal(rec: LogitsByContext, tokens: int) -> None:
    """Every run's logits at every context the cold runs also saw are the cold run's, bit for bit."""
    cold = rec.runs["cold"]
    for name, logits in rec.runs.items():
        shared = [ctx for ctx in logits if ctx in cold]
        assert len(shared) >= tokens or name == "first", (name, len(shared))
        differ = [len(ctx) for ctx in shared if not torch.equal(logits[ctx], cold[ctx])]
        assert not differ, f"{name}: logits differ from the cold run's at lengths {differ}"


def _per_segment(monkeypatch):
    """Every step of the CPU back end (its C linears) on the CUDA back end's context."""
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
    runs = _runs(kv_dtype, rec, FULL)
    for name, tokens in runs.items():
        assert tokens == runs["cold"], name
    if path == "flat" and kv_dtype != "fp32" and cpu_native.library() is not None:
        _assert_logits_equal(rec, FULL.tokens)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp16", "fp32"])
def test_cuda_backend_kernels_give_bit_identical_logits_however_served(kv_dtype, monkeypatch):
    """The CUDA back end's context on its Triton kernels (TRITON_INTERPRET=1 on CPU tensors):
    spans of 8 and tiles of 4 positions (the sequences cross several), every way of serving."""
    _per_segment(monkeypatch)
    use_triton_kernels(monkeypatch, span_tokens=8, block_n=4)
    rec = LogitsByContext(monkeypatch)
    runs = _runs(kv_dtype, rec, SMALL)
    for name, tokens in runs.items():
        assert tokens == runs["cold"], name
    _assert_logits_equal(rec, SMALL.tokens)


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
