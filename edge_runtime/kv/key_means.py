"""The mean key of each layer and kv head, measured once when an int8-KV engine starts.

Why (docs/engine.md, "Centred keys"): a model's rotated keys share a large common component (the
mean key is 63-83% of a key's norm for SmolLM2-135M), so an int8 row of `k - m` has finer steps
than one of `k`. A fixed vector subtracted from keys is exact for attention once readers add `q.m`
back, so int8 stores keep each key centred where that lowers its absmax (kernels/quantize.py).

What: the model runs in its own precision (fp32 activations on CPU, AWQ weights as loaded), as
one prefill without a cache, over a fixed calibration text shipped with the package
(data/key_calibration.txt: chat turns in the ChatML template, prose and code; not any
benchmark's text), and each layer's roped keys are averaged over positions 1..
(position 0, the attention sink, is far from the others and left out), then rotated into the
stores' Hadamard basis when the store is rotated. A model without a tokenizer (tests' random
models) is run on a fixed pseudo-random token sequence instead. The result is a pure function of
the weights, so every run of a model centres the same keys.

Cost: one prefill of ~800 tokens, ~4.5 s on the 2-core CI machine (a fraction of a second on a
GPU), so the result is cached on disk, $XDG_CACHE_HOME/edge-runtime/key-means/<key>.pt, keyed by
the model folder, its files' sizes and modification times, the model's dtype, the calibration
text and KEY_MEANS_VERSION; the newest CACHE_ENTRIES are kept. A cache that cannot be read or
written is passed over (the means are measured again).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import weakref
from importlib import resources
from pathlib import Path

import torch

from edge_runtime.kernels import hadamard
from edge_runtime.model.contiguous_kv import causal_attention
from edge_runtime.paths import cache_dir

KEY_MEANS_VERSION = 1  # bump when the measurement changes
CACHE_ENTRIES = 16
CALIBRATION_FILE = "key_calibration.txt"
MAX_CALIBRATION_TOKENS = 1024
_RANDOM_TOKENS = 256
_RANDOM_SEED = 20261130
# model object -> its unrotated means: engines of one model in a process measure once; the entry
# goes with the model
_means_by_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _KeyRecorder:
    """A KVContext for one sequence's prefill that keeps each layer's keys (and attends causally)."""

    def __init__(self, sm_scale: float) -> None:
        self.sm_scale = sm_scale
        self.keys: dict[int, torch.Tensor] = {}

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.keys[layer] = k.detach().float()
        return causal_attention(q, k, v, 0, self.sm_scale)


def calibration_ids(tokenizer, vocab_size: int, max_tokens: int = MAX_CALIBRATION_TOKENS) -> list[int]:
    """The tokens the means are measured on: the shipped text, or fixed random ids without a
    tokenizer; at most `max_tokens` (the model's context: the prefill cannot be longer)."""
    max_tokens = min(max_tokens, MAX_CALIBRATION_TOKENS)
    if tokenizer is None:
        gen = torch.Generator().manual_seed(_RANDOM_SEED)
        return torch.randint(0, vocab_size, (_RANDOM_TOKENS,), generator=gen).tolist()[:max_tokens]
    text = _calibration_text()
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return [i for i in ids if 0 <= i < vocab_size][:max_tokens]


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


def _calibration_text() -> str:
    return resources.files("edge_runtime").joinpath("data", CALIBRATION_FILE).read_text(encoding="utf-8")


def key_means_for(loaded_model, rotated: bool) -> torch.Tensor:
    """measure_key_means on the loaded model's calibration ids, once per model object (engines of
    one model in a process share it) and from the disk cache when it has them."""
    model = loaded_model.model
    means = _means_by_model.get(model)
    if means is None:
        path = _cache_file(loaded_model)
        means = _read_cached(path, model.config)
        if means is None:
            ids = calibration_ids(loaded_model.tokenizer, model.config.vocab_size,
                                  model.config.max_position_embeddings)
            means = measure_key_means(model, ids, rotated=False)
            _write_cached(path, means)
        _means_by_model[model] = means
    return (hadamard.rotate(means) if rotated else means).float().contiguous()


def _cache_file(loaded_model) -> Path | None:
    """The cache entry of this model's means, or None where the model has no folder to key on."""
    folder = getattr(loaded_model, "path", None)
    try:
        files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                       for f in Path(folder).iterdir() if f.is_file())
    except (OSError, TypeError):
        return None
    key = json.dumps({"version": KEY_MEANS_VERSION, "folder": str(Path(folder).resolve()),
                      "files": files, "dtype": str(loaded_model.model.dtype),
                      "tokenizer": loaded_model.tokenizer is not None,
                      "text": hashlib.sha256(_calibration_text().encode()).hexdigest()})
    return cache_dir("key-means") / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"


def _read_cached(path: Path | None, cfg) -> torch.Tensor | None:
    if path is None or not path.is_file():
        return None
    try:
        means = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - a damaged entry is measured again, whatever the damage
        return None
    shape = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
    ok = isinstance(means, torch.Tensor) and tuple(means.shape) == shape and bool(torch.isfinite(means).all())
    return means.float() if ok else None


def _write_cached(path: Path | None, means: torch.Tensor) -> None:
    """Atomically, then keep the newest CACHE_ENTRIES; an unwritable cache is passed over."""
    if path is None:
        return
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            torch.save(means.detach().cpu().float().clone(), f)
        os.replace(tmp, path)
        tmp = None
        entries = sorted(path.parent.glob("*.pt"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in entries[CACHE_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
