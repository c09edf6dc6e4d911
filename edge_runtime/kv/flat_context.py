"""The CPU back end's KVContext (edge_runtime/model/kv_interface.py) for one engine step.

The same segments as the CUDA back end's per-segment calls (kv/paged_context.py) are turned once
per step into slot mappings and row numbers of the whole store (kv/flat_index.py);
kernels/flat_kv_cpu.py writes K/V and attends every token over prefix + tail in one softmax: in C
for int8 and fp16 stores (kernels/csrc/flat_kv.c), a prefill chunk's tokens as rows like decode
tokens (so a position reads bit for bit the same in either; a windowed prefill row's exact keys
come from a per-step fp16 "fresh" store); for fp32 stores (or without a C compiler) decode
tokens through torch ops and each prefill row through one causal SDPA call. A step whose tokens
are all gathered by the C attention (int8 or fp16 KV) also offers `native_decode_args` for the
one-call C layer stack (kernels/cpu_decoder.py), prefill chunks included, unless the model has
local (sliding-window) layers, whose reads are cut per layer (kv/layer_windows.py). With layer
groups (kv/layer_groups.py) the pool's rows of a layer are its group's: the step's pool rows
(page head slices) are turned into each group's slices once per step and group (`_rows`), and
the C decode attention is made per layer (a part's rows plus one stride per layer cannot name
another group's slices).

Invariants: as kv/paged_context.py's (new tokens outside the shared prefix, tail storage reserved,
indexes built once per step in `__init__`, never per layer); the storage is on the CPU.
"""

from __future__ import annotations

import torch

from edge_runtime.kv.flat_index import FlatKVIndex
from edge_runtime.kv.step_context import StepKVContext
from edge_runtime.kv.storage import KVStorage
from edge_runtime.kernels import cpu_native
from edge_runtime.kernels.flat_kv_cpu import (NATIVE_MAX_HEAD_DIM, NativeDecodeAttention,
                                              gather_decode_attention, gather_prefill_attention,
                                              write_kv_flat)
from edge_runtime.kernels.cpu_decoder import KVWrite, NativeDecodeArgs


