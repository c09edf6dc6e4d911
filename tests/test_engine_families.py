"""Qwen3, Gemma 3 and SmolLM3 through the Engine on both back ends (CPU: flat store, C kernels;
CUDA: paged store, Triton kernels through the interpreter on CPU tensors), fp32 KV: greedy tokens equal to
transformers' generate on tiny random checkpoints (tests/model_helpers.py). Gemma 3's test
config has a 24-token window on its local layers (16-token pages); the window tests run a second
one with a 12-token window on 8-token pages (the same page structure with half the tokens to
prefill through the Triton interpreter), so prompts several windows long check that the step
contexts mask each local layer to its window (kv/layer_windows.py): cold, from the prefix cache,
batched, forked (n > 1) and in beam search."""

import functools
import tempfile
from pathlib import Path

import pytest
import torch
from engine_helpers import hf_beam
from model_helpers import random_ids, save_random_model, tiny_hf_config

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.errors import RequestError
from edge_runtime.kernels import dispatch

WINDOW = 24  # not a multiple of the 16-token pages: a window's start falls inside a page
# The window tests' Gemma 3 ("gemma3-w12"): half the geometry, 12-token window on 8-token pages.
# The window's start still falls inside a page and a local group still holds at most
# ceil(12 / 8) + 1 = 3 pages (ceil(24 / 16) + 1 = 3), so halved prompts keep the page counts,
# releases, evictions and prefix cuts of the full geometry.
SHORT, SHORT_WINDOW, SHORT_PAGE = "gemma3-w12", 12, 8
_FAMILIES = {"qwen3": ("qwen3", {}), "gemma3": ("gemma3", {"sliding_window": WINDOW}),
             "smollm3": ("smollm3", {}), SHORT: ("gemma3", {"sliding_window": SHORT_WINDOW})}
_TMP = tempfile.TemporaryDirectory(prefix="edge-family-tests-")


@functools.lru_cache(maxsize=4)
def family_folder(name: str) -> Path:
    family, overrides = _FAMILIES[name]
    return save_random_model(tiny_hf_config(family, **overrides), Path(_TMP.name) / name, seed=21)


@functools.lru_cache(maxsize=1)  # one at a time: each test runs one family
def hf_model(name: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(family_folder(name)), dtype=torch.float32).eval()


def hf_greedy(name: str, prompt: list[int], max_new: int) -> list[int]:
    with torch.inference_mode():
        out = hf_model(name).generate(torch.tensor([prompt]), max_new_tokens=max_new,
                                      do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def engine_on(name: str, backend: str, **cfg) -> Engine:
    loaded = load_for(str(family_folder(name)), resolve("cpu", backend), progress=lambda m: None)
    cfg = {"page_tokens": 16, "num_pages": 16, "inline_tokens": 16, "num_inline_slots": 4,
           "kv_dtype": "fp32", "check_invariants_every_step": True, **cfg}
    return Engine(loaded, EngineConfig(device="cpu", backend=backend, **cfg))


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not dispatch.triton_importable(), reason="needs triton (interpreter)"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["qwen3", "gemma3", "smollm3"])
def test_engine_greedy_matches_transformers(name, backend):
    engine = engine_on(name, backend)
    prompts = [random_ids(n, 512, seed=n) for n in (5, 19, 30)]
    shared = prompts[2][:20] + random_ids(6, 512, seed=99)  # a cached prefix of the 30-token one
    results = engine.generate(prompts, _greedy(10))
    results += engine.generate([shared], _greedy(10))
    for prompt, res in zip(prompts + [shared], results):
        want = hf_greedy(name, prompt, 10)
        assert res.completions[0].token_ids == want, (name, backend, len(prompt))
    engine.kv.check_leaks()


