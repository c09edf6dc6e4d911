"""Shared by the PagedKVContext tests (test_engine_paged_kv.py, test_recent_window.py,
test_determinism.py): the small shapes, dense causal attention as the reference, writing K/V where
a step's segments put them, and running the context on the Triton kernels."""

import contextvars

import pytest
import torch

from edge_runtime.kernels import hadamard
from edge_runtime.kernels.kv_write import write_kv_ref
from edge_runtime.kernels.quantize import dequantize_int8, quantize_int8

H, HKV, D, LAYERS, P, SLOT = 6, 2, 16, 2, 8, 24


def use_triton_kernels(monkeypatch, **tune) -> None:
    """Every kernels/dispatch.py op on CPU tensors takes its Triton kernel (TRITON_INTERPRET=1),
    as the CUDA back end does on a GPU; `tune` overrides positional attention's TUNE (small spans
    and tiles, so that tiny sequences cross several)."""
    from edge_runtime.kernels import dispatch, kv_write, positional_attention

    if kv_write.triton is None:
        pytest.skip("needs triton")
    monkeypatch.setattr(dispatch, "_TRITON_ON_CPU", contextvars.ContextVar("triton_on_cpu", default=True))
    monkeypatch.setattr(positional_attention, "TUNE", {**positional_attention.TUNE, **tune})


def dense(q, k, v, start):
    """q: [n, H, D] at positions start..; k, v: [L, HKV, D] all tokens -> [n, H, D]."""
    g = H // HKV
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, kk) / D**0.5
    pos = torch.arange(start, start + q.shape[0]).unsqueeze(1)
    scores = scores.masked_fill(torch.arange(k.shape[0]).unsqueeze(0) > pos, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), vv)


def int8_read_back(x):
    """What attention reads back from an int8 store: Hadamard-rotated heads, quantized."""
    return hadamard.rotate(dequantize_int8(*quantize_int8(hadamard.rotate(x))))


def write(storage, store, layer, k, v, slots):
    if storage.rotated:  # as PagedKVContext writes them
        k, v = hadamard.rotate(k), hadamard.rotate(v)
    view = storage.view(store, layer)
    write_kv_ref(k, v, view.k_cache, view.v_cache, view.k_scale, view.v_scale,
                 torch.tensor(slots, dtype=torch.int64))


def locate(step, pos):
    """(store, flat slot) of a tail position: full pages first, then the tail's own blocks."""
    off = pos - step.prefix_len
    if off < len(step.full_pages) * P:
        return "pages", step.full_pages[off // P] * P + off % P
    off -= len(step.full_pages) * P
    block = P if step.tail_kind == "pages" else SLOT
    return step.tail_kind, step.tail_ids[off // block] * block + off % block


def fill_history(storage, steps):
    """Random K/V for every step's positions before its new tokens, written where its segments
    put them (one prefix per distinct prefix, shared) -> {(layer, step index): (k, v) [start, HKV, D]}."""
    prefix_kv, hist = {}, {}
    for layer in range(LAYERS):
        for pages, plen in {(s.prefix_pages, s.prefix_len) for s in steps if s.prefix_len}:
            k, v = torch.randn(plen, HKV, D), torch.randn(plen, HKV, D)
            write(storage, "pages", layer, k, v, [pages[i // P] * P + i % P for i in range(plen)])
            prefix_kv[(layer, pages)] = (k, v)
    for i, step in enumerate(steps):
        cached = step.start - step.prefix_len
        where = [locate(step, pos) for pos in range(step.prefix_len, step.start)]
        for layer in range(LAYERS):
            k, v = torch.randn(cached, HKV, D), torch.randn(cached, HKV, D)
            for store in ("pages", "inline"):
                sel = [j for j, (name, _) in enumerate(where) if name == store]
                if sel:
                    write(storage, store, layer, k[sel], v[sel], [where[j][1] for j in sel])
            pk, pv = prefix_kv.get((layer, step.prefix_pages), (torch.zeros(0, HKV, D),) * 2)
            hist[(layer, i)] = (torch.cat([pk, k]), torch.cat([pv, v]))
    return hist
