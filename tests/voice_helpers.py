"""Shared helpers of the voice tests (tests/test_voice*.py, test_asr.py, test_vad.py)."""

from __future__ import annotations

import functools
import shutil

import pytest

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="needs espeak-ng (apt-get install espeak-ng)")


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer():
    """The default model's real tokenizer (converted once into the cache by the model loader)."""
    from edge_runtime.model.loader import DEFAULT_MODEL, load_tokenizer, resolve_model_folder

    return load_tokenizer(resolve_model_folder(DEFAULT_MODEL, progress=None))
