"""Files quantized to each of llama.cpp's usual mixes, served from their own blocks: greedy output
equal to transformers' on the same file's dequantization (fp32 KV).

The files are made here from the built-in SmolLM2 GGUF (its own dequantized values): the gguf
package's own quantizer writes two files that hold, between them, F16, Q4_0, Q4_1, Q5_0, Q5_1 and
Q8_0 matrices, each type on a role of its own (`requantized_copy`: attention, gate/up, down and
embedding matrices); llama.cpp's `llama-quantize` makes the K and IQ4 mixes from an all-F16
file. That tool is not a Python package: `LLAMA_TARGETS=llama-quantize
tools/build_llama_server.sh` builds it (llama.cpp from llama-cpp-python's sdist); the tests
look for it at $EDGE_RUNTIME_LLAMA_QUANTIZE, on PATH, or under /work/peers*/build/bin, and skip,
saying so, without it. SmolLM2's 576-wide rows are not a multiple of 256, so every K-quant mix
also holds its fallback types (Q5_0, Q5_1, Q8_0, IQ4_NL...), as small models' files do.
"""
from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_runtime.model.chat import encode_prompt
from edge_runtime.model.gguf_int4 import planned_weight_bytes
from edge_runtime.model.gguf_tensors import GGUFTensors
from engine_helpers import greedy_one_by_one, hf_greedy

gguf = pytest.importorskip("gguf")

# made by gguf's quantizer (no tool needed): the type of each matrix role, as
# (attention q/k/v/o, ffn gate/up, ffn down, token embedding); one greedy run checks several types
# on one real model (each type's values are checked one by one in tests/test_int4_format.py)
MADE_HERE = {"Q4_0+Q5_1+F16": ("Q4_0", "Q5_1", "F16", "F16"),
             "Q4_1+Q5_0+Q8_0": ("Q4_1", "Q5_0", "Q8_0", "Q8_0")}
MIXES = list(MADE_HERE) + ["Q2_K", "Q2_K:ffn_down", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_NL",
                     "IQ4_XS"]
# the block types each mix's file holds besides F32 (SmolLM2's 576-wide rows take llama.cpp's
# fallbacks; "Q2_K:ffn_down" forces ffn_down, the one 1536-wide matrix, to Q2_K, which the plain
# Q2_K mix gives Q3_K here)
HOLDS = {"Q4_0+Q5_1+F16": {"Q4_0", "Q5_1", "F16"}, "Q4_1+Q5_0+Q8_0": {"Q4_1", "Q5_0", "Q8_0"},
         "Q2_K": {"Q3_K", "Q4_0", "Q8_0"}, "Q2_K:ffn_down": {"Q2_K", "Q4_0", "Q8_0"},
         "Q3_K_M": {"Q4_K", "Q5_K", "Q4_0", "Q5_0", "Q5_1", "Q8_0"},
         "Q4_K_M": {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}, "Q5_K_M": {"Q5_K", "Q6_K", "Q5_1", "Q8_0"},
         "Q6_K": {"Q6_K", "Q8_0"}, "IQ4_NL": {"IQ4_NL", "Q5_K", "Q8_0"},
         "IQ4_XS": {"IQ4_XS", "IQ4_NL", "Q5_K", "Q8_0"}}
MAX_NEW = 16
PROMPTS = [("The capital of France is", False), ("Turn on the kitchen lights.", True)]
_TMP = tempfile.TemporaryDirectory(prefix="edge-gguf-mixes-")


def llama_quantize() -> str | None:
    found = os.environ.get("EDGE_RUNTIME_LLAMA_QUANTIZE") or shutil.which("llama-quantize")
    if found:
        return found
    built = sorted(glob.glob("/work/peers*/build/bin/llama-quantize"))
    return built[0] if built else None


ROLES = (("attn_",), ("ffn_gate", "ffn_up"), ("ffn_down",), ("token_embd",))


def requantized_copy(src: Path, dst: Path, kinds: tuple[str, ...] = ("F16",) * 4) -> Path:
    """`src` with each matrix in its role's type of `kinds` (ROLES order: F16, or a type
    gguf.quants.quantize makes, from the dequantized values) and its metadata as it is."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{kinds[0]}"))
    for t in reader.tensors:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        if w.ndim == 1:
            writer.add_tensor(t.name, w.astype(np.float32))
            continue
        kind = next(k for k, role in zip(kinds, ROLES) if any(r in t.name for r in role))
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F16":
            writer.add_tensor(t.name, w.astype(np.float16))
        else:
            writer.add_tensor(t.name, gguf.quants.quantize(w.astype(np.float32), qtype),
                              raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@functools.lru_cache(maxsize=1)
def _f16_file() -> Path:
    from edge_runtime.model.loader import DEFAULT_MODEL, gguf_source

    return requantized_copy(gguf_source(DEFAULT_MODEL), Path(_TMP.name) / "smollm2-F16.gguf")


def mix_file(mix: str) -> Path:
    if mix in MADE_HERE:
        from edge_runtime.model.loader import DEFAULT_MODEL, gguf_source

        out = Path(_TMP.name) / f"smollm2-{mix}.gguf"
        return out if out.is_file() else requantized_copy(gguf_source(DEFAULT_MODEL), out,
                                                          MADE_HERE[mix])
    tool = llama_quantize()
    if tool is None:
        pytest.skip("llama.cpp's llama-quantize is not built (see this module's doc)")
    out = Path(_TMP.name) / f"smollm2-{mix.replace(':', '-')}.gguf"
    kind, _, forced = mix.partition(":")
    extra = ["--tensor-type", f"{forced}={kind.lower()}"] if forced else []
    if not out.is_file():
        proc = subprocess.run([tool, *extra, str(_f16_file()), str(out), kind, "2"],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mix", MIXES)
def test_mix_greedy_equals_transformers_on_its_dequantization(mix):
    from transformers import AutoModelForCausalLM

    from edge_runtime.model.loader import load_model, weight_bytes_of

    path = mix_file(mix)
    types = Counter(i.type_name for i in GGUFTensors(path).infos.values())
    if mix in HOLDS:
        assert set(types) - {"F32"} == HOLDS[mix], (mix, types)
    loaded = load_model(str(path), weights="gguf", progress=None)
    rope = weight_bytes_of(loaded.model.model.rotary_emb)
    assert planned_weight_bytes(path) == loaded.weight_bytes - rope  # what plan counts
    if "F16" in types:  # 16-bit matrices held in 16 bits
        from edge_runtime.kernels.float16_linear import Float16Linear

        assert any(isinstance(m, Float16Linear) for m in loaded.model.modules())
    prompts = [encode_prompt(loaded.tokenizer, p, chat=chat) for p, chat in PROMPTS]
    ours = greedy_one_by_one(loaded, prompts, MAX_NEW, num_pages=4)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              torch_dtype=torch.float32)
    eos = set(loaded.config.eos_token_ids)
    for ids, got in zip(prompts, ours):
        want = hf_greedy(hf, ids, MAX_NEW)
        stop = next((i + 1 for i, t in enumerate(want) if t in eos), len(want))
        assert got == want[:stop], (mix, dict(types), loaded.tokenizer.decode(got),
                                    loaded.tokenizer.decode(want))
