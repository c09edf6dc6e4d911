"""CPU paths of the KV write and of decode attention that index the whole KV store as flat rows.

Why: the references (kv_write.write_kv_ref, paged_attention_ref + merge) issue ~20 small torch ops
per segment per layer, and a decode step runs 30 layers x up to 3 segments; on a CPU that op
overhead, not arithmetic, decided the step time (docs/perf.md, "CPU decode step"). Here the engine computes
row indices once per step and each layer costs one index add, the gathers and one softmax.

Addressing: a store tensor `[N, num_layers, P, Hkv, D]` (kv_storage layout) viewed as
`[N * num_layers * P * Hkv, D]`; the row of (block b, layer l, offset o, head h) is
`((b * num_layers + l) * P + o) * Hkv + h`, so one layer's rows are layer 0's plus `l * P * Hkv`,
and the scales `[N, num_layers, P, Hkv]` are indexed by the same row number.

- `write_kv_flat`: same result as `write_kv_ref` (int8: the same quantize_int8_keys, bit-exact;
  float stores: cast), K and V quantized in one call; int8 stores go through the C writer of
  kernels/csrc/flat_kv.c when it is built (bit-exact too).
- Centred keys (kernels/quantize.py): every function takes the layer's mean key `k_mean` [Hkv, D]
  (None: none); writers centre a key where that lowers its absmax, readers of int8 parts add q.m
  to the scores of negative-scale keys (a part without scales, the fp16 window, has none).
- `NativeDecodeAttention`: `gather_decode_attention` for int8 stores in C, per-step arguments made once.
- `gather_decode_attention`: one query per row, attending to the rows' index lists over one or two
  stores in a single softmax; equals paged_attention_ref over the segments merged by log-sum-exp
  (no lse is returned: nothing is left to merge). Padded positions carry -inf in `mask_bias`.
- `gather_prefill_attention`: one sequence's new tokens (a prefill chunk) over all its keys with a
  causal mask, through torch's SDPA on the dequantized keys/values.
"""
from __future__ import annotations

import torch

from edge_runtime.kernels.quantize import quantize_int8, quantize_int8_keys
from edge_runtime.kernels import cpu_native
from edge_runtime.kernels.cpu_native import FlatPart


def flat_rows(store_k: torch.Tensor) -> torch.Tensor:
    """[N, layers, P, Hkv, D] -> [N * layers * P * Hkv, D] (a view)."""
    assert store_k.is_contiguous(), "store tensors are allocated contiguous"
    return store_k.view(-1, store_k.shape[-1])


def write_kv_flat(k, v, k_store, v_store, k_scale_store, v_scale_store, rows, k_mean=None) -> None:
    """k, v: [T, Hkv, D]; rows: long [T, Hkv] flat row numbers of this layer -> stores written.
    k_mean: this layer's mean key [Hkv, D] float32 (int8 stores only) or None."""
    assert k.shape == v.shape and rows.shape == k.shape[:2], (k.shape, v.shape, rows.shape)
    if rows.numel() == 0:
        return
    flat = rows.reshape(-1)
    d = k.shape[-1]
    if k_store.dtype != torch.int8:
        k_mean = None  # a float store (the fp16 window) holds keys as they are
    if k_store.dtype == torch.int8 and _write_native(k, v, k_store, v_store, k_scale_store, v_scale_store,
                                                     rows, k_mean):
        return
    if k_store.dtype == torch.int8:
        if k_mean is None:
            q, s = quantize_int8(torch.stack((k, v)))  # q: [2, T, Hkv, D], s: [2, T, Hkv]
        else:
            (kq, ks), (vq, vs) = quantize_int8_keys(k, k_mean), quantize_int8(v)
            q, s = (kq, vq), (ks, vs)
        flat_rows(k_store).index_copy_(0, flat, q[0].reshape(-1, d))
        flat_rows(v_store).index_copy_(0, flat, q[1].reshape(-1, d))
        k_scale_store.view(-1).index_copy_(0, flat, s[0].reshape(-1))
        v_scale_store.view(-1).index_copy_(0, flat, s[1].reshape(-1))
    else:
        flat_rows(k_store).index_copy_(0, flat, k.reshape(-1, d).to(k_store.dtype))
        flat_rows(v_store).index_copy_(0, flat, v.reshape(-1, d).to(v_store.dtype))


def _write_native(k, v, k_store, v_store, k_scale_store, v_scale_store, rows, k_mean=None) -> bool:
    """The C writer (kernels/csrc/flat_kv.c) when it is built and the layouts fit; False: not used."""
    lib = cpu_native.library()
    fits = (k.dtype == v.dtype == torch.float32 and k.stride(2) == v.stride(2) == 1
            and k.stride(1) == v.stride(1) == k.shape[2] and rows.is_contiguous())
    if k_mean is not None:  # the C writer centres rows of up to NATIVE_MAX_HEAD_DIM
        fits = fits and k.shape[2] <= NATIVE_MAX_HEAD_DIM and _mean_fits(k_mean, k.shape[1:])
    if lib is None or not fits:
        return False
    t, hkv, d = k.shape
    lib.write_kv_int8(k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0), t, hkv, d,
                      rows.data_ptr(), 0, k_store.data_ptr(), v_store.data_ptr(),
                      k_scale_store.data_ptr(), v_scale_store.data_ptr(),
                      None if k_mean is None else k_mean.data_ptr())
    return True


