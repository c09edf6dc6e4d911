"""kernels/flat_kv_cpu.py against the references: write_kv_flat == write_kv_ref bit for bit,
gather_decode_attention == per-segment paged_attention_ref merged by log-sum-exp; with plain and
with centred int8 keys (kernels/quantize.py: MEANS, one mean key per layer and kv head)."""

import platform

import pytest
import torch

from edge_runtime.kernels.flat_kv_cpu import gather_decode_attention, write_kv_flat
from edge_runtime.kernels.kv_write import write_kv_ref
from edge_runtime.kernels.paged_attention_ref import merge_attention_ref, paged_attention_ref
from edge_runtime.kernels.quantize import quantize_int8, quantize_int8_keys
from native_helpers import portable_library

LAYERS, P, HKV, D = 3, 8, 2, 16
DTYPES = {"int8": torch.int8, "fp16": torch.float16, "fp32": torch.float32}


def _means(layers, hkv, d, seed=7):
    """Mean keys [layers, Hkv, D], large next to randn keys (as a real model's are)."""
    return (3.0 * torch.randn(layers, hkv, d, generator=torch.Generator().manual_seed(seed))).contiguous()


MEANS = _means(LAYERS, HKV, D)


def _keys(shape, gen, means):
    """randn keys [..., layers, P, Hkv, D]; with means, about half of them shifted by their layer's
    mean (so that they are stored centred)."""
    k = torch.randn(shape, generator=gen)
    if means is not None:
        shifted = torch.rand(shape[:-1], generator=gen) < 0.5
        k = k + shifted.unsqueeze(-1) * means[:, None]
    return k


def _quantize_keys(k, means):
    """k [N, layers, P, Hkv, D] -> (q, scales), centred on each layer's mean where that helps."""
    if means is None:
        return quantize_int8(k)
    per_layer = [quantize_int8_keys(k[:, layer], means[layer]) for layer in range(k.shape[1])]
    return torch.stack([q for q, _ in per_layer], 1), torch.stack([s for _, s in per_layer], 1)


def _store(num_blocks, dtype, gen, means=None):
    shape = (num_blocks, LAYERS, P, HKV, D)
    k, v = _keys(shape, gen, means), torch.randn(shape, generator=gen)
    if dtype != torch.int8:
        return k.to(dtype), v.to(dtype), None, None
    (kq, ks), (vq, vs) = _quantize_keys(k, means), quantize_int8(v)
    return kq, vq, ks, vs


