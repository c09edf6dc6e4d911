"""A decode step's whole layer stack in one C call (kernels/csrc/decoder.c) on the CPU.

Why: with the linears reading weights at the machine's bandwidth (c-blocked), the per-layer torch
ops and Python around them were half of a batch-1 step (docs/perf.md, "CPU decode step").

`FusedDecoder.for_model(model)` exists when every layer's linears are c-blocked fp32 (PackedLinear,
model/linear_packing.py) or blocked quantized (QuantLinear, kernels/cpu_int4.py) and the C library
is built; `EDGE_RUNTIME_CPU_FUSED=0` turns it
off (A/B runs, tests). `CausalLM.forward` uses it for a step whose KV context offers
`native_decode_args()` (kv/flat_context.py: the CPU back end, int8 or fp16 KV, every new token a
row of the C attention: decode tokens and prefill chunks alike); any other step runs the layers in
torch as before. Running every step here is what makes a position's logits independent of the
step it is computed in (docs/engine.md, "What a position reads"): every row goes through the same
C linears (never BLAS, whose sums depend on the number of rows), norms, rope and attention. The
reference is that layer loop:
tests compare logits and the KV written (tests/test_kernel_cpu_decoder.py).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from edge_runtime import env
from edge_runtime.kernels.cpu_int4 import BlockedWeight, QuantLinear, blocked_weight_struct
from edge_runtime.kernels import cpu_native
from edge_runtime.kernels.cpu_linear import PackedLinear
from edge_runtime.kernels.cpu_native import FlatPart

if TYPE_CHECKING:
    from edge_runtime.kernels.flat_kv_cpu import NativeDecodeAttention

ENV_SWITCH = env.CPU_FUSED


class LayerWeights(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p)] + [
        (name, BlockedWeight if name.endswith("_w") else ctypes.c_void_p)
        for name in ("qkv_w", "qkv_b", "o_w", "o_b", "gate_up_w", "gate_up_b", "down_w", "down_b")
    ] + [("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p)]  # [D] each, or NULL (Qwen3)


class DecoderDims(ctypes.Structure):
    _fields_ = [("num_layers", ctypes.c_int64), ("hidden", ctypes.c_int64),
                ("num_heads", ctypes.c_int64), ("num_kv_heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("intermediate", ctypes.c_int64),
                ("eps", ctypes.c_float), ("rotate_kv", ctypes.c_int64)]


class KVWrite(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("ks", ctypes.c_void_p),
                ("vs", ctypes.c_void_p), ("tokens", ctypes.c_void_p), ("rows", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("layer_stride", ctypes.c_int64),
                ("kmean", ctypes.c_void_p)]  # [layers, Hkv, D] mean keys (centred keys) or NULL


@dataclass
class NativeDecodeArgs:
    """What the C step needs from a KV context: the attention parts (flat_kv_cpu's
    NativeDecodeAttention) and where each new token's K/V goes."""

    attention: NativeDecodeAttention  # parts, layer_strides, scratch
    writes: ctypes.Array
    keep: list  # tensors the pointers above point into
    rotated: bool = False  # the store holds Hadamard-rotated K/V heads (kernels/hadamard.py)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _declare(lib) -> None:
    fn = lib.decode_layers
    if fn.argtypes is None:
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(DecoderDims), ctypes.POINTER(LayerWeights), ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(KVWrite),
                       ctypes.c_int, ctypes.POINTER(FlatPart), ctypes.POINTER(ctypes.c_int64),
                       ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_int]


