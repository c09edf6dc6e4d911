"""Both back ends' KV contexts (FlatKVContext: CPU, PagedKVContext: CUDA) vs dense causal attention on random data: shared prefix (partial last page),
private tail pages, inline tail, full tail pages followed by inline slots, prefill with cached
prefix + decode mixed in one step, GQA."""

import pytest
import torch

from edge_runtime.kv.storage import KVStorage
from edge_runtime.kv.flat_context import FlatKVContext
from edge_runtime.kv.paged_context import PagedKVContext, SeqStep
from paged_kv_helpers import D, H, HKV, LAYERS, P, SLOT, dense as _dense, int8_read_back
from paged_kv_helpers import fill_history


def _fake(x, kv_dtype):
    """What attention reads back: int8 stores hold Hadamard-rotated heads, quantized."""
    return int8_read_back(x) if kv_dtype == "int8" else x


# (prefix pages, prefix_len, tail kind, tail ids, cached tail tokens, new tokens[, full pages])
MIXED = [
    ((3, 5), 13, "pages", (9, 2, 11), 4, 12),  # prefill on top of prefix + some tail
    ((), 0, "inline", (1,), 0, 7),  # cold short prompt in an inline slot
    ((3, 5), 13, "inline", (0,), 10, 1),  # decode: prefix + inline tail
    ((7,), 8, "pages", (4, 6), 9, 1),  # decode: full-page prefix + tail over two pages
    ((), 0, "pages", (12, 13, 14), 0, 20),  # cold long prefill spanning pages
    ((7,), 8, "inline", (3, 4), 28, 6, (10,)),  # prefill: a full tail page, then two slots
]
DECODE_ONLY = [
    ((3, 5), 13, "inline", (0,), 10, 1),  # prefix + inline tail
    ((), 0, "inline", (2,), 5, 1),  # inline tail only
    ((7,), 8, "pages", (4, 6), 9, 1),  # full-page prefix + tail over two pages
    ((3, 5), 13, "pages", (9,), 0, 1),  # the first token after a shared partial prefix
    ((), 0, "pages", (12, 13), 12, 1),  # pages only, no prefix
    ((3, 5), 13, "inline", (4, 5), 46, 1, (10, 15)),  # prefix, two full tail pages, two slots
]


CONTEXTS = {"flat-cpu": FlatKVContext, "per-segment": PagedKVContext}


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
@pytest.mark.parametrize("flat", [True, False], ids=["flat-cpu", "per-segment"])
@pytest.mark.parametrize("specs", [MIXED, DECODE_ONLY], ids=["mixed", "decode-only"])
def test_paged_context_matches_dense(kv_dtype, flat, specs):
    torch.manual_seed(0)
    st = KVStorage(LAYERS, HKV, D, num_pages=16, page_tokens=P, num_inline_slots=6,
                   inline_tokens=SLOT, kv_dtype=kv_dtype)
    steps = [SeqStep(pages, plen, kind, ids, plen + cached, new, *full)
             for pages, plen, kind, ids, cached, new, *full in specs]
    hist = fill_history(st, steps)  # (layer, seq) -> dense k, v of all tokens so far
    ctx = (FlatKVContext if flat else PagedKVContext)(st, steps, sm_scale=D**-0.5)
    total = sum(s.num_new for s in steps)
    for layer in range(LAYERS):
        q, k, v = torch.randn(total, H, D), torch.randn(total, HKV, D), torch.randn(total, HKV, D)
        out = ctx.attend(layer, q, k, v)
        at = 0
        for i, s in enumerate(steps):
            hk, hv = hist[(layer, i)]
            kk = _fake(torch.cat([hk, k[at:at + s.num_new]]), kv_dtype)
            vv = _fake(torch.cat([hv, v[at:at + s.num_new]]), kv_dtype)
            ref = _dense(q[at:at + s.num_new], kk, vv, s.start)
            torch.testing.assert_close(out[at:at + s.num_new], ref, atol=2e-5, rtol=1e-4)
            at += s.num_new


def test_unreserved_tail_is_refused():
    st = KVStorage(LAYERS, HKV, D, num_pages=4, page_tokens=P, num_inline_slots=2,
                   inline_tokens=SLOT, kv_dtype="fp32")
    for context in CONTEXTS.values():
        with pytest.raises(AssertionError):
            context(st, [SeqStep((), 0, "pages", (1,), 0, P + 1)], sm_scale=1.0)
        with pytest.raises(AssertionError):  # an inline tail: one full page, then one slot
            context(st, [SeqStep((), 0, "inline", (0,), 0, P + SLOT + 1, (2,))], sm_scale=1.0)


@pytest.mark.parametrize("specs", [MIXED, DECODE_ONLY], ids=["mixed", "decode-only"])
def test_flat_and_per_segment_slot_mappings_agree(specs):
    """The CPU flat index (numpy) and the per-segment builder (torch) place every new token in the
    same store slot."""
    st = KVStorage(LAYERS, HKV, D, num_pages=16, page_tokens=P, num_inline_slots=6,
                   inline_tokens=SLOT, kv_dtype="int8")
    steps = [SeqStep(pages, plen, kind, ids, plen + cached, new, *full)
             for pages, plen, kind, ids, cached, new, *full in specs]
    flat = FlatKVContext(st, steps, sm_scale=1.0).slot_mapping
    per_segment = PagedKVContext(st, steps, sm_scale=1.0).slot_mapping
    assert flat.keys() == per_segment.keys()
    for store in flat:
        assert flat[store].tolist() == per_segment[store].tolist(), store


def test_new_token_inside_the_prefix_is_refused():
    st = KVStorage(LAYERS, HKV, D, num_pages=4, page_tokens=P, kv_dtype="int8")
    for context in CONTEXTS.values():
        with pytest.raises(AssertionError):
            context(st, [SeqStep((1,), 5, "pages", (2,), 3, 1)], sm_scale=1.0)