def short_engine(backend: str, **cfg) -> Engine:
    """An engine on the window tests' Gemma 3 (12-token window, 8-token pages)."""
    return engine_on(SHORT, backend, page_tokens=SHORT_PAGE, inline_tokens=SHORT_PAGE, **cfg)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma3_local_layers_past_the_window(backend):
    """Prompts 3-4 windows long (37 and 49 tokens, window 12), batched; then one sharing 35
    tokens whose first 32 (4 pages of 8) come from the prefix cache, and n = 2 (a fork): every
    greedy answer equals transformers' (whose local layers read only their window), so each
    local layer read exactly keys i - 12 < j <= i."""
    engine = short_engine(backend, num_pages=48)
    prompts = [random_ids(n, 512, seed=70 + n) for n in (37, 49)]
    shared = prompts[1][:35] + random_ids(5, 512, seed=5)
    results = engine.generate(prompts, _greedy(12))
    engine.kv.check_invariants()
    results += engine.generate([shared], _greedy(12))
    assert results[2].cached_prompt_tokens >= 32, results[2].cached_prompt_tokens
    for prompt, res in zip(prompts + [shared], results):
        assert res.completions[0].token_ids == hf_greedy(SHORT, prompt, 12), (backend, len(prompt))
    forked = engine.generate([prompts[0]], SamplingParams(max_tokens=12, temperature=0.0,
                                                          ignore_eos=True, n=2))[0]
    assert [c.token_ids for c in forked.completions] == [results[0].completions[0].token_ids] * 2
    engine.kv.check_leaks()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma3_local_pages_are_released_behind_the_window(backend):
    """Layer groups (kv/layer_groups.py), window 12 on 8-token pages: while a 49-token prompt
    decodes 8 tokens (7 pages), its local layers hold the slices of at most ceil(12 / 8) + 1 = 3
    pages and its global layers all of them, and the greedy answer still equals transformers'.
    Its decode steps read from positions 49 to 55 (the 8th token is never written), keys > 55 -
    12: the local parts of the 5 pages ending at or before 44 are released, 4 at the first step
    and [32, 40) last (from position 51, limit 51 - 12 + 1 = 40), so that one is first in line.
    With it evicted, a prompt sharing 35 tokens hits only 32 (a hit of 35 needs its window
    [24, 35), which reaches into [32, 40); cut to 32, its window, positions [21, 32), is still
    there) and still answers as transformers does."""
    engine = short_engine(backend, num_pages=48)
    assert engine.kv.pool.page_slices > 1  # the tiny Gemma 3 has global and local layers
    prompt = random_ids(49, 512, seed=167)
    rid = engine.add_request(prompt, _greedy(8))
    most, tokens = 0, None
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.result is not None and ev.request_id == rid:
                tokens = ev.result.completions[0].token_ids
        for seq in engine.kv.seqs.values():
            if seq.read_from >= len(prompt):  # decoding (a prefill chunk holds its pages)
                held = len(seq.all_pages()) - seq.local_from
                assert held <= -(-SHORT_WINDOW // SHORT_PAGE) + 1, (held, seq.read_from)
                most = max(most, held)
    assert most >= 2 and engine.kv.counters.local_pages_released >= 5
    assert tokens == hf_greedy(SHORT, prompt, 8), backend
    front = engine.kv.pool.lru.front()
    assert front.local and engine.kv.pool.pages[front.head].start == 32
    engine.kv.evict(1)
    shared = prompt[:35] + random_ids(5, 512, seed=6)
    res = engine.generate([shared], _greedy(8))[0]
    assert res.cached_prompt_tokens == 32, res.cached_prompt_tokens
    assert res.completions[0].token_ids == hf_greedy(SHORT, shared, 8), backend
    engine.kv.check_leaks()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gemma3_pool_shrinks_by_slices_mid_generation(backend):
    """Layer groups under the memory guard: 3/4 of the pool's slices leave service while two
    sequences run past the window (live global and local slices moved one by one, a "slices"
    copy each), and both answers still equal transformers'; the slices come back after. Window
    12 on 8-token pages: the cached prompt holds 5 pages, the two running ones 6 and 5 at most
    (37 + 9 and 30 + 9 tokens written), within the 12 pages' slices that stay."""
    engine = short_engine(backend, num_pages=48)
    engine.generate([random_ids(35, 512, seed=179)], _greedy(4))  # cached: the low slices
    prompts = [random_ids(n, 512, seed=180 + n) for n in (37, 30)]
    rids = [engine.add_request(p, _greedy(10)) for p in prompts]
    for _ in range(4):  # prompts computed, a few tokens decoded
        engine.step()
    slices, copies = engine.kv.pool.num_pages, engine.kv.counters.copies
    assert slices == 48 * engine.kv.pool.page_slices
    assert engine.shrink_pool(3) == 3  # a quarter of the slices stays
    assert engine.kv.stats()["pages_retired"] == slices * 3 // 4
    assert engine.kv.counters.copies > copies  # live slices were moved
    kept = range(slices // 4)
    assert all(p in kept for s in engine.kv.seqs.values() for p in s.all_pages())
    assert all(engine.kv.pool.group_map[g][p] in kept for s in engine.kv.seqs.values()
               for p in s.all_pages()[s.local_from:] for g in range(engine.kv.pool.page_slices))
    results = {}
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.result is not None:
                results[ev.request_id] = ev.result
    for rid, prompt in zip(rids, prompts):
        assert results[rid].completions[0].token_ids == hf_greedy(SHORT, prompt, 10)
    assert engine.grow_pool() == 3 and engine.kv.stats()["pages_retired"] == 0
    engine.kv.check_leaks()


def test_gemma3_beam_search_past_the_window():
    """Beam search (forks sharing pages, copy-on-write) over a 75-token prompt equals
    transformers' num_beams=2."""
    prompt = random_ids(75, 512, seed=145)
    engine = engine_on("gemma3", "cpu", num_pages=48)
    got = engine.generate([prompt], SamplingParams(max_tokens=8, beam_width=2))[0]
    assert got.completions[0].token_ids == hf_beam(hf_model("gemma3"), prompt, 2, 8, 2)
    engine.kv.check_leaks()


def test_gemma3_engine_serves_past_the_window():
    """The engine's context is the model's, not its local layers' window."""
    engine = engine_on("gemma3", "cpu")
    assert engine.model.config.max_position_embeddings == 2048
    with pytest.raises(RequestError, match="at most 2047"):
        engine.generate([random_ids(2048, 512, seed=1)], _greedy(2))


@pytest.mark.skipif(not dispatch.triton_importable(), reason="needs triton (interpreter)")
@pytest.mark.parametrize("name", ["qwen3", "gemma3", "smollm3"])
def test_int8_kv_back_ends_agree(name):
    """int8 KV: the CPU back end (Qwen3 through the one-call C layer stack, kernels/cpu_decoder.py;
    Gemma 3 and SmolLM3 through the torch layer loop) and the CUDA back end give the same greedy
    tokens, prompts batched: one page of 16, and two (the second partial) whose decode writes
    into a third (30 + 7 tokens written); Gemma 3's 42-token prompt runs past its 24-token
    window (its decode steps read from positions 42 to 48, keys from 42 - 24 + 1 = 19 on: the
    first page's local part is released). Two int8 paths agree only where no two logits are
    near tied (Gemma 3's 40-token prompt has its second token's top two 0.03 apart in fp32, and
    the back ends split there)."""
    lengths = (6, 25, 42) if name == "gemma3" else (6, 30)  # no window: 30 has every page case
    prompts = [random_ids(n, 512, seed=40 + n) for n in lengths]
    got = {}
    for backend in ("cpu", "cuda"):
        engine = engine_on(name, backend, kv_dtype="int8", num_pages=24)
        if backend == "cpu":
            fused = engine.model.fused_decoder is not None
            assert fused == (name == "qwen3"), (name, fused)
        got[backend] = [r.completions[0].token_ids for r in engine.generate(prompts, _greedy(8))]
    assert got["cpu"] == got["cuda"]
