"""The CPU back end's KVContext (edge_runtime/model/kv_interface.py) for one engine step.

The same segments as the CUDA back end's per-segment calls (engine/paged_kv.py) are turned once
per step into slot mappings and row numbers of the whole store (engine/flat_kv_index.py);
kernels/flat_kv_cpu.py writes K/V and attends each decode token over prefix + tail in one softmax
(C for int8 stores, kernels/csrc/flat_kv.c) and each prefill row through one causal SDPA call.
An all-decode int8 step also offers `native_decode_args` for the one-call C layer stack
(kernels/cpu_decoder.py).

Invariants: as engine/paged_kv.py's (new tokens outside the shared prefix, tail storage reserved,
indexes built once per step in `__init__`, never per layer); the storage is on the CPU.
"""

from __future__ import annotations

import torch

from edge_runtime.engine.flat_kv_index import FlatKVIndex
from edge_runtime.engine.kv_context import StepKVContext
from edge_runtime.engine.kv_storage import KVStorage
from edge_runtime.kernels import cpu_native
from edge_runtime.kernels.flat_kv_cpu import (NATIVE_MAX_HEAD_DIM, NativeDecodeAttention,
                                              gather_decode_attention, gather_prefill_attention,
                                              write_kv_flat)


class FlatKVContext(StepKVContext):
    """Per-step flat-row view of the CPU storage; pass to CausalLM.forward as `kv`."""

    def __init__(self, storage: KVStorage, seqs: list, sm_scale: float):
        super().__init__(storage, seqs, sm_scale)
        assert storage.device.type == "cpu", f"the flat KV paths run on the CPU, not {storage.device}"
        self.flat = FlatKVIndex(storage, seqs)
        self.slot_mapping = self.flat.slot_mapping
        self._native = None  # NativeDecodeAttention, made at the first layer (needs q's heads)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        flat = self.flat
        for name, (tokens, rows) in flat.write.items():
            st = self.storage.store(name)
            sel = tokens if tokens.numel() != self.num_tokens else slice(None)
            write_kv_flat(k[sel], v[sel], st.k, st.v, st.k_scale, st.v_scale,
                          rows + flat.layer_offset(name, layer), self.storage.key_mean(name, layer))
        out = None
        if flat.prefill:
            out = torch.empty(q.shape, dtype=torch.float32)
            for first, n, parts, bias, fresh in flat.prefill:
                args = [self._store_args(name, rows, layer) for name, rows in parts]
                new_kv = (k[first:first + n], v[first:first + n]) if fresh else None
                out[first:first + n] = gather_prefill_attention(q[first:first + n], args, bias,
                                                                self.sm_scale, new_kv,
                                                                self.storage.key_mean("pages", layer))
        if flat.decode_tokens.numel():
            q_dec = q if flat.all_decode else q[flat.decode_tokens]
            out_dec = self._decode(layer, q_dec)
            if out is None:
                return out_dec.to(q.dtype)
            out[flat.decode_tokens] = out_dec
        return out.to(q.dtype)

    def _native_attention(self, num_heads: int, head_dim: int):
        """The C decode attention for this step's decode tokens, made once; False where it does
        not apply (float stores, head_dim too large, no C library)."""
        if self._native is None:
            flat = self.flat
            fits = self.storage.kv_dtype == "int8" and head_dim <= NATIVE_MAX_HEAD_DIM
            lib = cpu_native.library() if fits else None
            self._native = False
            if lib is not None:
                parts = []
                for (name, rows), lens in zip(flat.gather, flat.gather_lens):
                    st = self.storage.store(name)
                    parts.append((st.k, st.v, st.k_scale, st.v_scale, rows, lens,
                                  flat.layer_offset(name, 1)))
                self._native = NativeDecodeAttention(lib, parts, num_heads, self.sm_scale,
                                                     self.storage.k_means)
        return self._native

    def native_decode_args(self, num_heads: int, head_dim: int):
        """Arguments for the one-call C decode step (kernels/cpu_decoder.py), or None where it
        does not apply: a prefill row in the step, or no C attention."""
        from edge_runtime.kernels.cpu_decoder import KVWrite, NativeDecodeArgs

        flat = self.flat
        if not flat.all_decode or self.num_tokens == 0:
            return None
        attention = self._native_attention(num_heads, head_dim)
        if not attention:
            return None
        writes, keep = (KVWrite * len(flat.write))(), []
        for slot, (name, (tokens, rows)) in zip(writes, flat.write.items()):
            st = self.storage.store(name)
            tokens, rows = tokens.contiguous(), rows.contiguous()
            keep += [tokens, rows]
            slot.k, slot.v = st.k.data_ptr(), st.v.data_ptr()
            if st.k_scale is not None:  # no scales: the fp16 window (decoder.c writes it as fp16)
                slot.ks, slot.vs = st.k_scale.data_ptr(), st.v_scale.data_ptr()
            slot.tokens, slot.rows, slot.n = tokens.data_ptr(), rows.data_ptr(), tokens.numel()
            slot.layer_stride = flat.layer_offset(name, 1)
            if st.k_scale is not None and self.storage.k_means is not None:
                slot.kmean = self.storage.k_means.data_ptr()  # all layers: decoder.c advances it
        return NativeDecodeArgs(attention, writes, keep, rotated=self.storage.rotated)

    def _decode(self, layer: int, q_dec: torch.Tensor) -> torch.Tensor:
        """Decode tokens' attention: C over int8 stores when it is built, else torch ops."""
        flat = self.flat
        native = self._native_attention(q_dec.shape[1], q_dec.shape[-1])
        if native:  # float32 in and out (a bf16/fp16 model's q is cast; the caller casts back)
            return native(q_dec.float(), layer)
        parts = [self._store_args(name, rows, layer) for name, rows in flat.gather]
        return gather_decode_attention(q_dec, parts, flat.mask_bias, self.sm_scale,
                                       self.storage.key_mean("pages", layer))

    def _store_args(self, name: str, rows: torch.Tensor, layer: int):
        st = self.storage.store(name)
        return st.k, st.v, st.k_scale, st.v_scale, rows + self.flat.layer_offset(name, layer)
