"""Shared helpers for the model tests: load SmolLM2 once per process (ours and transformers'), run
our forward simply; the random-weight checkpoints come from tools/lab/random_models.py (the model
checks in tools/ build the same ones).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch

from edge_runtime.model.contiguous_kv import ContiguousKVCache
from edge_runtime.model.loader import DEFAULT_MODEL, fp32_folder, load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from lab.random_models import (TOKENIZER_FILES, copy_tokenizer, random_ids,  # noqa: E402,F401
                               save_random_model, tiny_hf_config)


@functools.lru_cache(maxsize=1)
def smollm2():
    """Our LoadedModel of the default model from its float32 conversion (`--weights fp32`, what
    transformers computes too)."""
    return load_model(DEFAULT_MODEL, weights="fp32")


@functools.lru_cache(maxsize=1)
def smollm2_gguf():
    """Our LoadedModel of the default model served from its own Q4_1/Q8_0 blocks (the default)."""
    return load_model(DEFAULT_MODEL, weights="gguf")


@functools.lru_cache(maxsize=1)
def smollm2_hf():
    """transformers' model loaded from the same converted folder (float32, eval)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(fp32_folder(DEFAULT_MODEL)),
                                                dtype=torch.float32).eval()


def hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """float32 [T, vocab] logits of transformers for one sequence."""
    with torch.inference_mode():
        return hf_model(torch.tensor([ids])).logits[0].float()


def our_logits(model, ids: list[int]) -> torch.Tensor:
    """float32 [T, vocab]: our forward over one sequence in one prefill (all rows)."""
    cache = ContiguousKVCache.for_model(model.config, dtype=model.dtype)
    cache.add(0)
    positions = cache.positions([0], [len(ids)])
    return model(torch.tensor(ids), positions, cache.step([0], [len(ids)]), None)
