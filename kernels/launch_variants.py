"""Every Triton kernel variant the engine can launch on a Jetson, as one list: ENGINE_LAUNCHES.

A variant is what Triton compiles a kernel for: its constexprs, its arguments' types, num_warps and
num_stages. Each entry of ENGINE_LAUNCHES calls a real launch wrapper (kernels/kv_write.py,
positional_attention.py, dispatch.py's exact-block call, awq_prepared.py, blocked_w4a16.py) on
small CPU tensors with the parameters the engine passes on the GPU, while `record_launches` catches
each `kernel[grid](...)` instead of running it. So the variants are the wrappers' own choices, never a
copy of them: a wrapper that changes a constexpr changes what is recorded. What a wrapper derives
from the GPU (its SM count: SPLIT_K) is derived with the wrappers' own planning functions for
Orin's SM counts (ORIN_SMS). Attention's variants do not depend on the SM count: its spans are a
fixed number of positions (the canonical reduction order, positional_attention.py).

Adding a model shape, a KV format or a weight format to the engine means adding it here (MODELS,
the dtype tuples, the entries): kernels/aot_compile.py compiles every recorded variant for sm_87
(Orin) and sm_90 without a GPU and checks its shared memory (tests/test_triton_aot.py).

Recording needs TRITON_INTERPRET unset (real JIT kernels); nothing here needs a GPU.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from unittest import mock

import torch

from edge_runtime.kernels import awq_prepared as awp
from edge_runtime.kernels import dispatch
from edge_runtime.kernels.blocked_w4a16 import blocked_gemm_triton
from edge_runtime.kernels.kv_write import write_kv_triton
from edge_runtime.kernels.positional_attention import (merge_in_order_triton,
                                                       positional_attention_triton)
from edge_runtime.kernels.positional_attention_ref import PositionIndex
from edge_runtime.quant.int4_format import BLOCK_N, SUPER_K, BlockedQuantWeight

MODELS = {  # geometry of the models the Orin budgets serve (config.json)
    "smollm2-135m": dict(heads=9, kv_heads=3, head_dim=64, hidden=576, intermediate=1536, group=64,
                         vocab=49152),
    "llama-2-7b": dict(heads=32, kv_heads=32, head_dim=128, hidden=4096, intermediate=11008, group=128,
                       vocab=32000),
}
# the blocked int4/int8 forms QuantLinear holds (quant/int4_format.py, docs/weights.md):
# (bits, group size or None for the model's AWQ group, parameter dtype ("two-level": int8 codes x
# fp16 per 256 inputs, only for K a multiple of 256; "two-level-4": 4-bit codes), offsets, signed,
# codebook)
BLOCKED_FORMS = {
    "gguf-q4_0-q4_1": (4, 32, "fp16", True, False, False),  # the built-in SmolLM2's layers
    "gguf-q8_0": (8, 32, "fp16", False, False, False),  # its embedding / LM head
    "gguf-q4_k": (4, 32, "two-level", True, False, False),
    "gguf-q6_k": (6, 16, "two-level", False, True, False),
    "gguf-q5_0": (5, 32, "fp16", False, True, False),  # most of a small model's Q4_K_M file
    "gguf-q5_1": (5, 32, "fp16", True, False, False),
    "gguf-q5_k": (5, 32, "two-level", True, False, False),
    "gguf-q2_k": (2, 16, "two-level-4", True, False, False),
    "gguf-q3_k": (3, 16, "two-level", False, True, False),
    "gguf-iq4_nl": (4, 32, "fp16", False, False, True),
    "gguf-iq4_xs": (4, 32, "two-level", False, False, True),
    "awq": (4, None, "fp32", True, False, False),
}
ACT_DTYPES = ("fp16", "fp32")  # the model's dtype on CUDA: the budget's weight_dtype
KV_FORMATS = (("int8", False), ("int8", True), ("fp16", False))  # KV dtype, centred keys
PAGE_TOKENS = 512
ORIN_SMS = (8, 16)  # Orin Nano / NX (1024 CUDA cores), AGX Orin (2048)
DECODE_ROWS = (1, 5, 16)  # W4A16 rows: one stream, the 5-stream batch, the gemv class's edge
PREFILL_ROWS = (64, 512)  # a short prefill chunk (tiled kernel), a long one (dequantize + matmul)

ENGINE_LAUNCHES = [
    *[("write_kv", dict(model=m, act=a, kv=kv, centred=c))
      for m in MODELS for a in ACT_DTYPES for kv, c in KV_FORMATS],
    *[("positional_attention", dict(model=m, act=a, kv=kv, centred=c, inline=i, windowed=False))
      for m in MODELS for a in ACT_DTYPES for kv, c in KV_FORMATS for i in (False, True)],
    # a sliding-window layer's reads (key_start, kv/layer_windows.py): the engine's inline default
    *[("positional_attention", dict(model=m, act=a, kv=kv, centred=c, inline=True, windowed=True))
      for m in MODELS for a in ACT_DTYPES for kv, c in KV_FORMATS],
    *[("exact_block_attention", dict(model=m, act=a)) for m in MODELS for a in ACT_DTYPES],
    *[("merge_in_order", dict(model=m, extra=e)) for m in MODELS for e in (False, True)],
    *[("awq_gemm_prepared", dict(model=m, rows=r, sms=sms))
      for m in MODELS for r in (*DECODE_ROWS, *PREFILL_ROWS) for sms in ORIN_SMS],
    *[("blocked_gemm", dict(model=m, act=a, form=f, rows=r))
      for m in MODELS for a in ACT_DTYPES for f in BLOCKED_FORMS for r in (*DECODE_ROWS, *PREFILL_ROWS)],
]


@dataclass(frozen=True)
class Launch:
    kernel: str  # module.function of the @triton.jit kernel
    signature: tuple  # ((argument, Triton type or "constexpr"), ...) in the kernel's order
    constexprs: tuple  # ((argument, value), ...): declared constexprs and ints Triton specialises
    divisible: tuple  # arguments given tt.divisibility=16, as the JIT does
    num_warps: int
    num_stages: int


_TYPES = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.int8: "*i8",
          torch.uint8: "*u8", torch.int32: "*i32", torch.int64: "*i64"}


def _argument(value) -> tuple[str, bool]:
    """-> (Triton type, divisible by 16) of a runtime argument, as the JIT sees it."""
    if isinstance(value, torch.Tensor):  # meta tensors: as a GPU allocation, 16-byte aligned
        return _TYPES[value.dtype], value.device.type == "meta" or value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return "i1", False
    if isinstance(value, int):
        return ("i32" if -2**31 <= value < 2**31 else "i64"), value % 16 == 0
    if isinstance(value, float):
        return "fp32", False
    raise TypeError(f"no Triton type for {type(value).__name__}")


def launch_of(fn, args: tuple, kwargs: dict) -> Launch:
    """The variant a `fn[grid](*args, **kwargs)` call compiles."""
    names = [p.name for p in fn.params]
    bound = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
    signature, constexprs, divisible = [], {}, []
    for p in fn.params:
        value = bound[p.name]
        if p.do_not_specialize:  # `do_not_specialize`: typed by value, never a constant or aligned
            signature.append((p.name, _argument(value)[0]))
            continue
        if p.is_constexpr or value is None or (type(value) is int and value == 1):
            signature.append((p.name, "constexpr"))
            constexprs[p.name] = value
            continue
        kind, div = _argument(value)
        signature.append((p.name, kind))
        if div:
            divisible.append(p.name)
    return Launch(f"{fn.fn.__module__}.{fn.fn.__name__}", tuple(signature),
                  tuple(sorted(constexprs.items())), tuple(divisible),
                  kwargs.get("num_warps", 4), kwargs.get("num_stages", 3))


@contextlib.contextmanager
def record_launches():
    """Within: every JIT kernel launch is recorded (not run) into the yielded list."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append(launch_of(self, args, kwargs))

    with mock.patch.object(JITFunction, "run", record):
        yield launches


