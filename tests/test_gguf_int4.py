"""The built-in model served from its own GGUF blocks (model/gguf_int4.py) against its float32
conversion (`--weights fp32`), and the GGUF tensor table reader (model/gguf_tensors.py) against
gguf.GGUFReader."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from edge_runtime.errors import ModelLoadError
from edge_runtime.kernels.cpu_int4 import QuantEmbedding, QuantLinear
from edge_runtime.model.gguf_int4 import planned_weight_bytes, rope_order
from edge_runtime.model.gguf_tensors import GGUFTensors
from edge_runtime.model.loader import DEFAULT_MODEL, gguf_source, load_model, weight_bytes_of
from model_helpers import our_logits, random_ids, smollm2, smollm2_gguf


def _builtin():
    return gguf_source(DEFAULT_MODEL)  # bootstrap installs it: a missing model is a failure


def test_tensor_table_and_bytes_match_gguf_reader():
    import gguf
    path = _builtin()
    ours = GGUFTensors(path)
    reader = gguf.GGUFReader(path)
    assert set(ours.infos) == {t.name for t in reader.tensors}
    for t in reader.tensors[:12] + reader.tensors[-3:]:
        info = ours.info(t.name)
        assert info.type_name == t.tensor_type.name
        assert info.nbytes == t.n_bytes
        assert np.array_equal(ours[t.name], np.asarray(t.data)), t.name


def test_truncated_file_is_refused(tmp_path):
    path = _builtin()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: 5_000_000])
    with pytest.raises(ModelLoadError, match="truncated|re-download"):
        GGUFTensors(cut)


def test_rope_order_undoes_llama_cpp_permutation():
    """llama.cpp writes row (h, 2 i + j) for HF row (h, j half + i); rope_order maps back."""
    heads, dim = 3, 8
    hf = torch.arange(heads * dim)
    gguf_rows = hf.view(heads, 2, dim // 2).transpose(1, 2).reshape(-1)  # convert_hf_to_gguf permute
    assert torch.equal(gguf_rows[rope_order(heads * dim, heads)], hf)


def test_a_file_with_a_type_not_served_is_refused_before_loading(tmp_path):
    """The tensor, its type and the served list, all true; nothing converted first."""
    import gguf

    from edge_runtime.model.gguf_int4 import check_served, tensor_kernels
    from edge_runtime.quant.gguf_blocks import SUPPORTED

    path = tmp_path / "iq2.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 64), np.float32))
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ2_XXS]
    writer.add_tensor("blk.0.ffn_down.weight", np.zeros((2, 256 // block * size), np.uint8),
                      raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError) as err:
        check_served(GGUFTensors(path))
    message = str(err.value)
    assert "blk.0.ffn_down.weight is stored as GGUF type IQ2_XXS" in message
    assert f"(served: {', '.join(SUPPORTED)}, F32, F16, BF16)" in message
    kernels = {t["tensor"]: t for t in tensor_kernels(path, "cpu")}  # what plan prints
    assert kernels["blk.0.ffn_down.weight"]["kernel"] == "refused at load"


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_plan_names_each_tensors_form_and_kernel(backend):
    from backend_helpers import tiny_gguf_file

    from edge_runtime.model.gguf_int4 import tensor_kernels

    rows = {t["tensor"]: t for t in tensor_kernels(tiny_gguf_file("Q5_0", "Q8_0"), backend)}
    q, v = rows["blk.0.attn_q.weight"], rows["blk.0.attn_v.weight"]
    assert (q["type"], q["form"], v["form"]) == ("Q5_0", "sint5 g32 fp16", "int8 g32 fp16")
    want = "linear_int4.c int5" if backend == "cpu" else "blocked_w4a16 Triton W5A16"
    assert q["kernel"].startswith(want)
    assert rows["blk.0.attn_norm.weight"]["form"] == "float32"
    half = {t["tensor"]: t for t in tensor_kernels(tiny_gguf_file("F16", "Q8_0"), backend)}
    assert half["blk.0.attn_q.weight"]["kernel"].startswith("Float16Linear")


def test_unknown_weights_option_and_gguf_on_a_folder_are_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown --weights"):
        load_model(DEFAULT_MODEL, weights="int3")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="needs a .gguf model"):
        load_model(str(tmp_path), weights="gguf")


@pytest.mark.slow
def test_builtin_model_from_its_blocks_computes_the_fp32_model():
    """Every weight dequantizes to the fp32 folder's value, so logits agree to summation order;
    resident weights stay near the file's tensor bytes."""
    quant, ref = smollm2_gguf(), smollm2()
    model = quant.model
    assert quant.quantization == "gguf-Q4_1"
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.bits == 8  # the file's Q8_0
    assert isinstance(model.model.embed_tokens, QuantEmbedding)
    assert model.fused_decoder is not None
    file_bytes = sum(i.nbytes for i in GGUFTensors(_builtin()).infos.values())
    assert quant.weight_bytes <= 1.15 * file_bytes, (quant.weight_bytes, file_bytes)
    rope_tables = weight_bytes_of(model.model.rotary_emb)
    assert planned_weight_bytes(_builtin()) == quant.weight_bytes - rope_tables  # what plan counts
    for n in (5, 40):  # the C kernel (< 32 rows) and the BLAS tiles
        ids = random_ids(n, quant.config.vocab_size, seed=n)
        got, want = our_logits(model, ids), our_logits(ref.model, ids)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_q2_k_next_to_q3_k_is_one_3_bit_linear_and_planned_so(tmp_path):
    """llama.cpp's Q2_K mix on 256-multiple rows keeps q / k in Q2_K next to a Q3_K v: the three
    are one fused linear in signed 3 bits with offsets (int4_format.as_signed3: the same values),
    so the one-call C step still runs the layer; plan counts the linear's bytes."""
    import gguf
    from torch import nn

    from edge_runtime.model.gguf_int4 import _set_linears
    from edge_runtime.quant import gguf_blocks
    from quant_helpers import random_gguf_raw

    qt = gguf.GGMLQuantizationType
    path = tmp_path / "q2k-q3k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    parts = {"attn_q": (qt.Q2_K, 48), "attn_k": (qt.Q2_K, 16), "attn_v": (qt.Q3_K, 16)}
    raws = {name: random_gguf_raw(t, n, 512, seed=n + int(t)) for name, (t, n) in parts.items()}
    for name, (t, _) in parts.items():
        writer.add_tensor(f"blk.0.{name}.weight", raws[name], raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    owner = nn.Module()
    for hf in ("q_proj", "k_proj", "v_proj"):
        setattr(owner, hf, None)
    rows = [gguf_blocks.grouped_rows(raws[n], parts[n][0].name, n) for n in parts]
    _set_linears(owner, "qkv_proj", ("q_proj", "k_proj", "v_proj"), rows, list(parts), [None] * 3)
    qkv = owner.qkv_proj
    assert isinstance(qkv, QuantLinear) and (qkv.bits, qkv.signed) == (3, True)
    assert qkv.offsets is not None and qkv.out_splits == (48, 16, 16)
    want = np.concatenate([gguf.quants.dequantize(raws[n], parts[n][0]) for n in parts])
    assert torch.equal(qkv.weight.dequantize(), torch.from_numpy(want))
    assert planned_weight_bytes(path) == weight_bytes_of(owner)


@pytest.mark.parametrize("layer_type,v_down_type", [
    ("Q4_1", "Q8_0"), ("Q5_0", "Q8_0"), ("Q5_1", "Q4_0"), ("F16", "Q8_0"), ("BF16", "Q5_0")])
def test_mixed_types_in_a_layer_load_and_compute_the_reference(layer_type, v_down_type):
    """A layer whose q/k/v (or gate/up) parts differ in type (a Q4_K_M file keeps attn_v in Q8_0
    next to Q5_0 q and k): parts that differ only in their integers' width are widened to 8 bits
    and stay one fused linear (the C one-call step runs them), others get one linear per part
    under its Hugging Face name; the C kernels and the Triton kernel (the CUDA back end's,
    interpreted) compute the plain-torch dequantized reference; plan's byte count is still exact.
    16-bit layers stay 16-bit (Float16Linear)."""
    from backend_helpers import gguf_config, tiny_gguf_file

    from edge_runtime.kernels import dispatch
    from edge_runtime.kernels.float16_linear import Float16Linear
    from edge_runtime.model.gguf_int4 import build_gguf_model

    path = tiny_gguf_file(layer_type, v_down_type)
    model, _ = build_gguf_model(path, gguf_config(), "llama")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    bits = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8}
    if (layer_type, v_down_type) in (("Q5_0", "Q8_0"), ("Q5_1", "Q4_0")):  # widened, fused
        assert attn.qkv_proj.bits == 8 and attn.qkv_proj.out_splits == (64, 32, 32)
        assert mlp.down_proj.bits == bits[v_down_type] and mlp.gate_up_proj.bits == bits[layer_type]
        assert model.fused_decoder is not None
    elif layer_type in bits:  # Q4_1 has offsets, Q8_0 none: one linear per part
        assert attn.qkv_proj is None and attn.v_proj.bits == 8 and attn.q_proj.bits == 4
        assert isinstance(mlp.gate_up_proj, QuantLinear)  # same type: fused
        assert model.fused_decoder is None  # the one-call C step needs fused q/k/v
    else:
        assert attn.qkv_proj is None and attn.v_proj.bits == bits[v_down_type]
        assert isinstance(attn.q_proj, Float16Linear) and attn.q_proj.weight.dtype == getattr(
            torch, {"F16": "float16", "BF16": "bfloat16"}[layer_type])
        assert isinstance(mlp.gate_up_proj, Float16Linear)
        assert model.fused_decoder is None
    rope = weight_bytes_of(model.model.rotary_emb)
    assert planned_weight_bytes(path) == weight_bytes_of(model) - rope
    ids = random_ids(12, 500, seed=3)
    got = our_logits(model, ids)
    if dispatch.triton_importable():
        with dispatch.prefer_triton():
            torch.testing.assert_close(our_logits(model, ids), got, rtol=0, atol=1e-5)
    for m in model.modules():
        if isinstance(m, QuantLinear):
            m._lib = None  # the plain-torch reference: dequantize, then matmul
        if isinstance(m, Float16Linear):  # the float32 reference of its module doc
            m.forward = lambda x, m=m: torch.nn.functional.linear(x, m.weight.float(), m.bias)
    torch.testing.assert_close(our_logits(model, ids), got, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_builtin_model_for_the_cuda_back_end_serves_its_blocks_through_the_triton_kernel():
    """`load_for` on the CUDA back end (here on CPU tensors, the interpreter) serves the built-in
    file's own blocks, the bytes the CPU back end holds, the Q8_0 head included; its layers'
    Triton results are the C kernels' (fp32 summation order). Whole forwards are the tiny model's
    test (tests/test_engine_backends.py): the interpreter takes ~17 s per call of this head."""
    from edge_runtime.engine.placement import load_for, resolve
    from edge_runtime.kernels import dispatch

    if not dispatch.triton_importable():
        pytest.skip("needs triton (the interpreter)")
    loaded = load_for(DEFAULT_MODEL, resolve("cpu", "cuda"), progress=None)
    model = loaded.model
    assert model.prepared_for == "cuda" and model.fused_decoder is None
    assert loaded.quantization == "gguf-Q4_1" and loaded.weight_bytes == smollm2_gguf().weight_bytes
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.bits == 8
    assert isinstance(model.model.embed_tokens, QuantEmbedding)
    gen = torch.Generator().manual_seed(0)
    layer = model.model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
        x = torch.randn(5, linear.in_features, generator=gen)
        before = dispatch.TRITON_LAUNCHES["blocked_gemm"]
        with dispatch.prefer_triton():
            got = linear(x)
        assert dispatch.TRITON_LAUNCHES["blocked_gemm"] == before + 1
        torch.testing.assert_close(got, linear.c_kernel(x), rtol=1e-5, atol=1e-4)
