"""Shared helpers of the voice tests (tests/test_voice*.py, test_asr.py, test_vad.py)."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="needs espeak-ng (apt-get install espeak-ng)")


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """The default model's real tokenizer (converted once into the cache by the model loader)."""
    from edge_runtime.model.loader import DEFAULT_MODEL, load_tokenizer, resolve_model_folder

    return load_tokenizer(resolve_model_folder(DEFAULT_MODEL, progress=None))


def random_tones(rng, rate: int, seconds: float, max_hz: float, k: int = 6):
    """A random sum of k sinusoids below max_hz, and a function evaluating it at any times."""
    freqs = rng.uniform(40, max_hz, k)
    phases = rng.uniform(0, 2 * np.pi, k)
    amps = rng.uniform(0.03, 0.15, k)

    def at(t):
        return sum(a * np.sin(2 * np.pi * f * t + p) for a, f, p in zip(amps, freqs, phases))

    return at(np.arange(int(rate * seconds)) / rate).astype(np.float32), at
