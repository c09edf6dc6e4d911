"""The engine's two back ends, chosen once when an Engine is built (docs/engine.md, "Back ends").

- CPU back end: flat KV rows (kv/flat_context.py) with the C kernels of kernels/csrc, fp32 linears
  packed for kernels/cpu_linear.py and, for every step with int8 or fp16 KV (prefill chunks
  included), the one-call C layer stack (kernels/cpu_decoder.py).
- CUDA back end: the paged store read by position (kv/paged_context.py) by the Triton kernels of
  kernels/dispatch.py, torch linears in the model's weight dtype (fp16 on the Orin budgets), a
  GGUF's own int4/int8 blocks and AWQ layers (QuantLinear) through the blocked W4A16 Triton kernel
  (kernels/blocked_w4a16.py) on the bytes the CPU kernels read. On a CPU device
  (`--device cpu --backend cuda`) it runs the same code on CPU tensors through the Triton
  interpreter (TRITON_INTERPRET=1): slow, for tests; CI shows with it that the two back ends agree.

A back end offers what the engine needs and nothing on the hot path asks which one it is:
`context(storage, steps, sm_scale)` (the step's KVContext, built on the host), `transfers()` (the
step's host<->device copies, engine/step_transfers.py), `sampler(transfers)` (engine/sampler.py
on the host, engine/device_sampler.py where the logits are), `forward(...)` (the model call),
`prepare_model(model)` (weight surgery for this back end, once, before the Engine is built) and
`describe()` (the back end and every kernel it runs, for plan, /metrics and the bench JSON).

Invariant: a model is prepared for one back end only (`CausalLM.prepared_for`); an Engine refuses
a model prepared for the other, or not prepared at all.
"""

from __future__ import annotations

import contextlib

import torch

from edge_runtime import env
from edge_runtime.errors import ConfigError
from edge_runtime.engine.device_sampler import DeviceSampler
from edge_runtime.engine.sampler import HostSampler
from edge_runtime.engine.step_transfers import StepTransfers
from edge_runtime.kernels import cpu_decoder, cpu_linear, cpu_native
from edge_runtime.kernels.cpu_int4 import QuantLinear
from edge_runtime.kernels.cpu_linear import PackedLinear
from edge_runtime.kernels.cpu_threads import before_step
from edge_runtime.kernels.dispatch import cpu_int4pack_available, prefer_triton, triton_importable
from edge_runtime.kv.flat_context import FlatKVContext
from edge_runtime.kv.paged_context import PagedKVContext
from edge_runtime.model.linear_packing import pack_linears

BACKENDS = ("cpu", "cuda")


class CpuBackend:
    name = "cpu"
    pool_in_chunks = False  # flat rows read the pool as one tensor; shrinking madvises ranges
    decode_graphs = False  # the flat store's steps are not padded to buckets

    def __init__(self, device: torch.device):
        self.device = device

    def prepare_model(self, model) -> None:
        if model.dtype != torch.float32 and any(isinstance(m, QuantLinear) for m in model.modules()):
            raise ConfigError(f"the CPU back end runs quantized weights (a GGUF's blocks, AWQ) with "
                              f"float32 activations, not {str(model.dtype).removeprefix('torch.')}: "
                              "drop --dtype, or use --weights fp32 for float weights in that dtype")
        pack_linears(model)  # fp32 on CPU: blocked/oneDNN packed weights (model/linear_packing.py)

    def context(self, storage, steps, sm_scale: float):
        return FlatKVContext(storage, steps, sm_scale)

    def transfers(self):
        return StepTransfers(self.device, pack=False)  # host tensors are already where they run

    def sampler(self, transfers):
        return HostSampler(transfers)

    def forward(self, model, ids, positions, ctx, last_rows, num_positions=None) -> torch.Tensor:
        before_step()  # the team sized to the cores other programs leave free (cpu_threads.py)
        fused_args = None
        if model.fused_decoder is not None:
            fused_args = ctx.native_decode_args(model.config.num_heads, model.config.head_dim)
        return model(ids, positions, ctx, last_rows, fused_args=fused_args, num_positions=num_positions)

    def describe(self) -> dict:
        linear = cpu_linear.backend()
        native = cpu_native.library() is not None
        fused = native and linear == "c-blocked" and env.cpu_fused_decoder()
        kernels = {
            "linear": {"c-blocked": "c-blocked-f32", "onednn": "onednn-packed"}.get(linear or "", "torch"),
            "write_kv": "torch-flat-rows",
            "decode_attention": "c-flat-int8" if native else "torch-flat",
            "prefill_attention": "torch-sdpa-rows",
            # steps of an fp32 model with int8 or fp16 KV: the whole layer stack in one C call
            "decode_step": "c-fused-layers" if fused else "torch-layers",
            # a GGUF's own blocks and AWQ layers (QuantLinear, kernels/cpu_int4.py)
            "quant_linear": "c-int4-blocked" if native else "torch-reference",
        }
        kernels["awq_gemm"] = _awq_kernel(kernels["quant_linear"], "torch-reference")
        return {"backend": self.name, "device": str(self.device), "kernels": kernels}


