"""`ContiguousKVCache`: the reference `KVContext` (fp32-or-model-dtype K/V, one tensor per sequence).

Used by tests and by the simple generate path; the engine's paged int8 store is the production one.
`causal_attention` is the plain attention math (new queries over past + new keys, GQA), exported so
other KV stores can test against it.

Invariants:
- Per sequence, K/V live in `[num_layers, capacity, num_kv_heads, head_dim]` tensors; `lens[layer]`
  tokens of layer `layer` are valid. Between forward calls every layer of a sequence has the same
  length (checked when a step starts).
- A step (`cache.step(seq_ids, num_new_tokens)`) describes one flattened varlen batch: the new tokens
  of `seq_ids[i]` are rows `[offsets[i], offsets[i] + num_new_tokens[i])` of q/k/v, at positions
  `[length(seq_ids[i]), length(seq_ids[i]) + num_new_tokens[i])`.
- A pure decode step of several sequences (one new token each) runs ONE padded attention call with a
  length mask instead of one call per sequence; any other step attends sequence by sequence.
- A local layer (`layer_windows[layer]` = W, Gemma 3) masks its attention to the window: a query
  at position i reads keys j with i - W < j <= i (transformers' sliding-window mask). Every
  position stays stored; only what is read changes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_past: int, sm_scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of new queries over past + new keys of ONE sequence.

    q: [Tq, H, D], the queries at positions num_past .. num_past + Tq - 1
    k, v: [Tk, Hkv, D] with Tk == num_past + Tq (all keys of the sequence so far, new ones included)
    window: a local layer's window W (query i reads keys i - W < j <= i), None: every key.
    returns [Tq, H, D] in q's dtype. GQA: query head h reads kv head h // (H // Hkv).
    """
    tq, num_heads, head_dim = q.shape
    tk, num_kv_heads, _ = k.shape
    assert tk == num_past + tq, (tk, num_past, tq)
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    group = num_heads // num_kv_heads
    k, v = k.to(q.dtype), v.to(q.dtype)  # a cache may store another dtype than the activations
    if group > 1:
        k = k.repeat_interleave(group, dim=1)  # [Tk, H, D]
        v = v.repeat_interleave(group, dim=1)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, T, D]
    if window is not None and tk > window:
        q_pos = torch.arange(num_past, num_past + tq, device=q.device)[:, None]
        key_pos = torch.arange(tk, device=q.device)[None, :]
        mask = (key_pos <= q_pos) & (key_pos > q_pos - window)  # [Tq, Tk]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=sm_scale)
    elif tq == 1:
        out = F.scaled_dot_product_attention(qh, kh, vh, scale=sm_scale)
    elif num_past == 0:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=sm_scale)
    else:
        q_pos = torch.arange(num_past, num_past + tq, device=q.device)
        mask = torch.arange(tk, device=q.device)[None, :] <= q_pos[:, None]  # [Tq, Tk]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=sm_scale)
    return out.transpose(0, 1)  # [Tq, H, D]


