"""An engine's KV memory: the tensors (KVStorage) and their bookkeeping (KVManager), sized from
its EngineConfig and the model, both over the same pages, inline slots and recent-key windows."""

from __future__ import annotations

from edge_runtime.kv.layer_groups import LayerGroups
from edge_runtime.kv.manager import KVManager
from edge_runtime.kv import layer_windows, recent_window
from edge_runtime.kv.key_means import key_means_for
from edge_runtime.kv.storage import KVStorage
from edge_runtime.kv.pool_resize import chunk_pages


def build_kv(loaded_model, cfg, num_pages: int, pool_in_chunks: bool) -> tuple[KVStorage, KVManager]:
    """(storage, manager) for `num_pages` pages of `cfg.page_tokens`; `pool_in_chunks`: the back
    end allocates the pool one chunk at a time (CUDA: a retired chunk is handed back). A model
    with layer groups (kv/layer_groups.py) gets a pool of num_pages x groups slices: the same
    bytes, a page's worth per group."""
    mc = loaded_model.config
    slots = cfg.num_inline_slots if cfg.enable_inline else 0
    # an inline slot bigger than a page would never be chosen over a page: cap it
    inline_tokens = min(cfg.inline_tokens, cfg.page_tokens)
    windows, window_tokens = recent_window.sizes(cfg)
    if windows:
        layer_windows.check_windows(mc.layer_windows, window_tokens)
    groups = LayerGroups.of(mc.layer_windows)
    slices = num_pages * (1 if groups is None else groups.num_groups)
    chunked = chunk_pages(slices) if pool_in_chunks else None
    storage = KVStorage(mc.num_layers, mc.num_kv_heads, mc.head_dim, slices, cfg.page_tokens,
                        slots, inline_tokens, cfg.kv_dtype, cfg.device, windows, window_tokens,
                        pool_chunk_pages=chunked, layer_windows=mc.layer_windows)
    if cfg.kv_dtype == "int8" and cfg.centred_keys:  # before the first write (kv_storage.py)
        storage.set_key_means(key_means_for(loaded_model, storage.rotated).to(cfg.device))
    split = {} if groups is None else dict(global_slices=groups.num_global_groups,
                                           local_slices=groups.num_local_groups,
                                           local_window=groups.window)
    kv = KVManager(slices, cfg.page_tokens, slots, inline_tokens,
                   enable_prefix_cache=cfg.enable_prefix_cache, enable_inline=cfg.enable_inline,
                   num_windows=windows, window_tokens=window_tokens, **split)
    if groups is not None:
        storage.bind_group_map(kv.pool)
    return storage, kv