class CudaBackend:
    name = "cuda"
    pool_in_chunks = True  # one allocation per pool chunk, so a retired chunk's memory is freed
    decode_graphs = True  # decode steps padded to buckets, CUDA graphs (engine/cuda_graphs.py)

    def __init__(self, device: torch.device):
        self.device = device
        self.interpreted = device.type == "cpu"  # the Triton interpreter on CPU tensors

    def prepare_model(self, model) -> None:
        """Nothing to convert: the loader already placed the weights in the back end's dtype
        (placement.load_for), AWQ layers in the W4A16 kernel's layout, and a GGUF's own blocks
        as QuantLinear modules, which run the blocked W4A16 Triton kernel on this back end
        (kernels/cpu_int4.py). fp32 linears packed for the CPU kernels (c-blocked / oneDNN
        PackedLinear) are refused: this back end does not run that format."""
        if any(isinstance(m, PackedLinear) for m in model.modules()):
            raise ConfigError("this model's float linears are packed for the CPU kernels (c-blocked "
                              "or oneDNN); load the model again for the CUDA back end "
                              "(placement.load_for)")
        model.fused_decoder = None  # the CPU back end's C layer stack

    def context(self, storage, steps, sm_scale: float):
        return PagedKVContext(storage, steps, sm_scale)  # on the host: the engine uploads it

    def transfers(self):
        """Packed uploads also under the interpreter (CPU tensors), so CI runs the GPU's path."""
        return StepTransfers(self.device, pack=True)

    def sampler(self, transfers):
        return DeviceSampler(transfers)

    def forward(self, model, ids, positions, ctx, last_rows, num_positions=None) -> torch.Tensor:
        with prefer_triton() if self.interpreted else contextlib.nullcontext():
            return model(ids, positions, ctx, last_rows, num_positions=num_positions)

    def describe(self) -> dict:
        kernels = {
            "linear": "torch-matmul",
            "write_kv": "triton write_kv",
            "decode_attention": "triton positional_attention",
            "prefill_attention": "triton positional_attention",
            "exact_block_attention": "triton paged_attention per token",
            "merge_attention": "triton merge_in_order",
            "decode_step": "torch-layers",
            "quant_linear": "triton blocked_gemm",  # a GGUF's own blocks and AWQ layers
        }
        kernels["awq_gemm"] = _awq_kernel(kernels["quant_linear"], "triton awq_gemm_prepared")
        mode = "triton-interpreter" if self.interpreted else "compiled"
        return {"backend": self.name, "device": str(self.device), "triton": mode, "kernels": kernels}


def _awq_kernel(blocked: str, awq_gemm: str) -> str:
    """What AWQ layers run: the blocked format's kernel, unless $EDGE_RUNTIME_AWQ_BACKEND picks
    one of AWQLinear's own backends (model/awq_model.py)."""
    choice = env.awq_backend(("auto", "blocked", "cpu-int4pack", "awq-gemm", "reference"))
    return {"awq-gemm": awq_gemm, "reference": "torch-reference",
            "cpu-int4pack": "torch-int4pack-cpu" if cpu_int4pack_available() else "torch-reference",
            }.get(choice, blocked)


def select_backend(name: str | None, device: str | torch.device):
    """The back end `name` ("cpu" | "cuda"; None: the device's) on `device`; ConfigError with
    what to change when that pairing cannot run here."""
    device = torch.device(device)
    name = name or device.type
    if name not in BACKENDS:
        raise ConfigError(f"unknown back end {name!r}; use one of {', '.join(BACKENDS)}")
    if name == "cpu":
        if device.type != "cpu":
            raise ConfigError(f"the CPU back end runs on --device cpu, not {device}; use "
                              f"--backend cuda on a CUDA device")
        return CpuBackend(device)

    if not triton_importable():
        raise ConfigError("the CUDA back end needs triton: pip install 'edge-runtime[gpu]'")
    if device.type == "cpu" and not env.triton_interpret():
        raise ConfigError("--backend cuda on --device cpu runs the Triton kernels in the "
                          "interpreter: set TRITON_INTERPRET=1 in the environment")
    return CudaBackend(device)


def prepare_model(model, backend) -> None:
    """Convert `model` (a CausalLM) for `backend` once; refuses a model prepared for another."""
    done = model.prepared_for
    if done == backend.name:
        return
    if done is not None:
        raise ConfigError(f"this model was prepared for the {done} back end; load it again for "
                          f"the {backend.name} back end")
    backend.prepare_model(model)
    model.prepared_for = backend.name


def check_prepared(model, backend) -> None:
    if model.prepared_for != backend.name:
        done = "not prepared for any back end" if model.prepared_for is None else \
            f"prepared for the {model.prepared_for} back end"
        raise ConfigError(f"the model is {done}, not the {backend.name} one: call "
                          f"edge_runtime.engine.backend.prepare_model before building the Engine")
