"""kv/layer_windows.py: a local layer's cut of a step's gather rows and prefill masks, on
hand-built rows (the engine-level checks against transformers are tests/test_engine_families.py)."""

import numpy as np
import pytest
import torch

from edge_runtime.errors import ConfigError
from edge_runtime.kv import layer_windows


def _row_keys(gather, lens, r):
    """Row r's valid entries per store (head 0) -> {store: list of rows}."""
    return {store: rows[r, 0, : int(n[r])].tolist() for (store, rows), n in zip(gather, lens)}


def test_cut_takes_the_pool_first_then_the_arena_and_never_the_exact_block():
    # three rows, keys numbered by position (pool rows 100 + p, arena rows 200 + p, window 300 + p):
    # row 0 at position 9: pool 0..7, arena 8..9; row 1 at position 3: pool 0..3;
    # row 2 at position 13: pool 0..7, arena 8..11, exact block 12..13
    pool = np.zeros((3, 2, 8), dtype=np.int64)
    pool[0, :, :8] = 100 + np.arange(8)
    pool[1, :, :4] = 100 + np.arange(4)
    pool[2, :, :8] = 100 + np.arange(8)
    arena = np.zeros((3, 2, 4), dtype=np.int64)
    arena[0, :, :2] = 200 + np.arange(8, 10)
    arena[2, :, :4] = 200 + np.arange(8, 12)
    window = np.zeros((3, 2, 2), dtype=np.int64)
    window[2, :, :2] = 300 + np.arange(12, 14)
    gather = [(s, torch.from_numpy(x)) for s, x in (("pages", pool), ("inline", arena), ("window", window))]
    lens = [torch.tensor(n, dtype=torch.int32) for n in ([8, 4, 8], [2, 0, 4], [0, 0, 2])]
    positions = np.array([9, 3, 13])
    cut, cut_lens = layer_windows.cut_gather(gather, lens, positions, 4)  # keys i - 4 < j <= i
    assert _row_keys(cut, cut_lens, 0) == {"inline": [208, 209], "pages": [106, 107], "window": []}
    assert _row_keys(cut, cut_lens, 1) == {"pages": [100, 101, 102, 103], "inline": [], "window": []}
    assert _row_keys(cut, cut_lens, 2) == {"pages": [], "inline": [210, 211], "window": [312, 313]}
    assert [s for s, _ in cut] == ["pages", "inline", "window"]
    # every head of a row is cut alike
    assert cut[0][1][0, 1, :2].tolist() == [106, 107]
    cut2, lens2 = layer_windows.cut_gather(gather, lens, positions, 2)
    assert _row_keys(cut2, lens2, 0) == {"pages": [], "inline": [208, 209], "window": []}
    assert _row_keys(cut2, lens2, 1) == {"pages": [102, 103], "inline": [], "window": []}
    # row 2 alone with window 2 reads only its exact block: pool and arena leave the gather
    alone = [(s, rows[2:]) for s, rows in gather], [n[2:] for n in lens]
    cut3, lens3 = layer_windows.cut_gather(*alone, positions[2:], 2)
    assert [s for s, _ in cut3] == ["window"] and lens3[0].tolist() == [2]
    bias = layer_windows.mask_bias(cut, cut_lens)
    assert bias.shape == (3, 1, 1, sum(rows.shape[2] for _, rows in cut))
    assert int(torch.isfinite(bias[2]).sum()) == 4


def test_a_window_reaching_into_the_exact_block_is_an_error():
    rows = torch.zeros(1, 1, 3, dtype=torch.int64)
    gather = [("pages", rows), ("window", rows)]
    lens = [torch.tensor([1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)]
    with pytest.raises(AssertionError, match="reaches into the exact block"):
        layer_windows.cut_gather(gather, lens, np.array([3]), 2)


def test_window_bias_masks_keys_behind_each_query():
    bias = torch.zeros(3, 6).masked_fill_(torch.arange(6)[None, :] > torch.arange(3, 6)[:, None],
                                          float("-inf"))  # causal: queries at 3, 4, 5
    out = layer_windows.window_bias(bias, torch.arange(3, 6), torch.arange(6), 3)
    visible = torch.isfinite(out)
    assert visible.tolist() == [[False, True, True, True, False, False],
                                [False, False, True, True, True, False],
                                [False, False, False, True, True, True]]


def test_key_start_and_the_recent_window_check():
    assert layer_windows.key_start(torch.tensor([0, 3, 10]), 4).tolist() == [0, 0, 7]
    assert layer_windows.smallest_window((None, 512, 256, None)) == 256
    assert layer_windows.smallest_window(None) is None
    layer_windows.check_windows((None, 32), 16)
    layer_windows.check_windows(None, 64)
    with pytest.raises(ConfigError, match="recent_window \\(64 tokens\\) is wider .* window \\(32\\)"):
        layer_windows.check_windows((32, None), 64)
