"""Shared helpers for the engine tests: a tiny random Llama (ours + transformers'), SmolLM2 through
tests/model_helpers.py, transformers references (greedy, beam), and prompt builders."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

from model_helpers import random_ids, save_random_model, smollm2, smollm2_hf, tiny_hf_config

from lab.greedy import greedy_tokens  # noqa: F401 - tools/ is on sys.path through model_helpers

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.backend import prepare_model, select_backend
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.kernels import cpu_threads
from edge_runtime.model.loader import load_model

TINY_VOCAB = 49152  # SmolLM2's tokenizer size, so text prompts work on the tiny model too
# On a loaded 2-core machine torch's 2-thread pool spins against other processes: a 64x64 linear
# took 10 ms with 2 threads vs 12 us with 1 (measured under load average 11). One thread keeps
# these tests' run time stable.
cpu_threads.configure(pinned=1)  # the CPU back end re-applies it before every step
_TMP = tempfile.TemporaryDirectory(prefix="edge-engine-tests-")


@functools.lru_cache(maxsize=1)
def tiny_folder() -> Path:
    return save_random_model(tiny_hf_config("llama", num_hidden_layers=3, vocab_size=TINY_VOCAB), Path(_TMP.name) / "tiny")


@functools.lru_cache(maxsize=1)
def tiny():
    return load_model(str(tiny_folder()))


@functools.lru_cache(maxsize=1)
def tinier():
    """tiny() with 2 layers instead of 3 (the second's K/V still come from the first's attention):
    for the Triton interpreter, which runs every kernel once per layer."""
    config = tiny_hf_config("llama", num_hidden_layers=2,
                            vocab_size=TINY_VOCAB)
    return load_model(str(save_random_model(config, Path(_TMP.name) / "tinier")))


@functools.lru_cache(maxsize=1)
def tiny_hf():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_folder()), dtype=torch.float32).eval()


def tiny_prompts(lengths, seed: int = 0) -> list[list[int]]:
    return [random_ids(n, TINY_VOCAB, seed + i) for i, n in enumerate(lengths)]


def hf_greedy(hf_model, prompt: list[int], max_new: int, eos=None) -> list[int]:
    """transformers' greedy continuation (no eos stop unless eos is given)."""
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                dtype=torch.long), max_new_tokens=max_new, do_sample=False,
                                eos_token_id=eos, pad_token_id=0, temperature=None, top_p=None,
                                top_k=None, repetition_penalty=None)
    gen = out[0, len(prompt):].tolist()
    if eos is not None and eos in gen:
        gen = gen[: gen.index(eos) + 1]
    return gen


def hf_beam(hf_model, prompt: list[int], k: int, max_new: int, eos) -> list[int]:
    """transformers' best beam (num_beams=k, do_sample=False, defaults), padding stripped."""
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                dtype=torch.long), max_new_tokens=max_new, do_sample=False,
                                num_beams=k, eos_token_id=eos, pad_token_id=eos,
                                length_penalty=1.0, early_stopping=False, temperature=None,
                                top_p=None, top_k=None, repetition_penalty=None)
    gen = out[0, len(prompt):].tolist()
    if eos in gen:
        gen = gen[: gen.index(eos) + 1]
    return gen


def engine_for(loaded, **cfg) -> Engine:
    """An Engine over `loaded`, prepared for the config's back end first (the CPU one by default)."""
    cfg.setdefault("check_invariants_every_step", True)
    config = EngineConfig(**cfg)
    prepare_model(loaded.model, select_backend(config.backend, config.device))
    return Engine(loaded, config)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, **kw)


def greedy_one_by_one(loaded, prompts: list[list[int]], max_tokens: int, num_pages: int) -> list[list[int]]:
    """Each prompt's greedy tokens through an Engine (fp32 KV), one request after another."""
    engine = engine_for(loaded, kv_dtype="fp32", num_pages=num_pages, check_invariants_every_step=False)
    return [greedy_tokens(engine, ids, max_tokens) for ids in prompts]


__all__ = ["smollm2", "smollm2_hf", "random_ids"]
