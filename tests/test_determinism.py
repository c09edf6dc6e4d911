"""Determinism by construction: a greedy request's tokens are a function of the request alone.

The same three requests (two sharing a system prompt) are served cold and alone, then from the
prefix cache, after another request cached their system prompt, sharing it in one step,
prefilled in chunks, batched with unrelated requests (admitted together, and arriving while those
decode), after a preemption on a small pool, and as both children of n=2. Every way gives the
tokens of the cold run, with int8 KV (the recent-key window's read rule, kv/recent_window.py),
fp16 and fp32 KV, on the CPU flat path and on the CUDA back end's context (kv/paged_context.py)
with the torch reference kernels. The logits of every position are the same bit for bit on the
CPU flat path with int8 or fp16 KV (the C attention and the one-call C layer stack for every
step), and on the CUDA back end's context with its Triton kernels (under the interpreter, on a
smaller case and a 2-layer model with chunks of 1 and 5 tokens, small spans and tiles so that tiny
sequences cross several): every way with int8 KV, from the cache and in chunks of 1 with fp16 and
fp32 KV, each way one test against a cold run computed once per KV dtype; and batched on a
model of 2 query heads on 1 KV head of 32 dims, where the Hadamard rotation of a lone decode
token's heads once rounded otherwise than in a batch (kernels/hadamard.py).
"""

import functools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from edge_runtime.engine import sampler as sampler_module
from edge_runtime.kv.paged_context import PagedKVContext
from edge_runtime.kernels import cpu_native
from edge_runtime.model.loader import load_model
from engine_helpers import (_TMP, TINY_VOCAB, engine_for, greedy, tinier, tiny,
                            tiny_prompts)
from model_helpers import save_random_model, tiny_hf_config
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


class Serving:
    """A case's requests on fresh engines of one config; each run's logits recorded by name."""

    def __init__(self, case: Case, rec: LogitsByContext, kv_dtype: str, model=None):
        self.case, self.rec, self.model = case, rec, model or tiny()
        self.config = dict(kv_dtype=kv_dtype, **case.config)
        self.params = greedy(case.tokens, ignore_eos=True)

    def engine(self, **cfg):
        return engine_for(self.model, **{**self.config, **cfg})

    def generate(self, name: str, eng, prompts, n: int = 1, tokens: int | None = None):
        self.rec.name = name
        results = eng.generate(prompts, greedy(tokens or self.case.tokens, ignore_eos=True, n=n))
        eng.kv.check_leaks()
        return results


def _cold(s: Serving) -> list[list[int]]:
    return [_tokens(s.generate("cold", s.engine(), [t]))[0] for t in s.case.targets]


def _cached(s: Serving) -> list[list[int]]:
    eng = s.engine()
    s.generate("first", eng, s.case.targets, tokens=1)  # caches the prompts' pages
    results = s.generate("cached", eng, s.case.targets)
    assert all(r.cached_prompt_tokens > 0 for r in results)
    return _tokens(results)


def _other_prefix(s: Serving) -> list[list[int]]:
    """After another request cached the system prompt."""
    eng = s.engine()
    s.generate("first", eng, [s.case.system + [5, 6, 7]], tokens=1)
    return _tokens(s.generate("other_prefix", eng, s.case.targets))


def _chunks_of(size: int):
    def serve(s: Serving) -> list[list[int]]:
        eng = s.engine(max_batch_tokens=size, max_num_seqs=min(size, 4))
        return _tokens(s.generate(f"chunks_of_{size}", eng, s.case.targets))
    return serve


def _batched(s: Serving) -> list[list[int]]:
    return _tokens(s.generate("batched", s.engine(), s.case.others + s.case.targets))[len(s.case.others):]


def _staggered_run(s: Serving) -> list[list[int]]:
    s.rec.name = "staggered"
    return _staggered(s.engine(), s.params, s.case)


def _preempted_run(s: Serving) -> list[list[int]]:
    s.rec.name = "preempted"
    return _preempted(s.engine(), s.params, s.case)


def _forked(s: Serving) -> list[list[int]]:
    """Both children of n=2 (the second asserted equal to the first)."""
    results = [s.generate("forked", s.engine(), [t], n=2)[0] for t in s.case.targets]
    children = [[c.token_ids for c in r.completions] for r in results]
    assert all(second == first for first, second in children), children
    return [first for first, _ in children]


SERVING = {"one_step": lambda s: _tokens(s.generate("one_step", s.engine(), s.case.targets)),
           "cached": _cached, "other_prefix": _other_prefix, "batched": _batched,
           "staggered": _staggered_run, "preempted": _preempted_run, "forked": _forked}