class FlatKVContext(StepKVContext):
    """Per-step flat-row view of the CPU storage; pass to CausalLM.forward as `kv`."""

    def __init__(self, storage: KVStorage, seqs: list, sm_scale: float):
        super().__init__(storage, seqs, sm_scale)
        assert storage.device.type == "cpu", f"the flat KV paths run on the CPU, not {storage.device}"
        self._fits = self._native_fits()
        self.flat = FlatKVIndex(storage, seqs, self._fits)
        self._fresh = None  # (k, v) [1, layers, F, Hkv, D] fp16: gathered prefill rows' exact K/V
        if self.flat.num_fresh:
            self._fresh = self._flat_fresh_store(self.flat.num_fresh, *self.flat.fresh_carry)
        # per layer window (None: global) its NativeDecodeAttention, made at its first layer
        # (needs q's heads); with layer groups per (window, layer)
        self._native: dict[object, object] = {}
        self._group_rows: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def _rows(self, name: str, rows: torch.Tensor, layer: int) -> torch.Tensor:
        """A store's layer-0 rows -> `layer`'s rows; with layer groups the pool's rows (of page
        head slices) become the layer's group's slices, plus its index inside the group."""
        groups = self.storage.groups
        if name != "pages" or groups is None:
            return rows + self.flat.layer_offset(name, layer)
        g, index = groups.slot_of(layer)
        hit = self._group_rows.get((id(rows), g))
        if hit is None or hit[0] is not rows:
            stride = self.flat.layer_offset("pages", groups.layers_per_group)  # rows per slice
            block = torch.div(rows, stride, rounding_mode="floor")
            mapped = self.storage.group_tables()[g][block] * stride + (rows - block * stride)
            hit = self._group_rows[(id(rows), g)] = (rows, mapped.to(rows.dtype))
        return hit[1] + self.flat.layer_offset("pages", index)

    @property
    def slot_mapping(self) -> dict[str, torch.Tensor]:
        return self.flat.slot_mapping

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        flat = self.flat
        window = self.layer_window(layer)
        exact = [self._exact_kv(layer, k, v, first, n, carry)
                 for first, n, _, _, carry in flat.prefill]  # before the window writes
        for name, (tokens, rows) in flat.write.items():
            st_k, st_v, st_ks, st_vs = self._store_tensors(name)
            sel = tokens if tokens.numel() != self.num_tokens else slice(None)
            write_kv_flat(k[sel], v[sel], st_k, st_v, st_ks, st_vs,
                          self._rows(name, rows, layer), self.storage.key_mean(name, layer))
        out = None
        if flat.prefill:
            out = torch.empty(q.shape, dtype=torch.float32)
            for i, ((first, n, parts, _, _), exact_kv) in enumerate(zip(flat.prefill, exact)):
                args = [self._store_args(name, rows, layer) for name, rows in parts]
                bias = flat.prefill_bias(i, window)
                out[first:first + n] = gather_prefill_attention(q[first:first + n], args, bias,
                                                                self.sm_scale, exact_kv,
                                                                self.storage.key_mean("pages", layer))
        if flat.decode_tokens.numel():
            q_dec = q if flat.all_gathered else q[flat.decode_tokens]
            out_dec = self._decode(layer, q_dec, window)
            if out is None:
                return out_dec.to(q.dtype)
            out[flat.decode_tokens] = out_dec
        return out.to(q.dtype)

    def _exact_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, first: int, n: int, carry):
        """A windowed prefill row's exact keys and values [c + n, Hkv, D] as its window holds
        them (fp16): the carried positions read from the window, then its new tokens rounded to
        the window's dtype; None for a row without a window."""
        if carry is None:
            return None
        st = self.storage.store("window")
        rows = (carry + self.flat.layer_offset("window", layer)).t().reshape(-1)  # [c * Hkv]
        out = []
        for new, store in ((k[first:first + n], st.k), (v[first:first + n], st.v)):
            carried = torch.index_select(store.view(-1, store.shape[-1]), 0, rows)
            out.append(torch.cat([carried.view(-1, *new.shape[1:]), new.to(store.dtype)]))
        return out[0], out[1]

    def _flat_fresh_store(self, num: int, carry_slots: torch.Tensor, carry_entries: torch.Tensor):
        """The gathered prefill rows' fp16 exact K/V for this step, all layers: (k, v)
        [1, layers, num, Hkv, D], entries `carry_entries` copied now from window slots
        `carry_slots` (positions those rows computed in earlier steps, which this step's window
        writes may overwrite); the new tokens are written per layer like any store."""
        window = self.storage.store("window")
        W = window.block_tokens
        out = []
        for src in (window.k, window.v):
            dst = src.new_empty(1, src.shape[1], num, *src.shape[3:])
            if carry_slots.numel():
                dst[0][:, carry_entries] = src[carry_slots // W, :, carry_slots % W].transpose(0, 1)
            out.append(dst)
        return out[0], out[1]

    def _native_fits(self) -> bool:
        """The C decode attention applies: int8 or fp16 stores, head_dim it takes, a C library."""
        return (self.storage.kv_dtype in ("int8", "fp16")
                and self.storage.pool.k.shape[4] <= NATIVE_MAX_HEAD_DIM
                and cpu_native.library() is not None)

    def _native_attention(self, num_heads: int, head_dim: int, window: int | None = None,
                          layer: int = 0):
        """The C decode attention for this step's gathered rows (cut to `window` for a local
        layer), made once per window (with layer groups per layer: its pool part's rows are
        the layer's own, stride 0); False where it does not apply (float stores, head_dim too
        large, no C library)."""
        grouped = self.storage.groups is not None
        key = (window, layer) if grouped else window
        if key not in self._native:
            gather, gather_lens, _ = self.flat.gather_for(window)
            self._native[key] = False
            if self._fits:
                lib = cpu_native.library()
                parts = []
                for (name, rows), lens in zip(gather, gather_lens):
                    k, v, ks, vs = self._store_tensors(name)
                    stride = self.flat.layer_offset(name, 1)
                    if grouped and name == "pages":  # C adds layer * stride: 0 here
                        rows, stride = self._rows(name, rows, layer), 0
                    parts.append((k, v, ks, vs, rows, lens, stride))
                self._native[key] = NativeDecodeAttention(lib, parts, num_heads, self.sm_scale,
                                                          self.storage.k_means)
        return self._native[key]

    def metadata(self) -> dict:
        """Nothing to upload: the CPU back end's kernels read the host tensors themselves."""
        return {}

    def bind(self, parts: dict) -> "FlatKVContext":
        return self

    def native_decode_args(self, num_heads: int, head_dim: int):
        """Arguments for the one-call C decode step (kernels/cpu_decoder.py), or None where it
        does not apply: a prefill row the C attention does not gather, or no C attention."""
        flat = self.flat
        if not flat.all_gathered or self.num_tokens == 0 or self.has_local_layers:
            return None  # decoder.c reads one gather for every layer
        attention = self._native_attention(num_heads, head_dim)
        if not attention:
            return None
        writes, keep = (KVWrite * len(flat.write))(), []
        for slot, (name, (tokens, rows)) in zip(writes, flat.write.items()):
            st_k, st_v, st_ks, st_vs = self._store_tensors(name)
            tokens, rows = tokens.contiguous(), rows.contiguous()
            keep += [tokens, rows]
            slot.k, slot.v = st_k.data_ptr(), st_v.data_ptr()
            if st_ks is not None:  # no scales: an fp16 store (decoder.c writes it as fp16)
                slot.ks, slot.vs = st_ks.data_ptr(), st_vs.data_ptr()
            slot.tokens, slot.rows, slot.n = tokens.data_ptr(), rows.data_ptr(), tokens.numel()
            slot.layer_stride = flat.layer_offset(name, 1)
            if st_ks is not None and self.storage.k_means is not None:
                slot.kmean = self.storage.k_means.data_ptr()  # all layers: decoder.c advances it
        return NativeDecodeArgs(attention, writes, keep, rotated=self.storage.rotated)

    def _decode(self, layer: int, q_dec: torch.Tensor, window: int | None) -> torch.Tensor:
        """Decode tokens' attention: C over int8 stores when it is built, else torch ops."""
        native = self._native_attention(q_dec.shape[1], q_dec.shape[-1], window, layer)
        if native:  # float32 in and out (a bf16/fp16 model's q is cast; the caller casts back)
            return native(q_dec.float(), layer)
        gather, _, bias = self.flat.gather_for(window)
        parts = [self._store_args(name, rows, layer) for name, rows in gather]
        return gather_decode_attention(q_dec, parts, bias, self.sm_scale,
                                       self.storage.key_mean("pages", layer))

    def _store_tensors(self, name: str):
        """(k, v, k_scale, v_scale) of a store; "fresh": this step's fp16 exact K/V of its
        prefill rows (one layer, rewritten per layer)."""
        if name == "fresh":  # [1, layers, F, Hkv, D] fp16, no scales, as the window
            return self._fresh[0], self._fresh[1], None, None
        st = self.storage.store(name)
        return st.k, st.v, st.k_scale, st.v_scale

    def _store_args(self, name: str, rows: torch.Tensor, layer: int):
        return (*self._store_tensors(name), self._rows(name, rows, layer))
