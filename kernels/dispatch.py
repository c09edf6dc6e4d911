"""Kernel choice per op: Triton on CUDA tensors, the torch reference elsewhere.

Inside `prefer_triton()` CPU tensors take the Triton kernels too: the CUDA back end runs that way
on a CPU under TRITON_INTERPRET=1 (engine/backend.py), so CI runs the GPU's kernels without a GPU.
Every Triton launch made through here is counted in `TRITON_LAUNCHES` (op -> calls), which is how
tests show that the Triton kernels really ran.

`describe_backends(device)` reports what a call here with tensors on `device` would use, op ->
"triton" | "torch-reference" | "torch-int4pack-cpu". What the engine runs as a whole (the CPU back
end's C paths included) is named by its back end, engine/backend.py `describe()`.

W4A16 on CPU: `AWQLinear` (model/awq_linear.py) repacks its weights once for torch's CPU int4 op
and calls that directly; `awq_gemm` here (the dequantizing reference) is only its fallback, so
`describe_backends` names "torch-int4pack-cpu" for awq_gemm on CPU when torch has that op.
"""
import contextlib
import contextvars
from collections import Counter

import torch

from edge_runtime.kernels import awq_gemm as _awq
from edge_runtime.kernels import awq_prepared as _awp
from edge_runtime.kernels import blocked_w4a16 as _bq
from edge_runtime.kernels import kv_write as _kv
from edge_runtime.kernels import paged_attention as _pa
from edge_runtime.kernels import positional_attention as _pos

OPS = ("write_kv", "paged_attention", "merge_attention", "awq_gemm", "awq_gemm_prepared",
       "positional_attention", "exact_block_attention", "merge_in_order", "blocked_gemm")


TRITON_LAUNCHES: Counter = Counter()
_TRITON_ON_CPU = contextvars.ContextVar("triton_on_cpu", default=False)


def triton_available() -> bool:
    """True when triton imports and a CUDA device is visible."""
    return _kv.triton is not None and torch.cuda.is_available()


def triton_importable() -> bool:
    return _kv.triton is not None


@contextlib.contextmanager
def prefer_triton():
    """Calls inside take the Triton kernels on CPU tensors too (under TRITON_INTERPRET=1)."""
    token = _TRITON_ON_CPU.set(True)
    try:
        yield
    finally:
        _TRITON_ON_CPU.reset(token)


def device_kernels(t: torch.Tensor) -> bool:
    """Whether a call on `t` takes the CUDA back end's kernels: a CUDA tensor, or any tensor
    inside `prefer_triton()` (the interpreter). Modules with a CPU kernel of their own (the
    quantized linears, kernels/cpu_int4.py) ask this to choose between the two."""
    return t.is_cuda or _TRITON_ON_CPU.get()


def _use_triton(t: torch.Tensor, op: str) -> bool:
    return ((t.is_cuda or _TRITON_ON_CPU.get()) and _kv.triton is not None
            and hasattr(_IMPLS[op], "triton"))


def _counted(op: str, fn):
    def launch(*args, **kwargs):
        TRITON_LAUNCHES[op] += 1
        return fn(*args, **kwargs)
    return launch


class _Impl:
    def __init__(self, op: str, ref, triton_fn=None):
        self.ref = ref
        if triton_fn is not None:
            self.triton = _counted(op, triton_fn)


def _exact_block_triton(q, k_cache, v_cache, block_table, seq_idx, kv_lens, sm_scale):
    return _pa.paged_attention_triton(q, k_cache, v_cache, None, None, block_table, seq_idx, kv_lens,
                                      sm_scale, num_splits=1, per_token=True)


_IMPLS = {
    "write_kv": _Impl("write_kv", _kv.write_kv_ref, getattr(_kv, "write_kv_triton", None)),
    "paged_attention": _Impl("paged_attention", _pa.paged_attention_ref,
                             getattr(_pa, "paged_attention_triton", None)),
    "merge_attention": _Impl("merge_attention", _pa.merge_attention_ref,
                             getattr(_pa, "merge_attention_triton", None)),
    "awq_gemm": _Impl("awq_gemm", _awq.awq_gemm_ref, getattr(_awq, "awq_gemm_triton", None)),
    "awq_gemm_prepared": _Impl("awq_gemm_prepared", _awp.awq_gemm_prepared_ref,
                               _awp.awq_gemm_prepared_triton if _awp.triton is not None else None),
    "positional_attention": _Impl("positional_attention", _pos.positional_attention_ref,
                                  _pos.positional_attention_triton if _pos.triton is not None else None),
    "exact_block_attention": _Impl("exact_block_attention", _pa.paged_attention_ref,
                                   _exact_block_triton if _pa.triton is not None else None),
    "merge_in_order": _Impl("merge_in_order", _pos.merge_in_order_ref,
                            _pos.merge_in_order_triton if _pos.triton is not None else None),
    "blocked_gemm": _Impl("blocked_gemm", _bq.blocked_gemm_ref,
                          _bq.blocked_gemm_triton if _bq.triton is not None else None),
}


