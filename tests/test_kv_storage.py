"""KV storage: layout, CopyOp execution across stores, madvise release really lowers RSS."""

from dataclasses import dataclass

import pytest
import torch

from edge_runtime.engine.kv_storage import KVStorage


@dataclass
class _Copy:
    src_store: str
    src_slot_start: int
    dst_store: str
    dst_slot_start: int
    num_tokens: int


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.parametrize("kv_dtype", ["int8", "fp16", "fp32"])
def test_layout_and_copy(kv_dtype):
    st = KVStorage(num_layers=3, num_kv_heads=2, head_dim=8, num_pages=5, page_tokens=4,
                   num_inline_slots=2, inline_tokens=6, kv_dtype=kv_dtype)
    assert st.pool.k.shape == (5, 3, 4, 2, 8)
    assert st.inline.k.shape == (2, 3, 6, 2, 8)
    assert (st.pool.k_scale is not None) == (kv_dtype == "int8")
    torch.manual_seed(0)
    for t in st.pool.tensors() + st.inline.tensors():
        t.copy_((torch.randn(t.shape) * 50).to(t.dtype))
    # inline slot 1, offsets 1..5 -> pool flat slots 6..10 (spans pages 1 and 2)
    before = [t.clone() for t in st.inline.tensors()]
    st.copy(_Copy("inline", 6 + 1, "pages", 6, 5))
    for src, dst in zip(before, st.pool.tensors()):
        for i in range(5):
            page, off = divmod(6 + i, 4)
            assert torch.equal(dst[page, :, off], src[1, :, 1 + i])
    view = st.view("pages", 2)
    assert view.k_cache.shape == (5, 4, 2, 8) and view.k_cache.data_ptr() == st.pool.k[:, 2].data_ptr()


def test_release_pages_lowers_rss_and_regrow_restores():
    st = KVStorage(num_layers=2, num_kv_heads=4, head_dim=64, num_pages=64, page_tokens=512,
                   kv_dtype="int8")
    pool_bytes = st.pool.nbytes()  # ~ 64 * 2 * 512 * 4 * (64 + 4) = 17.8 MB
    st.pool.k.fill_(3)
    rss0 = _rss_bytes()
    released = st.release_pages(8, 56)
    rss1 = _rss_bytes()
    assert released > 0.7 * pool_bytes * 48 / 64
    assert rss0 - rss1 > 0.5 * released, (rss0, rss1, released)
    assert int(st.pool.k[20].abs().sum()) == 0  # released pages read back as zeros
    assert int(st.pool.k[0, 0, 0, 0, 0]) == 3  # neighbours untouched
    st.regrow_pages(8, 56)
    assert _rss_bytes() - rss1 > 0.5 * released
    assert not st.released