class FusedDecoder:
    """The layer stack of one packed fp32 Llama-architecture CausalLM as C arguments, made once."""

    def __init__(self, lib, model) -> None:
        cfg = model.config
        self.lib = lib
        _declare(lib)
        layers = model.model.layers
        self.dims = DecoderDims(len(layers), cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                                cfg.head_dim, cfg.intermediate_size,
                                float(layers[0].input_layernorm.eps), 0)
        self.layers = (LayerWeights * len(layers))()
        self._keep = []  # the tensors behind the pointers (the model holds them too)
        for slot, layer in zip(self.layers, layers):
            a, m = layer.self_attn, layer.mlp
            tensors = dict(input_norm=layer.input_layernorm.weight.detach(),
                           post_norm=layer.post_attention_layernorm.weight.detach(),
                           qkv_b=a.qkv_proj.bias, o_b=a.o_proj.bias, gate_up_b=m.gate_up_proj.bias,
                           down_b=m.down_proj.bias,
                           q_norm=None if a.q_norm is None else a.q_norm.weight.detach(),
                           k_norm=None if a.k_norm is None else a.k_norm.weight.detach())
            for name, t in tensors.items():
                assert t is None or (t.dtype == torch.float32 and t.is_contiguous()), name
                setattr(slot, name, _ptr(t))
            for name, mod in (("qkv_w", a.qkv_proj), ("o_w", a.o_proj),
                              ("gate_up_w", m.gate_up_proj), ("down_w", m.down_proj)):
                setattr(slot, name, blocked_weight_struct(mod))  # fp32 or quantized blocks
            self._keep.append((tensors, a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj))

    @classmethod
    def for_model(cls, model) -> "FusedDecoder | None":
        """The fused stack when `model` qualifies (see the module doc), else None."""
        if not env.cpu_fused_decoder() or not cls.carries(model.config):
            return None
        lib = cpu_native.library()
        if lib is None:
            return None
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            mods = (getattr(a, "qkv_proj", None), getattr(a, "o_proj", None),
                    getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None))
            if not all((isinstance(x, PackedLinear) and x.kind == "c-blocked")
                       or isinstance(x, QuantLinear) for x in mods):
                return None
            norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight) + tuple(
                n.weight for n in (layer.self_attn.q_norm, layer.self_attn.k_norm) if n is not None)
            if any(w.dtype != torch.float32 for w in norms):
                return None
        return cls(lib, model)

    @staticmethod
    def carries(config) -> bool:
        """The C step implements this family's layer: Llama's, plus Qwen3's q/k head norms.
        Gemma 3's (sandwich and (1 + w) norms, GeGLU, local layers with their own rotary) and
        SmolLM3's (layers without rotary) run the torch layer loop over the same KV context."""
        return not (config.sandwich_norms or config.norm_unit_offset or config.has_local_layers
                    or config.hidden_act != "silu" or config.embed_scale is not None
                    or (config.rope_layers is not None and not all(config.rope_layers)))

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 args: NativeDecodeArgs, sm_scale: float) -> torch.Tensor:
        """x: [R, hidden] fp32 (the embeddings; consumed); cos, sin: [R, 1, D] -> hidden states
        after the last layer, [R, hidden] (before the final norm)."""
        r, dm = x.shape[0], self.dims
        att = args.attention
        assert x.dtype == torch.float32 and r == att.num_rows and att.num_heads == dm.num_heads
        x = x.contiguous()
        dm.rotate_kv = int(args.rotated)
        cos = cos.reshape(r, dm.head_dim).contiguous()
        sin = sin.reshape(r, dm.head_dim).contiguous()
        qkv = (dm.num_heads + 2 * dm.num_kv_heads) * dm.head_dim
        threads = torch.get_num_threads()
        # decoder.c's buffers: a linear's output, q/k/v, attention out, gate/up, silu(gate) * up,
        # and each thread's normed input
        work = torch.empty(r * (dm.hidden + qkv + dm.num_heads * dm.head_dim + 3 * dm.intermediate
                                + threads * dm.hidden), dtype=torch.float32)
        strides = (ctypes.c_int64 * len(att.layer_strides))(*att.layer_strides)
        att.set_layer(0)  # parts' kmean: all layers' means, which decoder.c advances per layer
        rc = self.lib.decode_layers(ctypes.byref(self.dims), self.layers, x.data_ptr(), r,
                                    cos.data_ptr(), sin.data_ptr(), args.writes, len(args.writes),
                                    att.parts, strides, len(att.parts), sm_scale, work.data_ptr(),
                                    att.scratch.data_ptr(), att.scratch_stride, threads)
        assert rc == 0, f"decode_layers returned {rc}"
        return x


TIMED_THREADS = 16  # decoder.c times the first 16 threads
DECODER_PHASES = ("norm + q/k/v", "rope, rotation, KV writes", "attention + rotation back",
                  "o_proj + residual", "norm + gate/up + silu*up", "down_proj + residual")


def read_phase_times(lib, threads: int) -> list[dict] | None:
    """The decode step's per-phase timers since the last read (kernels/csrc/decoder.c, built with
    EDGE_RUNTIME_CPU_PHASE_TIMES=1; None in a build without them), restarted from zero: per phase,
    `all_s` (the phase's time, the slowest thread's, waiting included) and `work_s` per thread
    (until it reached the phase's closing barrier), seconds summed over layers and steps."""
    if lib is None or not hasattr(lib, "decoder_phase_times"):
        return None
    threads, phases = min(threads, TIMED_THREADS), len(DECODER_PHASES)
    buf = (ctypes.c_double * (threads * 2 * phases))()
    assert lib.decoder_phase_times(buf, threads) == phases
    work = [[buf[(t * 2) * phases + i] for t in range(threads)] for i in range(phases)]
    every = [[buf[(t * 2 + 1) * phases + i] for t in range(threads)] for i in range(phases)]
    return [{"phase": name, "all_s": max(every[i]), "work_s": work[i]}
            for i, name in enumerate(DECODER_PHASES)]
