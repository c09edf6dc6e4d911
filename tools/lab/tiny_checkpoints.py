"""The tiny random Llama the back-end checks use (2 layers, GQA 4/2 heads, head_dim 16, SmolLM2's
vocabulary so text prompts work), saved once per process as an HF folder, and its round-to-nearest
int4 AWQ checkpoint: what tests/backend_helpers.py builds engines over and
tools/backend_agreement.py --tiny-awq scores.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path

import torch

from edge_runtime.model import awq_model
from edge_runtime.quant import awq_algo, awq_blocks

from .random_models import save_random_model, tiny_hf_config

VOCAB = 49152  # SmolLM2's tokenizer, so the CLI can take text prompts
_TMP = tempfile.TemporaryDirectory(prefix="edge-tiny-checkpoints-")


@functools.lru_cache(maxsize=1)
def tiny_folder() -> Path:
    return save_random_model(tiny_hf_config("llama", vocab_size=VOCAB), Path(_TMP.name) / "tiny", seed=11)


@functools.lru_cache(maxsize=1)
def tiny_awq_folder() -> Path:
    """Round-to-nearest int4 (group 32) of the tiny model, as `edge-runtime quantize --rtn` writes."""
    from transformers import AutoModelForCausalLM  # start-up time: only quantizing loads it

    src = tiny_folder()
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    model = copy.deepcopy(hf)
    calib = torch.randint(3, 500, (2, 32), generator=torch.Generator().manual_seed(1))
    settings = awq_algo.AWQSettings(group_size=32, clip=False, scale=False)
    tensors = awq_algo.awq_quantize(model, awq_blocks.LayerArch.from_config(hf.config), calib, settings)
    out = Path(_TMP.name) / "tiny-awq"
    awq_model.save_awq_checkpoint(out, model, tensors, src, 32, tie_word_embeddings=False)
    return out
