"""The mean key of each layer and kv head, measured once when an int8-KV engine starts.

Why (docs/engine.md, "Centred keys"): a model's rotated keys share a large common component (the
mean key is 63-83% of a key's norm for SmolLM2-135M), so an int8 row of `k - m` has finer steps
than one of `k`. A fixed vector subtracted from keys is exact for attention once readers add `q.m`
back, so int8 stores keep each key centred where that lowers its absmax (kernels/quantize.py).

What: the model runs in fp32, as one prefill without a cache, over a fixed calibration text
shipped with the package (data/key_calibration.txt: chat turns in the ChatML template, prose and
code; not any benchmark's text), and each layer's roped keys are averaged over positions 1..
(position 0, the attention sink, is far from the others and left out), then rotated into the
stores' Hadamard basis when the store is rotated. A model without a tokenizer (tests' random
models) is run on a fixed pseudo-random token sequence instead. The result is a pure function of
the weights, so every run of a model centres the same keys.
"""

from __future__ import annotations

from importlib import resources

import torch

from edge_runtime.kernels import hadamard
from edge_runtime.model.contiguous_kv import causal_attention

CALIBRATION_FILE = "key_calibration.txt"
MAX_CALIBRATION_TOKENS = 1024
_RANDOM_TOKENS = 256
_RANDOM_SEED = 20261130


class _KeyRecorder:
    """A KVContext for one sequence's prefill that keeps each layer's keys (and attends causally)."""

    def __init__(self, sm_scale: float) -> None:
        self.sm_scale = sm_scale
        self.keys: dict[int, torch.Tensor] = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys[layer] = k.detach().float()
        return causal_attention(q, k, v, 0, self.sm_scale)


def calibration_ids(tokenizer, vocab_size: int) -> list[int]:
    """The tokens the means are measured on: the shipped text, or fixed random ids without a tokenizer."""
    if tokenizer is None:
        gen = torch.Generator().manual_seed(_RANDOM_SEED)
        return torch.randint(0, vocab_size, (_RANDOM_TOKENS,), generator=gen).tolist()
    text = resources.files("edge_runtime").joinpath("data", CALIBRATION_FILE).read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False).input_ids[:MAX_CALIBRATION_TOKENS]
    return [i for i in ids if 0 <= i < vocab_size]


@torch.inference_mode()
def measure_key_means(model, ids: list[int], rotated: bool) -> torch.Tensor:
    """-> float32 [num_layers, num_kv_heads, head_dim]: each layer's mean roped key over positions
    1.. of `ids`, Hadamard-rotated when `rotated` (the int8 store's basis)."""
    cfg = model.config
    assert len(ids) >= 2, "the key means need two calibration tokens at least"
    recorder = _KeyRecorder(cfg.head_dim ** -0.5)
    device = model.device
    model(torch.tensor(ids, dtype=torch.long, device=device),
          torch.arange(len(ids), device=device), recorder, torch.tensor([len(ids) - 1], device=device))
    means = torch.stack([recorder.keys[layer][1:].mean(dim=0) for layer in range(cfg.num_layers)])
    return (hadamard.rotate(means) if rotated else means).float().contiguous()


def key_means_for(loaded_model, rotated: bool) -> torch.Tensor:
    """measure_key_means on the loaded model's calibration ids, once per model object (engines of
    one model in a process share it)."""
    model = loaded_model.model
    means = getattr(model, "_edge_key_means", None)
    if means is None:
        ids = calibration_ids(loaded_model.tokenizer, model.config.vocab_size)
        means = measure_key_means(model, ids, rotated=False)
        model._edge_key_means = means
    return (hadamard.rotate(means) if rotated else means).float().contiguous()
