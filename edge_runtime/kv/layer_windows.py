"""What a local (sliding-window) layer reads: the read rule and its cuts of a step's indexes.

The rule (transformers' sliding-window mask): in a layer with window W, a query at position i
reads the keys j with i - W < j <= i; a global layer (window None) reads every j <= i. The model
config lists a window per layer (`ModelConfig.layer_windows`, Gemma 3: five local layers of 512
per global one); the KV storage carries the same list (`KVStorage.layer_windows`), and each back
end's step context reads it per layer:

- CPU (kv/flat_index.py): a gather row lists its stored keys in position order (pool, then arena,
  then the exact recent block); a local layer's row drops its first max(0, i - W + 1) keys
  (`cut_gather`), and a prefill row's SDPA mask gains -inf where j <= i - W (`window_bias`);
- CUDA (kv/paged_context.py): the position index gets `key_start` = max(0, i - W + 1) per token,
  and kernels/positional_attention*.py skip the keys below it.

The recent-key window's exact block (kv/recent_window.py) holds the keys [i - i % Wr, i], all
inside a local window when Wr <= W, so it is never cut (`check_windows` refuses Wr > W).

The rule depends on (i, j) alone, so a local layer reads the same keys whether its prefix came
from the prefix cache, another chunk or another step: the determinism of docs/engine.md holds.
What a local layer *stores* is the pool's layer groups (kv/layer_groups.py): the slices of its
group's pages behind every reader's window go back to the pool.
"""

from __future__ import annotations

import numpy as np
import torch

from edge_runtime.errors import ConfigError

_CUT_STORES = ("pages", "inline")  # the stores whose keys lie before the exact block, in order


def smallest_window(layer_windows) -> int | None:
    """The narrowest local window of a model, None when every layer is global."""
    windows = [w for w in (layer_windows or ()) if w is not None]
    return min(windows) if windows else None


def check_windows(layer_windows, recent_window_tokens: int) -> None:
    """ConfigError when the recent-key window's exact block could reach past a local window."""
    narrowest = smallest_window(layer_windows)
    if narrowest is not None and recent_window_tokens > narrowest:
        raise ConfigError(f"recent_window ({recent_window_tokens} tokens) is wider than the model's "
                          f"sliding window ({narrowest}); set recent_window to {narrowest} or less")


def key_start(positions: torch.Tensor, window: int) -> torch.Tensor:
    """The first key position a query at each of `positions` reads in a local layer."""
    return (positions - window + 1).clamp(min=0)


def cut_gather(gather: list, gather_lens: list, row_positions: np.ndarray, window: int):
    """A step's gather (per store: (name, rows long [R, Hkv, L_s]), valid lengths int32 [R]),
    rows at query positions `row_positions` [R] -> the same for a local layer: each row's first
    max(0, i - W + 1) keys dropped, taken from the pool's keys first, then the arena's."""
    skip = np.maximum(row_positions - window + 1, 0)
    out, out_lens = [], []
    for (store, rows), lens in zip(gather, gather_lens):
        n = lens.numpy().astype(np.int64)
        if store in _CUT_STORES:
            cut = np.minimum(skip, n)
            skip = skip - cut
            n = n - cut
            width = int(n.max(initial=0))
            if width == 0:
                continue  # no row keeps a key of this store
            cols = np.minimum(cut[:, None] + np.arange(width), rows.shape[2] - 1)  # [R, width]
            cols = np.broadcast_to(cols[:, None, :], (rows.shape[0], rows.shape[1], width))
            rows = torch.from_numpy(np.take_along_axis(rows.numpy(), cols, axis=2))
        out.append((store, rows))
        out_lens.append(torch.from_numpy(n.astype(np.int32)))
    assert not skip.any(), f"a local window reaches into the exact block: skip {skip.tolist()}"
    return out, out_lens


def mask_bias(gather: list, gather_lens: list) -> torch.Tensor:
    """float32 [R, 1, 1, sum L_s]: 0 on a row's valid entries, -inf on its padding."""
    valid = torch.cat([torch.arange(rows.shape[2])[None, :] < lens[:, None]
                       for (_, rows), lens in zip(gather, gather_lens)], dim=1)
    return torch.zeros(valid.shape).masked_fill_(~valid, float("-inf"))[:, None, None, :]


def window_bias(bias: torch.Tensor, query: torch.Tensor, keys: torch.Tensor, window: int) -> torch.Tensor:
    """A prefill row's mask [n, L] (queries at positions `query` [n], columns at `keys` [L]) with
    the keys behind each query's window masked too."""
    behind = keys[None, :] <= query[:, None] - window
    return bias.masked_fill(behind, float("-inf"))
