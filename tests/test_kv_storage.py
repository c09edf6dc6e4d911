"""KV storage: layout, CopyOp execution across stores, madvise release really lowers RSS; the
CUDA back end's chunked pool: views and offsets name every chunk, a released chunk's storages are
freed (and on CUDA the caching allocator's statistics show it), regrow reallocates it."""

import gc
from dataclasses import dataclass

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from edge_runtime.kv.storage import KVStorage


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


def _chunked(device, num_pages=7, page_tokens=4, **kw) -> KVStorage:
    """A CUDA back end's storage: the pool in chunks of 2 pages (2, 2, 2, 1)."""
    return KVStorage(num_layers=3, num_kv_heads=2, head_dim=8, num_pages=num_pages,
                     page_tokens=page_tokens, kv_dtype="int8", device=device, pool_chunk_pages=2, **kw)


def test_chunked_pool_copies_across_chunks_and_views_name_every_chunk():
    st = _chunked("cpu", num_inline_slots=2, inline_tokens=6)
    assert [c.k.shape[0] for c in st.pool.chunks] == [2, 2, 2, 1]
    assert st.pool.nbytes() == 7 * 3 * 4 * 2 * (2 * 8 + 2 * 2)
    torch.manual_seed(1)
    for t in st.inline.tensors():
        t.copy_((torch.randn(t.shape) * 50).to(t.dtype))
    # inline slot 1, offsets 1..5 -> pool flat slots 6..10: pages 1 and 2, chunks 0 and 1
    st.copy(_Copy("inline", 6 + 1, "pages", 6, 5))
    back = st.pool.read(6, 5)
    for src, dst in zip(st.inline.tensors(), back):
        assert torch.equal(dst, src[1, :, 1:6].transpose(0, 1))  # [tokens, layers, ...]
    view = st.view("pages", 2)
    assert view.k_cache.data_ptr() == st.pool.chunks[0].k[:, 2].data_ptr()
    assert [c.data_ptr() for c in view.chunks.k] == [c.k[:, 2].data_ptr() for c in st.pool.chunks]
    offsets = view.chunks.offsets.tolist()
    for c, chunk in enumerate(st.pool.chunks):  # element offsets of each chunk from chunk 0's
        for col, t in enumerate((chunk.k, chunk.k_scale, chunk.v, chunk.v_scale)):
            base = (st.pool.chunks[0].k, st.pool.chunks[0].k_scale, st.pool.chunks[0].v,
                    st.pool.chunks[0].v_scale)[col]
            assert offsets[c][col] * t.element_size() == t.data_ptr() - base.data_ptr()


def test_released_chunk_storages_are_freed_and_regrow_reallocates_zeros():
    st = _chunked("cpu")
    for layer in range(3):  # views cached for every layer: they must not keep the chunk alive
        st.view("pages", layer)
    chunk = st.pool.chunks[2]
    chunk_bytes = chunk.nbytes()
    refs = [StorageWeakRef(t.untyped_storage()) for t in chunk.tensors()]
    chunk.k.fill_(5)
    del chunk
    with pytest.raises(AssertionError):
        st.release_pages(2, 6)  # two chunks: only whole single chunks are released
    assert st.release_pages(4, 6) == chunk_bytes
    gc.collect()
    assert all(r.expired() for r in refs)
    assert st.pool.chunks[2] is None and st.view("pages", 0).chunks.k[2] is None
    assert st.released == {4, 5} and st.view("pages", 1).chunks.offsets[2].tolist() == [0] * 4
    assert st.release_pages(4, 6) == 0  # already released
    st.regrow_pages(4, 6)
    assert not st.released and int(st.pool.chunks[2].k.abs().sum()) == 0
    assert bool((st.pool.chunks[2].k_scale == 1).all())
    view = st.view("pages", 0)
    assert view.chunks.k[2].data_ptr() == st.pool.chunks[2].k[:, 0].data_ptr()
    assert int(view.chunks.offsets[2, 0]) == st.pool.chunks[2].k.data_ptr() - st.pool.chunks[0].k.data_ptr()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device (the caching allocator's statistics)")
def test_cuda_release_returns_the_chunk_to_the_driver_and_regrow_takes_it_again():
    """torch's caching allocator's own statistics: memory_allocated falls by the chunk's bytes
    when it is released and memory_reserved by about as much (K and V, 16 MiB each, have segments
    of their own; the 256 KiB scales may share a small-allocation segment), and both rise again on
    regrow."""
    st = KVStorage(num_layers=4, num_kv_heads=8, head_dim=128, num_pages=32, page_tokens=512,
                   kv_dtype="int8", device="cuda", pool_chunk_pages=8)  # 4 chunks of 32.5 MiB
    chunk_bytes = st.pool.chunks[3].nbytes()
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    assert st.release_pages(24, 32) == chunk_bytes
    fell_alloc = allocated - torch.cuda.memory_allocated()
    fell_reserved = reserved - torch.cuda.memory_reserved()
    assert fell_alloc == chunk_bytes, (fell_alloc, chunk_bytes)
    assert 0.97 * chunk_bytes <= fell_reserved <= chunk_bytes + (2 << 20), (fell_reserved, chunk_bytes)
    st.regrow_pages(24, 32)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - (allocated - fell_alloc) == chunk_bytes
    assert torch.cuda.memory_reserved() - (reserved - fell_reserved) >= 0.97 * chunk_bytes


def test_layer_groups_pool_is_one_of_slices_and_copies_run_per_group():
    """Layers 0, 1, 3 local (window 8), layer 2 global: G = 1, four groups, a pool of slices of
    one layer. A pages CopyOp copies each group's slice of the page to the destination page's
    slice of the same group; pages -> inline lands in each group's layers of the slot."""
    from edge_runtime.kv.manager import KVManager
    from edge_runtime.kv.seq_kv import CopyOp

    P = 4
    st = KVStorage(4, 2, 8, 8 * 4, P, num_inline_slots=2, inline_tokens=P, kv_dtype="fp32",
                   layer_windows=(8, 8, None, 8))
    assert st.groups.layers == ((2,), (0,), (1,), (3,)) and st.pool.k.shape == (32, 1, P, 2, 8)
    mgr = KVManager(32, P, global_slices=1, local_slices=3, local_window=8)
    st.bind_group_map(mgr.pool)
    src, dst = mgr.pool.allocate(2)
    tables = st.group_tables()
    assert tables.shape == (4, 32) and int(tables[0, src]) == src
    slices = [int(tables[g, src]) for g in range(4)]
    assert len(set(slices + [int(tables[g, dst]) for g in range(4)])) == 8
    torch.manual_seed(0)
    for s in slices:
        st.pool.k[s].normal_()
        st.pool.v[s].normal_()
    st.copy(CopyOp("pages", src * P + 1, "pages", dst * P, 3))
    st.copy(CopyOp("pages", src * P, "inline", 1 * P, 4))
    for layer in range(4):
        g, index = st.layer_slot(layer)
        assert index == 0 and st.view("pages", layer).k_cache.shape == (32, P, 2, 8)
        a, b = int(tables[g, src]), int(tables[g, dst])
        assert torch.equal(st.pool.k[b, 0, :3], st.pool.k[a, 0, 1:])
        assert torch.equal(st.pool.v[b, 0, :3], st.pool.v[a, 0, 1:])
        assert torch.equal(st.inline.k[1, layer], st.pool.k[a, 0])  # the slot keeps every layer
