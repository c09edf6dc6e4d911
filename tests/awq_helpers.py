"""Shared helpers for the AWQ tests: import AutoAWQ's pieces without its heavy package init,
and build tiny random Llama models."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch


def import_autoawq():
    """Import AutoAWQ's GEMM linear and packing helpers, or skip if autoawq is not installed.

    `import awq` runs awq/__init__.py, which imports the whole quantizer (and `datasets`, a
    dependency we do not install). We register a bare package object pointing at the installed
    folder so that only the submodules we ask for are executed.
    """
    if "awq" not in sys.modules:
        spec = importlib.util.find_spec("awq")
        if spec is None or spec.submodule_search_locations is None:
            pytest.skip("autoawq is not installed (pip install autoawq==0.2.9 --no-deps)")
        pkg = types.ModuleType("awq")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["awq"] = pkg
    try:
        from awq.modules.linear.gemm import WQLinear_GEMM
        from awq.utils import packing_utils
    except ImportError as exc:  # e.g. accelerate missing
        pytest.skip(f"autoawq's GEMM module does not import here: {exc}")
    return WQLinear_GEMM, packing_utils


def tiny_llama_config(**overrides):
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def tiny_llama(seed: int = 0, **overrides):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(**overrides)).float().eval()
    # random init of HF is tiny (std 0.02): give norms non-trivial weights and outlier channels
    # so that activation-aware scaling has something to find.
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.copy_(0.5 + torch.rand_like(norm.weight))
                norm.weight[:4] *= 8.0
    return model
