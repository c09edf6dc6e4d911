"""edge_runtime/voice/resample.py: polyphase resampling against analytic signals, and the
chunked StreamResampler equal to the whole-signal resampler on random chunkings."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_runtime.voice.resample import (
    MAX_TABLE_ENTRIES, StreamResampler, _PhaseFilters, downmix, resample,
)
from voice_helpers import random_tones


@pytest.mark.parametrize("src_rate", [8000, 11025, 22050, 44100, 48000, 32000])
def test_resample_matches_analytic_signal(src_rate):
    rng = np.random.default_rng(src_rate)
    x, at = random_tones(rng, src_rate, 0.8, max_hz=3400)
    y = resample(x, src_rate, 16000)
    assert len(y) == (len(x) * 16000) // src_rate
    ref = at(np.arange(len(y)) / 16000)
    inner = slice(320, -320)  # the filter sees zeros beyond both ends
    assert np.abs(y[inner] - ref[inner]).max() < 2e-3


@pytest.mark.parametrize("src_rate", [22050, 44100, 48000])
def test_resample_removes_content_above_the_new_nyquist(src_rate):
    t = np.arange(src_rate // 2) / src_rate
    y = resample((0.5 * np.sin(2 * np.pi * 9500 * t)).astype(np.float32), src_rate, 16000)
    assert np.abs(y[320:-320]).max() < 5e-3  # would alias to 6.5 kHz at full amplitude


def test_resample_identity_and_empty():
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert np.array_equal(resample(x, 16000, 16000), x)
    assert len(resample(np.zeros(0, np.float32), 8000, 16000)) == 0


def test_downmix_is_channel_mean():
    x = np.random.default_rng(2).uniform(-1, 1, (777, 3)).astype(np.float32)
    np.testing.assert_allclose(downmix(x), x.mean(axis=1), atol=1e-7)
    assert downmix(x[:, 0]).dtype == np.float32



@pytest.mark.parametrize("src_rate", [44101, 96001, 383999])
def test_rates_with_few_common_factors_build_no_phase_table(src_rate):
    """44,101 -> 16,000 has 16,000 output phases: the rows are computed per block, so memory
    stays bounded and the result is still the analytic signal."""
    filters = _PhaseFilters(16000, src_rate, 16)
    assert filters.table is None
    rng = np.random.default_rng(src_rate)
    x, at = random_tones(rng, src_rate, 0.3, max_hz=3400)
    y = resample(x, src_rate, 16000)
    ref = at(np.arange(len(y)) / 16000)
    assert np.abs(y[320:-320] - ref[320:-320]).max() < 2e-3


def test_computed_rows_equal_the_table():
    filters = _PhaseFilters(160, 441, 16)  # 44.1 kHz -> 16 kHz: a 160-row table
    assert filters.table is not None and filters.table.size <= MAX_TABLE_ENTRIES
    phase = np.array([0, 7, 159, 80])
    np.testing.assert_array_equal(filters.rows(phase), filters.rows(phase, computed=True))


@given(src=st.sampled_from([8000, 11025, 16000, 22050, 44100, 48000, 44101]),
       dst=st.sampled_from([16000, 8000]),
       n=st.integers(0, 6000), chunks=st.lists(st.integers(1, 2500), min_size=1, max_size=12),
       seed=st.integers(0, 2**16))
@settings(max_examples=60, deadline=None)
def test_stream_resampler_equals_whole_signal(src, dst, n, chunks, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    stream = StreamResampler(src, dst)
    outs, i, k = [], 0, 0
    while i < n:
        size = chunks[k % len(chunks)]
        outs.append(stream.push(x[i : i + size]))
        i, k = i + size, k + 1
    outs.append(stream.flush())
    got = np.concatenate(outs) if outs else np.zeros(0, np.float32)
    want = resample(x, src, dst)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6)
