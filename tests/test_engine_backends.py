"""The CUDA back end (paged store, Triton kernels; here on CPU tensors through the Triton
interpreter) against the CPU back end (flat store, C kernels) on a tiny random Llama with 64-token
pages: the same greedy tokens on an fp32 model through prefix sharing (a partial shared page),
inline slots, recent-key windows, centred keys, n = 2, beam search and a preemption (on 16-token
pages), with the Triton kernels counted; an AWQ model's logits within a stated tolerance
(docs/engine.md)."""

import pytest
import torch

from backend_helpers import engine_on, tiny_awq_folder
from model_helpers import random_ids

from edge_runtime.engine.api import SamplingParams
from edge_runtime.kernels import dispatch

pytestmark = pytest.mark.skipif(not dispatch.triton_importable(), reason="needs triton (interpreter)")

SYSTEM = random_ids(40, 500, seed=1)  # shared as a partial 64-token page (32 tokens: whole windows)


def _greedy(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def _run(engine) -> list:
    """Every scenario on one engine; returns the completions' token ids in order."""
    out = []
    first = engine.generate([SYSTEM + random_ids(5, 500, seed=2)], _greedy(4))  # caches the prefix
    tails = [SYSTEM + random_ids(n, 500, seed=3 + n) for n in (4, 9)] + [random_ids(7, 500, seed=9)]
    shared = engine.generate(tails, _greedy(4))  # prefix hits; the short cold prompt goes inline
    forked = engine.generate([SYSTEM + random_ids(3, 500, seed=20)], _greedy(4, n=2))
    beams = engine.generate([random_ids(12, 500, seed=21)], _greedy(4, beam_width=2))
    for res in first + shared + forked + beams:
        out.append([c.token_ids for c in res.completions])
    out.append(shared[0].cached_prompt_tokens)
    return out


def test_cuda_back_end_matches_the_cpu_back_end_greedy():
    cpu = engine_on("cpu")
    cuda = engine_on("cuda")
    assert cpu.config.recent_window > 0 and cpu.storage.k_means is not None  # windows, centred keys
    before = dispatch.TRITON_LAUNCHES.copy()
    got = _run(cuda)
    launched = dispatch.TRITON_LAUNCHES - before
    assert got == _run(cpu)
    # the system prompt came from the cache, cut back to a multiple of the recent-key window (the
    # read rule, kv/recent_window.py): 32 of its 40 tokens, still a partial 64-token page
    assert got[-1] == 40 - 40 % cpu.config.recent_window == 32
    assert cuda.kv.counters.inline_to_pages > 0  # the short prompt ran in an inline slot
    for kernel in ("write_kv", "positional_attention", "exact_block_attention", "merge_in_order"):
        assert launched[kernel] > 0, (kernel, dict(launched))
    assert cuda.stats()["backends"]["backend"] == "cuda"


def test_cuda_back_end_preempts_and_matches():
    # one 16-token page each, then a second: a pool of 2 preempts one (16-token pages: the
    # interpreter runs attention once per token, 61-token prompts on 64-token pages took 38 s)
    prompts = [random_ids(13, 500, seed=40 + i) for i in range(2)]
    results = {}
    for backend in ("cpu", "cuda"):
        eng = engine_on(backend, num_pages=2, page_tokens=16, enable_inline=False, max_num_seqs=2)
        results[backend] = [r.token_ids for r in eng.generate(prompts, _greedy(5))]
        assert eng.stats()["preemptions"] > 0, backend
        eng.kv.check_leaks()
    assert results["cuda"] == results["cpu"]


# an AWQ checkpoint's LM head is fp16 and its matmul rounds the logits to fp16 (quant/half_embed.py):
# one fp16 ulp of the largest logit is at most 2^-10 of it (measured 5.4e-4)
AWQ_LOGIT_TOLERANCE = 2 ** -10


def test_awq_logits_agree_within_tolerance():
    """An AWQ folder is converted at load into the blocked format both back ends read: the same
    weights, so the logits agree to summation order (fp32 KV) and the blocked kernel ran."""
    from edge_runtime.kernels.cpu_int4 import QuantLinear

    ids = random_ids(80, 500, seed=50)
    logits = {}
    for backend in ("cpu", "cuda"):
        eng = engine_on(backend, tiny_awq_folder(), enable_prefix_cache=False, enable_inline=False,
                        max_batch_tokens=32, kv_dtype="fp32")
        before = dispatch.TRITON_LAUNCHES["blocked_gemm"]
        logits[backend] = torch.cat([chunk for _, chunk in eng.scorer().logits(ids)])
        launched = dispatch.TRITON_LAUNCHES["blocked_gemm"] - before
        assert launched == (0 if backend == "cpu" else 3 * 2 * 4), (backend, launched)
    assert isinstance(eng.model.model.layers[0].mlp.down_proj, QuantLinear)
    diff = (logits["cuda"] - logits["cpu"]).abs().max() / logits["cpu"].abs().max()
    assert diff < AWQ_LOGIT_TOLERANCE, float(diff)


# of the logits' max |value|, with fp32 KV: the same weights, another summation order (measured
# 5.8e-7, as the fp32 model's 4.8e-7; with int8 KV both differ by ~7e-4, int8 rounding flips)
GGUF_LOGIT_TOLERANCE = 1e-5


def test_gguf_blocks_on_the_cuda_back_end_match_the_cpu_back_end():
    """A GGUF served from its own Q4_1 / Q8_0 blocks: the CUDA back end runs every linear (the
    Q8_0 head too) through the blocked W4A16 Triton kernel, the CPU back end through the C
    kernels over the same bytes; greedy tokens equal (int8 KV), logits within GGUF_LOGIT_TOLERANCE
    (fp32 KV)."""
    from backend_helpers import loaded_gguf_for

    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.engine import Engine
    from edge_runtime.kernels.cpu_int4 import QuantLinear

    cfg = dict(page_tokens=64, num_pages=8, inline_tokens=32, num_inline_slots=2,
               check_invariants_every_step=True)
    engines = {b: Engine(loaded_gguf_for(b), EngineConfig(device="cpu", backend=b, **cfg))
               for b in ("cpu", "cuda")}
    assert isinstance(engines["cuda"].model.lm_head, QuantLinear)
    prompts = [SYSTEM + random_ids(5, 500, seed=60), random_ids(7, 500, seed=61)]
    before = dispatch.TRITON_LAUNCHES.copy()
    tokens = {b: [r.token_ids for r in e.generate(prompts, _greedy(4))] for b, e in engines.items()}
    launched = dispatch.TRITON_LAUNCHES - before
    assert tokens["cuda"] == tokens["cpu"]
    # per forward: 4 linears per layer and the head, each one launch
    assert launched["blocked_gemm"] >= 4 * (2 * 4 + 1), dict(launched)
    ids = random_ids(40, 500, seed=62)
    logits = {}
    for backend in ("cpu", "cuda"):
        eng = Engine(loaded_gguf_for(backend),
                     EngineConfig(device="cpu", backend=backend, enable_prefix_cache=False,
                                  enable_inline=False, max_batch_tokens=32, kv_dtype="fp32", **cfg))
        logits[backend] = torch.cat([chunk for _, chunk in eng.scorer().logits(ids)])
    diff = (logits["cuda"] - logits["cpu"]).abs().max() / logits["cpu"].abs().max()
    assert diff < GGUF_LOGIT_TOLERANCE, float(diff)


# fp16 activations and the weights rounded to fp16 inside the kernel's tiles, against the CPU back
# end's fp32: each rounding is at most 2^-11 relative, over two layers (measured 1.6e-3)
FP16_LOGIT_TOLERANCE = 5e-3


def test_gguf_blocks_with_fp16_activations_on_the_cuda_back_end():
    """What the loader gives a GPU (`gguf_int4.place`: fp16 norms, fp16 embedding rows, the
    quantized bytes as they are) runs the fp16 kernels end to end: logits within
    FP16_LOGIT_TOLERANCE of the CPU back end's fp32. No argmax check: where the bound holds it
    implies the argmax wherever the top two differ by more than twice it, and a closer pair may
    flip (this prompt has one: its top two 2.3e-4 of the largest logit apart)."""
    from backend_helpers import loaded_gguf_for

    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.engine import Engine

    cfg = dict(page_tokens=64, num_pages=8, inline_tokens=32, num_inline_slots=2,
               enable_prefix_cache=False, enable_inline=False, max_batch_tokens=32, kv_dtype="fp16")
    ids = random_ids(40, 500, seed=62)
    logits = {}
    for backend, dtype in (("cpu", torch.float32), ("cuda", torch.float16)):
        loaded = loaded_gguf_for(backend, dtype=dtype)
        assert loaded.model.dtype == dtype
        eng = Engine(loaded, EngineConfig(device="cpu", backend=backend, **cfg))
        logits[backend] = torch.cat([chunk for _, chunk in eng.scorer().logits(ids)])
    diff = (logits["cuda"] - logits["cpu"]).abs().max() / logits["cpu"].abs().max()
    assert diff < FP16_LOGIT_TOLERANCE, float(diff)