@contextlib.contextmanager
def orin_device(sms: int):
    """torch.cuda.get_device_properties answering like an Orin with `sms` SMs (plans only)."""
    props = type("OrinProperties", (), {"multi_processor_count": sms})()
    with mock.patch.object(torch.cuda, "get_device_properties", lambda *a, **k: props):
        yield type("OrinDevice", (), {"type": "cuda"})()


def _dtype(name: str) -> torch.dtype:
    return {"fp16": torch.float16, "fp32": torch.float32, "int8": torch.int8}[name]


def _pool(m: dict, kv: str, pages: int = 4):
    shape = (pages, PAGE_TOKENS, m["kv_heads"], m["head_dim"])
    k, v = torch.zeros(shape, dtype=_dtype(kv)), torch.zeros(shape, dtype=_dtype(kv))
    scales = [torch.ones(shape[:3], dtype=torch.float16) for _ in range(2)] if kv == "int8" else [None, None]
    return k, v, *scales


def _write_kv(model, act, kv, centred):
    m = MODELS[model]
    k = torch.zeros(3, m["kv_heads"], m["head_dim"], dtype=_dtype(act))
    mean = torch.zeros(m["kv_heads"], m["head_dim"]) if centred else None
    write_kv_triton(k, k.clone(), *_pool(m, kv), torch.tensor([0, 1, 2]), mean)


def _attention_args(model, act, kv, centred, tokens, pages=3):
    m = MODELS[model]
    q = torch.zeros(tokens, m["heads"], m["head_dim"], dtype=_dtype(act))
    table = torch.zeros(2, pages, dtype=torch.int32)
    seq = torch.zeros(tokens, dtype=torch.int32)
    lens = torch.full((tokens,), 700, dtype=torch.int32)  # each token sees 700 keys
    mean = torch.zeros(m["kv_heads"], m["head_dim"]) if centred else None
    return q, _pool(m, kv), (table, seq, lens), mean


