"""engine/placement.py and engine/backend.py's choices, without a GPU: --device auto picks the CPU
here and the budget's device: pin, the weight dtype follows the back end, and every pairing that
cannot run says what to change; a model prepared for one back end is refused by the other."""

import pytest
import torch

from edge_runtime.budget import load_budget
from edge_runtime.engine.backend import CpuBackend, prepare_model, select_backend
from edge_runtime.engine.placement import resolve
from edge_runtime.errors import ConfigError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


@no_cuda
def test_auto_is_the_cpu_here_and_a_budget_may_pin_the_device(tmp_path):
    assert resolve() == resolve("auto", None, load_budget("orin-nano-8gb"))
    assert (resolve().device, resolve().backend, resolve().weight_dtype) == ("cpu", "cpu", "fp32")
    text = (load_budget("orin-nano-8gb").source and open(load_budget("orin-nano-8gb").source).read())
    (tmp_path / "pinned.yaml").write_text(text + "\ndevice: cuda\n")
    pinned = resolve("auto", None, load_budget(str(tmp_path / "pinned.yaml")), need_device=False)
    assert (pinned.device, pinned.backend, pinned.weight_dtype) == ("cuda", "cuda", "fp16")
    with pytest.raises(ConfigError, match="torch sees no CUDA device"):
        resolve("auto", None, load_budget(str(tmp_path / "pinned.yaml")))
    (tmp_path / "bad.yaml").write_text(text + "\ndevice: gpu\n")
    with pytest.raises(ConfigError, match="device must be auto, cpu, cuda or cuda:N"):
        load_budget(str(tmp_path / "bad.yaml"))


def test_pairs_that_cannot_run_say_what_to_change(monkeypatch):
    with pytest.raises(ConfigError, match="use auto, cpu, cuda or cuda:N"):
        resolve("tpu")
    with pytest.raises(ConfigError, match="CPU back end runs on --device cpu"):
        resolve("cuda", "cpu", need_device=False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="TRITON_INTERPRET=1|needs triton"):
        select_backend("cuda", "cpu")
    assert resolve("cpu", "cpu", weight_dtype="bf16").weight_dtype == "bf16"


def test_a_model_prepared_for_one_back_end_is_refused_by_the_other():
    from backend_helpers import loaded_for, tiny_folder

    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.engine import Engine

    cpu_model = loaded_for(tiny_folder(), "cpu")
    assert cpu_model.model.prepared_for == "cpu"
    prepare_model(cpu_model.model, CpuBackend(torch.device("cpu")))  # again: nothing to do
    with pytest.raises(ConfigError, match="prepared for the cpu back end"):
        Engine(cpu_model, EngineConfig(device="cpu", backend="cuda"))


def test_weights_option_per_back_end_and_a_model_packed_for_the_cpu_kernels():
    from types import SimpleNamespace

    from edge_runtime.engine.backend import CudaBackend
    from edge_runtime.engine.placement import Placement, model_weights
    from edge_runtime.kernels.cpu_linear import PackedLinear

    cpu, cuda = Placement("cpu", "cpu", "fp32"), Placement("cuda", "cuda", "fp16")
    for placement in (cpu, cuda):  # both back ends serve a GGUF's own blocks
        assert [model_weights(placement, w) for w in ("auto", "gguf", "fp32")] == ["auto", "gguf", "fp32"]
    with pytest.raises(ConfigError, match="use one of"):
        model_weights(cuda, "int4")
    # a GGUF served from its blocks arrives packed: the CPU back end takes it as it is ...
    packed = SimpleNamespace(prepared_for=None, linears_packed=30, fused_decoder=None,
                             modules=lambda: [], dtype=torch.float32)
    prepare_model(packed, CpuBackend(torch.device("cpu")))
    assert (packed.prepared_for, packed.linears_packed) == ("cpu", 30)
    # ... and so does the CUDA back end (QuantLinear runs the Triton kernel there), without the
    # CPU's C layer stack; fp32 linears packed for the CPU kernels it refuses
    packed = SimpleNamespace(prepared_for=None, linears_packed=30, fused_decoder=object(),
                             modules=lambda: [])
    prepare_model(packed, CudaBackend(torch.device("cpu")))
    assert (packed.prepared_for, packed.fused_decoder) == ("cuda", None)
    fp32_packed = SimpleNamespace(prepared_for=None, fused_decoder=None,
                                  modules=lambda: [PackedLinear.__new__(PackedLinear)])
    with pytest.raises(ConfigError, match="packed for the CPU kernels"):
        prepare_model(fp32_packed, CudaBackend(torch.device("cpu")))
    assert fp32_packed.prepared_for is None


def test_cpu_back_end_refuses_quantized_weights_with_half_activations():
    """`generate --weights gguf --dtype fp16` on the CPU back end: one ConfigError at load, not
    an assertion inside the first step."""
    from backend_helpers import loaded_gguf_for

    with pytest.raises(ConfigError, match="float32 activations, not float16"):
        loaded_gguf_for("cpu", dtype=torch.float16)