def _mean_fits(k_mean, shape) -> bool:
    assert tuple(k_mean.shape) == tuple(shape), f"k_mean {tuple(k_mean.shape)} for keys {tuple(shape)}"
    return k_mean.dtype == torch.float32 and k_mean.is_contiguous()


def _gather(store, scale_store, index):
    """index: long [R, Hkv, L] -> (float32 [R, Hkv, L, D], scale float32 [R, Hkv, L] | None).
    index_select on the flat index: 4-6x faster than advanced indexing for these sizes."""
    flat = index.view(-1)
    x = torch.index_select(flat_rows(store), 0, flat).float().view(*index.shape, store.shape[-1])
    if scale_store is None:
        return x, None
    return x, torch.index_select(scale_store.view(-1), 0, flat).float().view(index.shape)


def gather_decode_attention(q, parts, mask_bias, sm_scale, k_mean=None):
    """q: [R, H, D] (one query per row); parts: [(k_store, v_store, k_scale_store | None,
    v_scale_store | None, index long [R, Hkv, L_i])] for one or two stores; mask_bias: float32
    [R, 1, 1, sum L_i], 0 where a position is valid, -inf where padded (every row has one valid
    position at least); k_mean: [Hkv, D] for centred int8 keys -> out float32 [R, H, D]."""
    r, h, d = q.shape
    hkv = parts[0][4].shape[1]
    ks, vs = zip(*((_gather(k, k_s, idx), _gather(v, v_s, idx)) for k, v, k_s, v_s, idx in parts))
    k, k_scale = _cat(ks)
    v, v_scale = _cat(vs)
    q4 = (q.float() * sm_scale).view(r, hkv, h // hkv, d)  # [R, Hkv, g, D]
    scores = torch.matmul(q4, k.transpose(2, 3))  # [R, Hkv, g, L]
    if k_scale is not None:
        scores.mul_(k_scale.abs().unsqueeze(2))
        if k_mean is not None:  # + q.m for centred keys (negative scales; parts without scales: 1)
            qm = torch.matmul(q4, k_mean.float().unsqueeze(-1))  # [R, Hkv, g, 1]
            scores.add_(qm * (k_scale < 0).unsqueeze(2))
    probs = torch.softmax(scores.add_(mask_bias), dim=-1)
    if v_scale is not None:
        probs.mul_(v_scale.unsqueeze(2))
    return torch.matmul(probs, v).view(r, h, d)  # [R, Hkv, g, D] -> [R, H, D]


def gather_prefill_attention(q, parts, mask_bias, sm_scale, new_kv=None, k_mean=None):
    """Causal attention of one sequence's new tokens over all its keys.
    q: [n, H, D]; parts: [(k_store, v_store, k_scale_store | None, v_scale_store | None,
    index long [Hkv, L_i])] whose concatenated keys are the positions 0 .. L-1 in order, or
    0 .. L-n-1 with `new_kv` = (k, v) [n, Hkv, D], the new tokens' own K/V, read as they are;
    mask_bias: float32 [n, L], 0 where query i may see key j, -inf elsewhere -> float32 [n, H, D].
    K/V are dequantized once and attended with torch's SDPA (blocked, multi-threaded on CPU);
    k_mean: [Hkv, D] for centred int8 keys."""
    ks, vs = [], []
    for k, v, k_s, v_s, idx in parts:
        ks.append(_dequantized(k, k_s, idx, k_mean))
        vs.append(_dequantized(v, v_s, idx))
    if new_kv is not None:
        ks.append(new_kv[0].float().transpose(0, 1))
        vs.append(new_kv[1].float().transpose(0, 1))
    k = ks[0] if len(ks) == 1 else torch.cat(ks, dim=1)  # [Hkv, L, D]
    v = vs[0] if len(vs) == 1 else torch.cat(vs, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1).unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
        attn_mask=mask_bias, scale=sm_scale, enable_gqa=True)  # [1, H, n, D]
    return out[0].transpose(0, 1)


def _dequantized(store, scale_store, index, mean=None):
    """-> float32 [Hkv, L, D] (index long [Hkv, L]); mean: the keys' [Hkv, D] (centred keys)."""
    x, scale = _gather(store, scale_store, index)
    if scale is None:
        return x
    x.mul_(scale.abs().unsqueeze(-1))
    if mean is not None:
        x.add_((scale < 0).unsqueeze(-1) * mean.float().unsqueeze(-2))
    return x