def _positional_attention(model, act, kv, centred, inline, windowed):
    q, pool, (table, seq, lens), mean = _attention_args(model, act, kv, centred, tokens=2)
    arena = _pool(MODELS[model], kv, pages=2) if inline else None
    start = torch.full_like(lens, 200) if windowed else None  # each token's window starts at 200
    index = PositionIndex(table, table, seq, lens, torch.zeros(2, 3, dtype=torch.int32), 256, 3,
                          key_start=start)
    positional_attention_triton(q, pool, arena, index, 0.125, k_mean=mean)


def _exact_block_attention(model, act):
    m = MODELS[model]
    q = torch.zeros(40, m["heads"], m["head_dim"], dtype=_dtype(act))
    window = torch.zeros(3, 16, m["kv_heads"], m["head_dim"], dtype=torch.float16)  # fp16 blocks
    table = torch.arange(3, dtype=torch.int32)[:, None]
    with dispatch.prefer_triton():
        dispatch.exact_block_attention(q, window, window, table, torch.zeros(40, dtype=torch.int32),
                                       torch.full((40,), 5, dtype=torch.int32), 0.125)


def _merge_in_order(model, extra):
    m = MODELS[model]
    p_out = torch.zeros(2, m["heads"], 3, m["head_dim"])
    p_lse = torch.zeros(2, m["heads"], 3)
    merge_in_order_triton(p_out, p_lse, (p_out[:, :, 0], p_lse[:, :, 0]) if extra else None)


def _linear_shapes(m: dict) -> set[tuple[int, int]]:
    """(N, K) of the decoder's linears: q, k and v, o, gate and up, down."""
    hd, kv = m["heads"] * m["head_dim"], m["kv_heads"] * m["head_dim"]
    return {(hd, m["hidden"]), (kv, m["hidden"]), (m["hidden"], hd),
            (m["intermediate"], m["hidden"]), (m["hidden"], m["intermediate"])}


def _awq_gemm_prepared(model, rows, sms):
    m = MODELS[model]
    g = m["group"]
    meta = dict(device="meta")  # no memory, no compute: the prefill path's fp16 matmul is free
    for n, k in sorted(_linear_shapes(m)):
        packed = awp.PreparedAWQ(torch.empty(k // 8, n, dtype=torch.int32, **meta),
                                 torch.empty(k // g, n, dtype=torch.uint8, **meta),
                                 torch.empty(k // g, n, dtype=torch.float16, **meta),
                                 torch.empty(n // 8 + 1, dtype=torch.int32, **meta), g)
        with orin_device(sms) as device:
            split = awp.launch_plan(rows, n, k, g, device, None).get("split_k", 1)
        awp.awq_gemm_prepared_triton(torch.empty(rows, k, dtype=torch.float16, **meta), packed,
                                     tune={"split_k": split})


def _blocked_gemm(model, act, form, rows):
    m = MODELS[model]
    bits, group, params, offsets, signed, codebook = BLOCKED_FORMS[form]
    group = group or m["group"]
    meta = dict(device="meta")
    two_level = params.startswith("two-level")
    for n, k in sorted(_linear_shapes(m) | {(m["vocab"], m["hidden"])}):  # the head too
        if two_level and k % SUPER_K:
            continue  # a K-type tensor's rows are whole super-blocks
        nb = -(-n // BLOCK_N)
        data = (torch.empty(nb, k, bits * 2, dtype=torch.uint8, **meta) if bits != 8
                else torch.empty(nb, k, 16, dtype=torch.int8, **meta))
        if params == "two-level-4":  # two groups a byte
            scales = torch.empty(nb, k // group // 2, 16, dtype=torch.uint8, **meta)
        else:
            scales = torch.empty(nb, k // group, 16,
                                 dtype=torch.int8 if two_level else _dtype(params), **meta)
        supers = [torch.empty(nb, k // SUPER_K, 16, dtype=torch.float16, **meta) if two_level
                  else None for _ in range(2)]
        weight = BlockedQuantWeight(data, scales, torch.empty_like(scales) if offsets else None,
                                    bits, group, n, k, signed, supers[0],
                                    supers[1] if offsets else None,
                                    torch.empty(16, dtype=torch.int8, **meta) if codebook else None)
        blocked_gemm_triton(torch.empty(rows, k, dtype=_dtype(act), **meta), weight)


RUNNERS = {"write_kv": _write_kv, "positional_attention": _positional_attention,
           "exact_block_attention": _exact_block_attention, "merge_in_order": _merge_in_order,
           "awq_gemm_prepared": _awq_gemm_prepared, "blocked_gemm": _blocked_gemm}


def engine_variants() -> list[Launch]:
    """The distinct variants ENGINE_LAUNCHES records, in first-seen order."""
    with record_launches() as launches:
        for op, params in ENGINE_LAUNCHES:
            RUNNERS[op](**params)
    return list(dict.fromkeys(launches))