def _pick(op: str, t: torch.Tensor):
    impl = _IMPLS[op]
    return impl.triton if _use_triton(t, op) else impl.ref


def write_kv(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean=None, chunks=None) -> None:
    """k_mean: the layer's mean key [Hkv, D] float32 for centred int8 keys (kernels/quantize.py).
    chunks: where a chunked store's pages live (kernels/page_chunks.py; the caches are chunk 0's)."""
    _pick("write_kv", k)(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean, chunks=chunks)


def paged_attention(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, sm_scale,
                    k_mean=None, chunks=None):
    """k_mean: the int8 store's mean key [Hkv, D] float32 (centred keys) or None; chunks: a
    chunked store's PageChunks (kernels/page_chunks.py) or None. (The page-tile decode kernel,
    tools/gpu_lab/paged_decode.py, is the GPU checks' baseline, called by them directly.)"""
    return _pick("paged_attention", q)(q, k_cache, v_cache, k_scale, v_scale, block_table,
                                       seq_idx, kv_lens, sm_scale, k_mean=k_mean, chunks=chunks)


def positional_attention(q, pool, arena, index, sm_scale, k_mean=None, chunks=None):
    """Keys [0, index.key_end) of every token, read by position from the pool (prefix and tail
    pages) and the arena (inline slots), in spans of fixed absolute size -> per-span partials
    (out [T, H, S, D], lse [T, H, S]); kernels/positional_attention.py. pool, arena: (k, v,
    k_scale, v_scale) of one layer; arena None without inline slots. chunks: a chunked pool's
    PageChunks (kernels/page_chunks.py; the pool's tensors are chunk 0's) or None."""
    return _pick("positional_attention", q)(q, pool, arena, index, sm_scale, k_mean=k_mean,
                                            chunks=chunks)


def exact_block_attention(q, k_cache, v_cache, block_table, seq_idx, kv_lens, sm_scale):
    """Paged attention over a float store with one program per query token, whatever its row
    (the recent-key window's exact blocks, kv/paged_context.py): a token's result does not depend
    on the other tokens of the step, so prefill and decode read a block the same way."""
    if _use_triton(q, "exact_block_attention"):
        return _IMPLS["exact_block_attention"].triton(q, k_cache, v_cache, block_table, seq_idx,
                                                      kv_lens, sm_scale)
    return _pa.paged_attention_ref(q, k_cache, v_cache, None, None, block_table, seq_idx, kv_lens,
                                   sm_scale)


def merge_in_order(p_out, p_lse, extra=None):
    """Partials [T, H, S, D] / [T, H, S] (+ one extra (out, lse) last) merged in index order."""
    return _pick("merge_in_order", p_out)(p_out, p_lse, extra)


def merge_attention(outs, lses):
    return _pick("merge_attention", outs[0])(outs, lses)


def awq_gemm(x, qweight, qzeros, scales, group_size):
    return _pick("awq_gemm", x)(x, qweight, qzeros, scales, group_size)


def prepare_awq(qweight, qzeros, scales, group_size):
    """AutoAWQ GEMM tensors -> PreparedAWQ (kernels/awq_prepared.py), once at load time, on the
    tensors' device; `awq_gemm_prepared` then runs W4A16 on it."""
    return _awp.prepare_awq_weight(qweight, qzeros, scales, group_size)


def awq_gemm_prepared(x, packed):
    return _pick("awq_gemm_prepared", x)(x, packed)


def blocked_gemm(x, weight):
    """x [M, K] @ W^T for a BlockedQuantWeight W (quant/int4_format.py) -> [M, N] in x's dtype:
    the W4A16 / W8A16 Triton kernel of kernels/blocked_w4a16.py, or its reference."""
    return _pick("blocked_gemm", x)(x, weight)


def describe_backends(device=None) -> dict:
    """op -> backend name that a call with tensors on `device` (default: cuda if present) uses."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    on_cuda = torch.device(device).type == "cuda" and _kv.triton is not None
    names = {op: ("triton" if on_cuda and hasattr(_IMPLS[op], "triton") else "torch-reference")
             for op in OPS}
    if not on_cuda and cpu_int4pack_available():
        names["awq_gemm"] = "torch-int4pack-cpu"
    return names


def cpu_int4pack_available() -> bool:
    ops = torch.ops.aten
    return hasattr(ops, "_convert_weight_to_int4pack_for_cpu") and hasattr(ops, "_weight_int4pack_mm_for_cpu")