def _rows(slots, layer):
    """flat slots -> rows [T, Hkv] of `layer` (the addressing of flat_kv_cpu's docstring)."""
    slots = torch.as_tensor(slots)
    base = ((slots // P * LAYERS + layer) * P + slots % P) * HKV
    return base[:, None] + torch.arange(HKV)


@pytest.mark.parametrize("kv_dtype,centred", [("int8", False), ("int8", True), ("fp16", False),
                                              ("fp32", False)])
@pytest.mark.parametrize("layer", [0, 2])
@pytest.mark.parametrize("native", [True, False], ids=["c", "torch"])
def test_write_kv_flat_equals_reference(kv_dtype, centred, layer, native, monkeypatch):
    from edge_runtime.kernels import cpu_native

    if native:
        _native_or_skip()
    else:
        monkeypatch.setattr(cpu_native, "library", lambda: None)
    gen = torch.Generator().manual_seed(1)
    a = _store(6, DTYPES[kv_dtype], gen)
    b = tuple(None if t is None else t.clone() for t in a)
    slots = [5, 17, 18, 40, 47, 0, 23]  # ragged, across pages, page boundaries
    k, v = torch.randn(7, HKV, D, generator=gen) * 3, torch.randn(7, HKV, D, generator=gen)
    k[2] = 0  # a zero vector: scale 1
    mean = MEANS[layer] if centred else None
    if centred:
        k[3:] += mean  # near the mean: stored centred
        k[4, 0] = mean[0]  # exactly the mean: centred to zero, scale -1
    write_kv_ref(k, v, a[0][:, layer], a[1][:, layer], *(None if t is None else t[:, layer] for t in a[2:]),
                 torch.tensor(slots), mean)
    write_kv_flat(k, v, *b, _rows(slots, layer), mean)
    for x, y in zip(a, b):
        if x is not None:
            assert torch.equal(x, y)
    if centred:
        scales = b[2].view(-1)[_rows(slots, layer)]  # [T, Hkv]
        assert bool((scales[3:] < 0).all()) and bool((scales[2] > 0).all())  # near the mean; zero
        assert float(scales[4, 0]) == -1.0


@pytest.mark.parametrize("kv_dtype,centred", [("int8", False), ("int8", True), ("fp32", False)])
def test_gather_decode_attention_equals_merged_segments(kv_dtype, centred):
    gen = torch.Generator().manual_seed(2)
    dtype = DTYPES[kv_dtype]
    means = MEANS if centred else None
    pool, arena = _store(10, dtype, gen, means), _store(3, dtype, gen, means)
    mean = None if means is None else means[1]
    layer, heads = 1, 6
    # per row: (pool pages, pool length, arena slot or None, arena length)
    rows = [((3, 7), 13, None, 0), ((1,), 5, 2, 6), ((), 0, 0, 1), ((4, 9, 8), 24, None, 0)]
    q = torch.randn(len(rows), heads, D, generator=gen)
    sm = D ** -0.5
    segs = []
    for store, pick in ((pool, lambda r: (r[0], r[1])), (arena, lambda r: ((r[2],) if r[2] is not None else (), r[3]))):
        ids = [pick(r) for r in rows]
        table = torch.zeros(len(rows), 3, dtype=torch.int32)
        for i, (blocks, _) in enumerate(ids):
            table[i, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        lens = torch.tensor([n for _, n in ids], dtype=torch.int32)
        view = [None if t is None else t[:, layer] for t in store]
        segs.append(paged_attention_ref(q, *view, table, torch.arange(len(rows), dtype=torch.int32), lens, sm,
                                        k_mean=mean))
    want = merge_attention_ref([s[0] for s in segs], [s[1] for s in segs])
    parts, masks = [], []
    for store, pick in ((pool, lambda r: (r[0], r[1])), (arena, lambda r: ((r[2],) if r[2] is not None else (), r[3]))):
        width = max(pick(r)[1] for r in rows)
        slots = torch.zeros(len(rows), width, dtype=torch.long)
        valid = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            blocks, n = pick(r)
            s = [blocks[j // P] * P + j % P for j in range(n)]
            slots[i, :n] = torch.tensor(s, dtype=torch.long)
            valid[i, :n] = True
        parts.append((*store, _rows(slots.flatten(), layer).view(len(rows), width, HKV).transpose(1, 2).contiguous()))
        masks.append(valid)
    bias = torch.zeros(len(rows), sum(m.shape[1] for m in masks))
    bias.masked_fill_(~torch.cat(masks, 1), float("-inf"))
    got = gather_decode_attention(q, parts, bias[:, None, None, :], sm, mean)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _native_or_skip():
    import shutil

    from edge_runtime.kernels import cpu_native

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the torch path is used (tools/bootstrap.sh installs gcc)")
    lib = cpu_native.library()
    assert lib is not None, "a compiler is present but kernels/csrc/flat_kv.c did not build"
    return lib


# (head_dim, query heads, kv heads): flat_kv.c's vectorized task for head_dim 64/128 and 1-8 query
# heads per kv head, its any-shape task otherwise (head_dim 16, 9 per kv head)
SHAPES = [(16, 6, 2), (64, 6, 2), (64, 2, 2), (128, 8, 2), (64, 10, 2), (64, 16, 2), (64, 18, 2)]


@pytest.mark.parametrize("head_dim,heads,hkv", SHAPES)
@pytest.mark.parametrize("centred", [False, True], ids=["plain", "centred"])
def test_native_decode_attention_equals_torch_path(head_dim, heads, hkv, centred):
    from edge_runtime.kernels.flat_kv_cpu import NativeDecodeAttention

    lib = _native_or_skip()
    gen = torch.Generator().manual_seed(3)
    layers, page = 3, 8
    means = _means(layers, hkv, head_dim) if centred else None
    stores = []
    for blocks in (7, 3):  # pool, arena
        shape = (blocks, layers, page, hkv, head_dim)
        (kq, ks), (vq, vs) = _quantize_keys(_keys(shape, gen, means), means), quantize_int8(torch.randn(shape, generator=gen))
        stores.append((kq, vq, ks, vs))
    if centred:
        assert 0.2 < float((stores[0][2] < 0).float().mean()) < 0.8
    lens = [[13, 0, 20, 1], [0, 9, 4, 2]]  # per store, per row: ragged, one row in each store only
    parts, masks = [], []
    for (kq, vq, ks, vs), store_lens in zip(stores, lens):
        width = max(store_lens)
        n_tok = kq.shape[0] * page
        tok = torch.stack([torch.randperm(n_tok, generator=gen)[:width] for _ in store_lens])  # [R, W]
        slots_base = (tok // page * layers * page + tok % page) * hkv
        index = (slots_base[:, None, :] + torch.arange(hkv)[None, :, None]).contiguous()  # [R, Hkv, W]
        valid = torch.arange(width)[None, :] < torch.tensor(store_lens)[:, None]
        parts.append((kq, vq, ks, vs, index, torch.tensor(store_lens, dtype=torch.int32), page * hkv))
        masks.append(valid)
    bias = torch.zeros(4, sum(m.shape[1] for m in masks)).masked_fill_(~torch.cat(masks, 1), float("-inf"))
    qkv = torch.randn(4, heads + 2, head_dim, generator=gen)
    q = qkv[:, :heads]  # strided rows, as the model's fused q/k/v split gives
    native = NativeDecodeAttention(lib, parts, heads, head_dim ** -0.5, means)
    portable = (NativeDecodeAttention(portable_library(), parts, heads, head_dim ** -0.5, means)
                if platform.machine() == "x86_64" else None)
    for layer in (0, 2):
        torch_parts = [(k, v, ks, vs, idx + layer * stride) for k, v, ks, vs, idx, _, stride in parts]
        want = gather_decode_attention(q, torch_parts, bias[:, None, None, :], head_dim ** -0.5,
                                       None if means is None else means[layer])
        torch.testing.assert_close(native(q, layer), want, atol=1e-5, rtol=1e-4)
        if portable is not None:  # the baseline-ISA build's code paths give the same result
            torch.testing.assert_close(portable(q, layer), want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("lens", [[600] * 5, [40, 900, 35, 610, 12], [3, 1, 700], [5], [2, 9]])
@pytest.mark.parametrize("team", [1, 2, 3, 4])
def test_attention_spans_are_contiguous_and_balanced_by_keys(lens, team):
    """decode_attention_span gives each thread a contiguous run of (row, kv head) tasks; together
    they cover every task once, and no thread has more than its share of the keys plus one task's
    (rows of 900 and 12 keys split by keys, not by count)."""
    import ctypes

    from edge_runtime.kernels.cpu_native import FlatPart

    lib, hkv = _native_or_skip(), 3
    rows = torch.tensor(lens, dtype=torch.int32)
    part = FlatPart(lens=rows.data_ptr())
    spans = []
    for t in range(team):
        a0, a1 = ctypes.c_int64(), ctypes.c_int64()
        lib.decode_attention_span(ctypes.byref(part), 1, len(lens), hkv, t, team, ctypes.byref(a0),
                                  ctypes.byref(a1))
        spans.append((a0.value, a1.value))
    tasks = len(lens) * hkv
    assert [i for a, b in spans for i in range(a, b)] == list(range(tasks)), spans
    keys = [sum(lens[i // hkv] for i in range(a, b)) for a, b in spans]
    assert max(keys) <= sum(lens) * hkv / team + max(lens), (spans, keys)
    if len(set(lens)) == 1:  # equal rows: task counts differ by at most one
        counts = [b - a for a, b in spans]
        assert max(counts) - min(counts) <= 1, spans


@pytest.mark.parametrize("centred", [False, True], ids=["plain", "centred"])
def test_native_quantization_is_bit_exact_on_hard_values(centred):
    """Scales across fp16's normal and subnormal range, exact .5 ties of x / scale, zero rows;
    centred: the same values around the layer's mean key, and keys equal to it."""
    _native_or_skip()
    gen = torch.Generator().manual_seed(4)
    mags = torch.tensor([1e-9, 3e-7, 6e-6, 1e-4, 0.01, 1.0, 30.0, 1e3, 6e4])
    x = torch.randn(len(mags) * 8, HKV, D, generator=gen) * mags.repeat_interleave(8)[:, None, None]
    x[0] = 0.0
    ties = torch.arange(-127, 127, 2).float()[: D - 1] + 0.5  # x / scale lands on .5 for scale 1
    x[1, 0, : ties.numel()] = ties
    x[1, 0, ties.numel()] = 127.0  # amax 127 -> scale 1 exactly
    n = x.shape[0]
    mean = None
    if centred:
        mean = MEANS[1] * 1e-3  # small enough that the tiny keys stay plain, the others centre
        x = torch.cat([x, x + mean, mean.expand(2, HKV, D)])
        n = x.shape[0]
    a, b = _store(-(-n // P), torch.int8, gen), None
    b = tuple(t.clone() for t in a)
    slots = list(range(n))
    view = [t[:, 1] for t in a]
    write_kv_ref(x, -x, view[0], view[1], view[2], view[3], torch.tensor(slots), mean)
    write_kv_flat(x, -x, *b, _rows(slots, 1), mean)
    for u, w in zip(a, b):
        assert torch.equal(u, w)


@pytest.mark.parametrize("head_dim", [64, 12])  # 8-wide F16C conversions; and a 4-value tail
def test_native_fp16_write_is_bit_exact(head_dim):
    """write_kv_f16 (the recent-key window's store, written by the one-call decode step) gives the
    bits of torch's .to(float16) on fp16's hard values: subnormals, round-to-even ties, overflow to
    inf, signed zeros; in the machine's build (F16C) and the baseline-ISA one (software rounding)."""
    lib = _native_or_skip()
    hkv, tokens = 3, 4
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, hkv, head_dim, generator=gen) * 10.0 ** torch.randint(-9, 5, (tokens, hkv, head_dim), generator=gen)
    hard = torch.tensor([0.0, -0.0, 6e-8, -3e-8, 1e-5, 65504.0, 65520.0, 7e4, -1e6, float("inf"),
                         1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 2.0 ** -24 * 1.5, 2.0 ** -14 * 0.75])
    x.view(-1)[: hard.numel()] = hard  # 1 + 2^-11: a tie, rounds to even (1.0); 1 + 3*2^-11 up
    rows = torch.arange(tokens * hkv, dtype=torch.int64).flip(0).contiguous()  # [T, Hkv], scattered
    neg = -x  # held: a temporary's data_ptr() would dangle during the call
    libs = [lib] + ([portable_library()] if platform.machine() == "x86_64" else [])
    for build in libs:
        k_store = torch.zeros(tokens * hkv, head_dim, dtype=torch.int16)
        v_store = torch.zeros_like(k_store)
        build.write_kv_f16(x.data_ptr(), neg.data_ptr(), hkv * head_dim, hkv * head_dim, tokens, hkv,
                           head_dim, rows.data_ptr(), 0, k_store.data_ptr(), v_store.data_ptr())
        order = torch.empty_like(rows)
        order[rows] = torch.arange(rows.numel())  # store row rows[j] holds input j
        assert torch.equal(k_store, x.reshape(-1, head_dim).to(torch.float16).view(torch.int16)[order])
        assert torch.equal(v_store, neg.reshape(-1, head_dim).to(torch.float16).view(torch.int16)[order])


@pytest.mark.parametrize("head_dim,heads,hkv", [(16, 6, 2), (64, 6, 2), (128, 8, 2)])
@pytest.mark.parametrize("centred", [False, True], ids=["plain", "centred"])
def test_native_decode_attention_does_not_depend_on_how_keys_are_split(head_dim, heads, hkv,
                                                                      centred):
    """One row's 21 keys (an int8 store, then 3 fp16 rows) split over two int8 parts in every
    way: the output is the same bit for bit (a cached prefix and a tail, or one tail, read the
    same); the scores of a part's last n % 8 keys use the arithmetic of the others."""
    from edge_runtime.kernels.flat_kv_cpu import NativeDecodeAttention

    lib = _native_or_skip()
    gen = torch.Generator().manual_seed(5)
    layers, page, n = 1, 8, 21
    means = _means(layers, hkv, head_dim) if centred else None
    shape = (4, layers, page, hkv, head_dim)
    (kq, ks), (vq, vs) = _quantize_keys(_keys(shape, gen, means), means), quantize_int8(torch.randn(shape, generator=gen))
    k16 = torch.randn(1, layers, page, hkv, head_dim, generator=gen).half()
    v16 = torch.randn(1, layers, page, hkv, head_dim, generator=gen).half()
    rows = (torch.randperm(4 * page, generator=gen)[:n][:, None] * hkv + torch.arange(hkv))  # [n, Hkv]
    exact = (torch.arange(3)[:, None] * hkv + torch.arange(hkv)).t()[None].contiguous()  # [1, Hkv, 3]
    q = torch.randn(1, heads, head_dim, generator=gen)

    def index(r):  # [n_r, Hkv] -> [1, Hkv, max(n_r, 1)]
        r = r if r.shape[0] else torch.zeros(1, hkv, dtype=torch.long)
        return r.t()[None].contiguous()

    outs = []
    for cut in range(n + 1):
        parts = [(kq, vq, ks, vs, index(rows[:cut]), torch.tensor([cut], dtype=torch.int32), 0),
                 (kq, vq, ks, vs, index(rows[cut:]), torch.tensor([n - cut], dtype=torch.int32), 0),
                 (k16, v16, None, None, exact, torch.tensor([3], dtype=torch.int32), 0)]
        outs.append(NativeDecodeAttention(lib, parts, heads, head_dim ** -0.5, means)(q, 0))
    assert all(torch.equal(o, outs[0]) for o in outs), \
        [cut for cut, o in enumerate(outs) if not torch.equal(o, outs[0])]
