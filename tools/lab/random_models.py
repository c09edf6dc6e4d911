"""Small random-weight Llama / Qwen2 / Mistral checkpoints saved as HF folders (with the default
model's tokenizer), and random token ids: what the model checks and the tests build models from.

Every parameter is drawn at random (biases and norm weights too, which transformers initialises to
0 / 1), so a forgotten bias or norm cannot hide.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from edge_runtime.model.loader import DEFAULT_MODEL, resolve_model_folder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def copy_tokenizer(folder: Path) -> None:
    src = resolve_model_folder(DEFAULT_MODEL)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)


def tiny_hf_config(arch: str, **overrides):
    """A small transformers config of `arch` ("llama" | "qwen2" | "mistral" | "qwen3" | "gemma3" |
    "smollm3") with GQA. qwen3: head_dim 32 (not hidden / heads = 16). gemma3: head_dim 32, three
    layers (two local with window 8, then a global one), query_pre_attn_scalar 24, logit
    softcapping. smollm3: four layers, the third without rotary."""
    from transformers import (Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config,
                              SmolLM3Config)

    common = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig,
           "qwen3": Qwen3Config, "gemma3": Gemma3TextConfig, "smollm3": SmolLM3Config}[arch]
    if arch == "smollm3":  # layers 0, 1 and 3 with rotary, layer 2 without (NoPE)
        common.update(num_hidden_layers=4, no_rope_layers=[1, 1, 0, 1], pad_token_id=0)
    if arch == "mistral":
        common["sliding_window"] = 4096
    if arch == "qwen3":
        common["head_dim"] = 32
    if arch == "gemma3":
        common.update(head_dim=32, num_hidden_layers=3, sliding_window=8, query_pre_attn_scalar=24,
                      layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                      final_logit_softcapping=30.0, tie_word_embeddings=True, pad_token_id=0,
                      rope_parameters={"sliding_attention": {"rope_type": "default",
                                                             "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "default",
                                                          "rope_theta": 1000000.0}})
    common.update(overrides)
    return cls(**common)


def save_random_model(hf_config, folder: Path, seed: int = 0, dtype=torch.float32,
                      max_shard_size: str | None = None) -> Path:
    """Random-weight transformers model of `hf_config` saved as a HF folder with a tokenizer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model = model.to(dtype)
    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(folder), **kwargs)
    copy_tokenizer(folder)
    return folder


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()