class _SeqKV:
    def __init__(self, num_layers, num_kv_heads, head_dim, capacity, dtype, device) -> None:
        shape = (num_layers, max(capacity, 16), num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.lens = [0] * num_layers

    def ensure(self, need: int) -> None:
        cap = self.k.shape[1]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_empty((old.shape[0], new_cap, *old.shape[2:]))
            new[:, :cap] = old
            setattr(self, name, new)


class ContiguousKVCache:
    """Per-sequence contiguous K/V for a set of live sequences."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 sm_scale: float | None = None,
                 layer_windows: Sequence[int | None] | None = None) -> None:
        """sm_scale: None is head_dim ** -0.5; layer_windows: per layer a local window or None."""
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.sm_scale = sm_scale
        self.layer_windows = list(layer_windows) if layer_windows else [None] * num_layers
        assert len(self.layer_windows) == num_layers, (len(self.layer_windows), num_layers)
        self._seqs: dict[Hashable, _SeqKV] = {}

    @classmethod
    def for_model(cls, config, dtype: torch.dtype = torch.float32, device="cpu") -> "ContiguousKVCache":
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, dtype, device,
                   config.attention_scale, config.layer_windows)

    def add(self, seq_id: Hashable, capacity: int = 0) -> None:
        assert seq_id not in self._seqs, f"sequence {seq_id!r} already in the cache"
        self._seqs[seq_id] = _SeqKV(self.num_layers, self.num_kv_heads, self.head_dim,
                                    capacity, self.dtype, self.device)

    def remove(self, seq_id: Hashable) -> None:
        del self._seqs[seq_id]

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def length(self, seq_id: Hashable) -> int:
        lens = self._seqs[seq_id].lens
        assert all(n == lens[0] for n in lens), f"layers out of step for {seq_id!r}: {lens}"
        return lens[0]

    def positions(self, seq_ids: Sequence[Hashable], num_new_tokens: Sequence[int]) -> torch.Tensor:
        """long [sum(num_new_tokens)]: the absolute positions of the next new tokens."""
        parts = [torch.arange(self.length(s), self.length(s) + n)
                 for s, n in zip(seq_ids, num_new_tokens)]
        return torch.cat(parts).to(self.device)

    def step(self, seq_ids: Sequence[Hashable], num_new_tokens: Sequence[int]) -> "ContiguousStep":
        assert len(seq_ids) == len(num_new_tokens), (len(seq_ids), len(num_new_tokens))
        assert len(set(seq_ids)) == len(seq_ids), f"duplicate sequence in one step: {seq_ids}"
        seqs = []
        for seq_id, n in zip(seq_ids, num_new_tokens):
            assert n >= 1, (seq_id, n)
            seq = self._seqs[seq_id]
            seq.ensure(self.length(seq_id) + n)
            seqs.append(seq)
        return ContiguousStep(seqs, list(num_new_tokens), self.sm_scale, self.layer_windows)


class ContiguousStep:
    """The `KVContext` of one forward call over a flattened varlen batch."""

    def __init__(self, seqs: list[_SeqKV], num_new_tokens: list[int], sm_scale: float | None,
                 layer_windows: list[int | None]) -> None:
        self.seqs, self.num_new_tokens = seqs, num_new_tokens
        self.sm_scale, self.layer_windows = sm_scale, layer_windows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # q: [T, H, D]; k, v: [T, Hkv, D]; T == sum(num_new_tokens)
        assert q.shape[0] == sum(self.num_new_tokens), (q.shape, self.num_new_tokens)
        if len(self.seqs) > 1 and q.shape[0] == len(self.seqs):
            return self._attend_decode(layer, q, k, v)
        out = torch.empty_like(q)
        start = 0
        for seq, n in zip(self.seqs, self.num_new_tokens):
            past = seq.lens[layer]
            end = past + n
            seq.k[layer, past:end] = k[start:start + n]
            seq.v[layer, past:end] = v[start:start + n]
            seq.lens[layer] = end
            out[start:start + n] = causal_attention(
                q[start:start + n], seq.k[layer, :end], seq.v[layer, :end], past, self.sm_scale,
                self.layer_windows[layer])
            start += n
        return out

    def _attend_decode(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """One new token per sequence: one padded, masked attention call for the whole batch."""
        lens = []
        for i, seq in enumerate(self.seqs):
            past = seq.lens[layer]
            seq.k[layer, past] = k[i]
            seq.v[layer, past] = v[i]
            seq.lens[layer] = past + 1
            lens.append(past + 1)
        group = q.shape[1] // k.shape[1]
        keys = pad_sequence([s.k[layer, :n] for s, n in zip(self.seqs, lens)], batch_first=True)
        vals = pad_sequence([s.v[layer, :n] for s, n in zip(self.seqs, lens)], batch_first=True)
        # keys, vals: [B, Lmax, Hkv, D] -> [B, H, Lmax, D]
        keys = keys.to(q.dtype).repeat_interleave(group, dim=2).transpose(1, 2)
        vals = vals.to(q.dtype).repeat_interleave(group, dim=2).transpose(1, 2)
        key_pos = torch.arange(keys.shape[2], device=q.device)[None, :]
        ends = torch.tensor(lens, device=q.device)[:, None]
        valid = key_pos < ends  # [B, Lmax]
        window = self.layer_windows[layer]
        if window is not None:
            valid &= key_pos >= ends - window
        out = F.scaled_dot_product_attention(q[:, :, None, :], keys, vals, scale=self.sm_scale,
                                             attn_mask=valid[:, None, None, :])  # [B, H, 1, D]
        return out[:, :, 0, :]