def _runs(kv_dtype: str, rec: LogitsByContext, case: Case) -> dict[str, list[list[int]]]:
    """The case's targets served cold and every other way -> way -> their tokens."""
    s = Serving(case, rec, kv_dtype)
    ways = {**SERVING, **{f"chunks_of_{c}": _chunks_of(c) for c in case.chunks}}
    return {"cold": _cold(s), **{name: serve(s) for name, serve in ways.items()}}


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


def _on_triton_kernels(monkeypatch) -> None:
    """The CUDA back end's context on its Triton kernels (TRITON_INTERPRET=1 on CPU tensors):
    spans of 8 and tiles of 4 positions, so that SMALL's sequences cross several."""
    _per_segment(monkeypatch)
    use_triton_kernels(monkeypatch, span_tokens=8, block_n=4)


# Under the interpreter every launch costs: int8 KV (the default, with the recent-key window's
# exact block) is served every way; fp16 and fp32 KV the ways that move where a position's keys
# are split most (the prefix cache's shared and partial pages, prefill one token per step).
# "batched" admits the targets in one step with the others, so it also shares the system prompt
# in one step ("one_step", served on the CPU paths).
TRITON_WAYS = {"int8": ("cached", "other_prefix", "chunks_of_1", "chunks_of_5", "batched",
                        "staggered", "preempted", "forked"),
               "fp16": ("cached", "chunks_of_1"), "fp32": ("cached", "chunks_of_1")}


@pytest.fixture(scope="module")
def triton_cold():
    """kv_dtype -> (tokens, logits by context) of SMALL's cold runs on the Triton kernels, each
    computed once for the module (the patches are undone before any test runs)."""
    done = {}

    def cold(kv_dtype: str):
        if kv_dtype not in done:
            with pytest.MonkeyPatch.context() as mp:
                _on_triton_kernels(mp)
                rec = LogitsByContext(mp)
                done[kv_dtype] = _cold(Serving(SMALL, rec, kv_dtype, tinier())), rec.runs["cold"]
        return done[kv_dtype]

    return cold


@pytest.mark.parametrize("kv_dtype,way", [(d, w) for d, ways in TRITON_WAYS.items() for w in ways])
def test_cuda_backend_kernels_give_bit_identical_logits_however_served(kv_dtype, way, triton_cold,
                                                                       monkeypatch):
    """SMALL served `way` on the Triton kernels: the cold run's tokens and logits, bit for bit."""
    cold_tokens, cold_logits = triton_cold(kv_dtype)
    _on_triton_kernels(monkeypatch)
    rec = LogitsByContext(monkeypatch)
    serving = Serving(SMALL, rec, kv_dtype, tinier())
    serve = _chunks_of(int(way.rsplit("_", 1)[1])) if way.startswith("chunks_of_") else SERVING[way]
    assert serve(serving) == cold_tokens
    rec.runs["cold"] = cold_logits
    _assert_logits_equal(rec, SMALL.tokens)



@pytest.mark.parametrize("head_dim", [16, 32, 64])
def test_hadamard_rotation_of_a_row_does_not_depend_on_the_rows_beside_it(head_dim):
    """A decode token's q/k/v are rotated alone or with a batch's: the same bits (a matmul's were
    not with head_dim 32 on the CPU: its kernel depends on the row count)."""
    from edge_runtime.kernels import hadamard

    x = torch.randn(16, 2, head_dim, generator=torch.Generator().manual_seed(head_dim))
    together = hadamard.rotate(x)
    for rows in (1, 2, 3, 8):
        assert torch.equal(hadamard.rotate(x[:rows]), together[:rows]), rows
        assert torch.equal(hadamard.rotate(x[:rows, :1]), together[:rows, :1]), rows


@functools.lru_cache(maxsize=1)
def _two_heads_one_kv_head():
    """tinier() with 2 query heads on 1 KV head (head_dim 32, GQA group 2)."""
    config = tiny_hf_config("llama", num_hidden_layers=2, vocab_size=TINY_VOCAB,
                            num_attention_heads=2, num_key_value_heads=1)
    return load_model(str(save_random_model(config, Path(_TMP.name) / "two-heads")))


def test_cuda_backend_kernels_give_bit_identical_logits_batched_with_head_dim_32(monkeypatch):
    """SMALL's first target on the 2-head model, int8 KV, cold and batched with one other request
    (its decode tokens alone, then two in a step): the same logits bit for bit."""
    _on_triton_kernels(monkeypatch)
    rec = LogitsByContext(monkeypatch)
    case = Case(SMALL.system, SMALL.targets[:1], SMALL.others[:1], SMALL.tokens, SMALL.config,
                SMALL.chunks, SMALL.preempt_at)
    serving = Serving(case, rec, "int8", _two_heads_one_kv_head())
    assert _batched(serving) == _cold(serving)
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
