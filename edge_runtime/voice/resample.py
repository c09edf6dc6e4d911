"""Sample-rate conversion and downmix to the voice loop's 16 kHz mono.

`resample` is a band-limited polyphase resampler (Hann-windowed sinc, `half_taps` zero crossings
each side of the low-pass at min(src, dst) / 2). `StreamResampler` computes exactly the same
output for a signal that arrives in chunks (a pipe): output sample n needs input samples up to
base(n) + half, so it waits for those, keeps the last 2 * half + 1 inputs, and pads the end with
zeros only at `flush()`. Invariant: concatenating push() outputs and flush() equals resample() of
the whole signal (tested on random chunkings).
"""

from __future__ import annotations

import math

import numpy as np


def downmix(samples: np.ndarray) -> np.ndarray:
    """[n] or [n, channels] -> float32 [n] (mean of the channels)."""
    if samples.ndim == 1:
        return samples.astype(np.float32, copy=False)
    assert samples.ndim == 2, samples.shape
    return samples.mean(axis=1, dtype=np.float64).astype(np.float32)


MAX_TABLE_ENTRIES = 1 << 20  # 8 MB of float64: above it, filter rows are computed per block


def _filter_rows(phase: np.ndarray, up: int, cutoff: float, half: int) -> np.ndarray:
    """Windowed-sinc low-pass rows for output phases `phase` (ints in [0, up)): [len, 2*half+1]."""
    j = np.arange(-half, half + 1, dtype=np.float64)  # tap offsets around the base sample
    u = phase.astype(np.float64)[:, None] / up - j[None, :]  # output instant -> tap, in inputs
    window = np.where(np.abs(u) <= half + 1, 0.5 + 0.5 * np.cos(np.pi * u / (half + 1)), 0.0)
    return cutoff * np.sinc(cutoff * u) * window


class _PhaseFilters:
    """Rows by output phase: a table of all `up` rows when small (rates with many common
    factors, e.g. 44,100 -> 16,000: 160 rows), else computed for each block's phases (44,101 ->
    16,000 has 16,000 phases), so any accepted rate costs O(outputs x taps) and no big table.
    Both paths evaluate the same expression, so they give the same numbers."""

    def __init__(self, up: int, down: int, half_taps: int):
        self.up = up
        self.cutoff = min(1.0, up / down)  # fraction of the input Nyquist kept
        self.half = int(math.ceil(half_taps / self.cutoff))
        fits = up * (2 * self.half + 1) <= MAX_TABLE_ENTRIES
        self.table = None
        if fits:
            self.table = self.rows(np.arange(up), computed=True)  # [up, 2 * half + 1]

    def rows(self, phase: np.ndarray, computed: bool = False) -> np.ndarray:
        if self.table is not None and not computed:
            return self.table[phase]
        return _filter_rows(phase, self.up, self.cutoff, self.half)


def resample(x: np.ndarray, src_rate: int, dst_rate: int, half_taps: int = 16) -> np.ndarray:
    """Band-limited polyphase resampling of float32 [n] from src_rate to dst_rate (Hann-windowed
    sinc, `half_taps` zero crossings each side). Output length is floor(n * dst / src)."""
    assert src_rate > 0 and dst_rate > 0, (src_rate, dst_rate)
    if src_rate == dst_rate or len(x) == 0:
        return x.astype(np.float32, copy=False)
    g = math.gcd(src_rate, dst_rate)
    up, down = dst_rate // g, src_rate // g
    filters = _PhaseFilters(up, down, half_taps)
    half = filters.half
    padded = np.concatenate([np.zeros(half), x.astype(np.float64), np.zeros(half + 1)])
    out_len = (len(x) * up) // down
    out = np.empty(out_len, dtype=np.float32)
    taps = np.arange(2 * half + 1)
    block = max(64, min(8192, MAX_TABLE_ENTRIES // len(taps)))  # bounds the [block, K] gather
    for start in range(0, out_len, block):
        n = np.arange(start, min(out_len, start + block), dtype=np.int64)
        base, phase = np.divmod(n * down, up)
        window = padded[base[:, None] + taps[None, :]]  # [block, K]; base+half is x[base]
        out[start : start + len(n)] = np.einsum("bk,bk->b", window, filters.rows(phase))
    return out


class StreamResampler:
    """Chunked `resample`: push(chunk) -> the output samples that are complete so far."""

    def __init__(self, src_rate: int, dst_rate: int, half_taps: int = 16):
        assert src_rate > 0 and dst_rate > 0, (src_rate, dst_rate)
        g = math.gcd(src_rate, dst_rate)
        self.up, self.down = dst_rate // g, src_rate // g
        self.identity = src_rate == dst_rate
        self.filters = _PhaseFilters(self.up, self.down, half_taps)
        self.half = self.filters.half
        self._buf = np.zeros(self.half)  # float64; _buf[0] is input index self._offset - half
        self._offset = 0  # absolute input index of _buf[half]
        self._num_in = 0  # input samples pushed
        self._num_out = 0  # output samples produced

    def push(self, x: np.ndarray) -> np.ndarray:
        if self.identity:
            return x.astype(np.float32, copy=False)
        self._buf = np.concatenate([self._buf, x.astype(np.float64)])
        self._num_in += len(x)
        return self._produce(self._num_in - self.half - 1)  # last base with all its taps

    def flush(self) -> np.ndarray:
        if self.identity:
            return np.zeros(0, np.float32)
        self._buf = np.concatenate([self._buf, np.zeros(self.half + 1)])
        end = (self._num_in * self.up) // self.down  # resample()'s output length
        return self._produce(None, end)

    def _produce(self, max_base: int | None, end: int | None = None) -> np.ndarray:
        if end is None:  # outputs whose base index is <= max_base
            end = 0 if max_base < 0 else (max_base * self.up) // self.down + 1
        n = np.arange(self._num_out, max(self._num_out, end), dtype=np.int64)
        base, phase = np.divmod(n * self.down, self.up)
        rel = base - self._offset  # index into _buf of x[base] minus half
        taps = np.arange(2 * self.half + 1)
        out = np.einsum("bk,bk->b", self._buf[rel[:, None] + taps[None, :]],
                        self.filters.rows(phase)).astype(np.float32)
        self._num_out += len(n)
        next_base = (self._num_out * self.down) // self.up  # drop inputs no output needs again
        drop = max(0, next_base - self._offset)
        self._buf, self._offset = self._buf[drop:], self._offset + drop
        return out