def _cat(pairs):
    """(values, scales) pairs of the parts -> one pair; a part without scales (a float store, the
    fp16 window next to int8 parts) gets scale 1."""
    if len(pairs) == 1:
        return pairs[0]
    values = torch.cat([p[0] for p in pairs], dim=2)
    if all(p[1] is None for p in pairs):
        return values, None
    scales = torch.cat([p[1] if p[1] is not None else torch.ones(p[0].shape[:-1]) for p in pairs], dim=2)
    return values, scales


NATIVE_MAX_HEAD_DIM = 256  # MAX_HEAD_DIM of kernels/csrc/flat_kv.c


def _int32(t: torch.Tensor) -> torch.Tensor:
    """t as contiguous int32; the flat index builds its lengths so (a no-op .to would still go
    through the dispatcher, every step)."""
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


class NativeDecodeAttention:
    """`gather_decode_attention` for int8 stores in C (kernels/csrc/flat_kv.c), its per-step
    arguments prepared once; a layer call sets the parts' layer offsets and runs one C call.
    A part may be an fp16 store without scales (a recent-key window)."""

    def __init__(self, lib, parts, num_heads: int, sm_scale: float, k_means=None):
        """parts: [(k_store, v_store, k_scale_store, v_scale_store, index long [R, Hkv, W],
        lens int32 [R], layer_stride)] with int8 stores; lens[r] entries of row r are valid.
        k_means: [layers, Hkv, D] float32 mean keys of centred int8 keys, or None."""
        self.lib, self.num_heads, self.sm_scale = lib, num_heads, sm_scale
        assert k_means is None or (k_means.dtype == torch.float32 and k_means.is_contiguous())
        self.k_means = k_means
        # layer l's mean keys start l * Hkv * D floats in: a pointer sum, not a view per call
        self.mean_ptr = None if k_means is None else k_means.data_ptr()
        self.mean_layer_bytes = 0 if k_means is None else k_means[0].nbytes
        self._keep = [(p[4].contiguous(), _int32(p[5])) for p in parts]
        self.layer_strides = [p[6] for p in parts]  # part i, layer l: rows + l * layer_strides[i]
        self.parts = (FlatPart * len(parts))()
        for slot, (k, v, ks, vs, *_), (index, lens) in zip(self.parts, parts, self._keep):
            # int8 with fp16 scales, or fp16 without (the recent-key window: the C kernel reads a
            # part without scales as fp16 rows)
            assert k.is_contiguous() and ((k.dtype == torch.int8 and ks.dtype == torch.float16)
                                          or (k.dtype == torch.float16 and ks is None)), k.dtype
            slot.k, slot.v = k.data_ptr(), v.data_ptr()
            slot.ks, slot.vs = (None, None) if ks is None else (ks.data_ptr(), vs.data_ptr())
            slot.index, slot.lens, slot.width = index.data_ptr(), lens.data_ptr(), index.shape[2]
        self.num_rows, self.num_kv_heads = parts[0][4].shape[:2]
        self.head_dim = parts[0][0].shape[-1]
        self.set_layer(0)
        # keys per row, summed over the parts in Python: a few rows, not worth torch ops
        total = [sum(row) for row in zip(*(lens.tolist() for _, lens in self._keep))]
        assert min(total) > 0, "every decode row attends to one key at least"
        # one region per (row, kv head) task: its G heads' scores over the row's keys
        self.scratch_stride = num_heads // self.num_kv_heads * max(total)
        # a region per thread (C: min(nthreads, R * Hkv) of them); threads are capped to it
        self.num_regions = min(self.num_rows * self.num_kv_heads, max(1, torch.get_num_threads()))
        self.scratch = torch.empty(self.num_regions * self.scratch_stride, dtype=torch.float32)

    def set_layer(self, layer: int) -> None:
        """Point the parts at `layer`'s rows and mean keys (layer 0: what decoder.c, which
        advances them itself, expects)."""
        mean = None if self.mean_ptr is None else self.mean_ptr + layer * self.mean_layer_bytes
        for slot, stride in zip(self.parts, self.layer_strides):
            slot.layer_offset = layer * stride
            slot.kmean = mean if slot.ks else None  # int8 parts only: the window is fp16

    def __call__(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [R, H, D] float32 (heads contiguous) -> out float32 [R, H, D]."""
        r, h, d = q.shape
        assert (r, h, d) == (self.num_rows, self.num_heads, self.head_dim) and q.dtype == torch.float32
        if q.stride(2) != 1 or q.stride(1) != d:
            q = q.contiguous()
        self.set_layer(layer)
        out = torch.empty(r, h, d, dtype=torch.float32)
        rc = self.lib.decode_attention_int8(q.data_ptr(), self.parts, len(self.parts), r, h,
                                            self.num_kv_heads, d, q.stride(0), self.sm_scale,
                                            out.data_ptr(), self.scratch.data_ptr(),
                                            self.scratch_stride,
                                            min(torch.get_num_threads(), self.num_regions))
        assert rc == 0, f"decode_attention_int8 returned {rc}"
        return out
