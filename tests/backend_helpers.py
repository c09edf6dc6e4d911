"""A tiny random Llama (2 layers, GQA 4/2 heads, head_dim 16) saved as a folder, its RTN int4 AWQ
checkpoint, and Engines over it on either back end (engine/backend.py). The CUDA back end runs on
CPU tensors through the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path

import torch

from model_helpers import save_random_model, tiny_hf_config

from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.engine.placement import load_for, resolve

VOCAB = 49152  # SmolLM2's tokenizer, so the CLI can take text prompts
PAGE = 64
_TMP = tempfile.TemporaryDirectory(prefix="edge-backend-tests-")


@functools.lru_cache(maxsize=1)
def tiny_folder() -> Path:
    return save_random_model(tiny_hf_config("llama", vocab_size=VOCAB), Path(_TMP.name) / "tiny", seed=11)


@functools.lru_cache(maxsize=1)
def tiny_awq_folder() -> Path:
    """Round-to-nearest int4 (group 32) of the tiny model, as `edge-runtime quantize --rtn` writes."""
    from transformers import AutoModelForCausalLM

    from edge_runtime.quant import awq_algo, awq_blocks, awq_model

    src = tiny_folder()
    hf = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    model = copy.deepcopy(hf)
    calib = torch.randint(3, 500, (2, 32), generator=torch.Generator().manual_seed(1))
    settings = awq_algo.AWQSettings(group_size=32, clip=False, scale=False)
    tensors = awq_algo.awq_quantize(model, awq_blocks.LayerArch.from_config(hf.config), calib, settings)
    out = Path(_TMP.name) / "tiny-awq"
    awq_model.save_awq_checkpoint(out, model, tensors, src, 32, tie_word_embeddings=False)
    return out


@functools.lru_cache(maxsize=4)
def loaded_for(folder: Path, backend: str):
    """The model at `folder` loaded and prepared for `backend` on the CPU."""
    return load_for(str(folder), resolve("cpu", backend), progress=lambda msg: None)


def engine_on(backend: str, folder: Path | None = None, **cfg) -> Engine:
    cfg = {"page_tokens": PAGE, "num_pages": 12, "inline_tokens": 32, "num_inline_slots": 4,
           "check_invariants_every_step": True, **cfg}
    loaded = loaded_for(folder or tiny_folder(), backend)
    return Engine(loaded, EngineConfig(device="cpu", backend=backend, **cfg))
