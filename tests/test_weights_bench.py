"""`bench weights` decode loop on a tiny model: float vs its AWQ copy run and produce positive rates,
and the AWQ copy's greedy tokens stay close to the float model's (smoke test, no timing asserts)."""

from __future__ import annotations

import types

import torch

from awq_helpers import tiny_llama
from edge_runtime.bench.weights_bench import decode_tokens_per_s
from edge_runtime.model.config import ModelConfig
from edge_runtime.model.loader import build_model, weight_bytes_of
from edge_runtime.quant import awq_pack


def _loaded(state, cfg, quant_config=None):
    model, quantization = build_model(ModelConfig.from_hf(cfg), dict(state), quant_config)
    return types.SimpleNamespace(config=model.config, model=model, quantization=quantization,
                                 weight_bytes=weight_bytes_of(model))


def test_decode_rates_for_float_and_awq_models():
    hf = tiny_llama(seed=7)
    cfg = hf.config.to_dict()
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    awq_state = {}
    for k, v in state.items():
        path = k[: -len(".weight")]
        if ".layers." in k and k.endswith("_proj.weight"):
            qweight, qzeros, scales = awq_pack.pack_linear_weight(v, 32)
            awq_state.update({f"{path}.qweight": qweight, f"{path}.qzeros": qzeros,
                              f"{path}.scales": scales.float()})
        else:
            awq_state[k] = v
    qc = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
    fp32, awq = _loaded(state, cfg), _loaded(awq_state, cfg, qc)
    assert awq.quantization == "awq-g32" and awq.weight_bytes < 0.5 * fp32.weight_bytes
    for lm in (fp32, awq):
        for batch in (1, 3):
            wall, cpu = decode_tokens_per_s(lm, batch, prompt_tokens=8, gen_tokens=4, seed=0)
            assert wall > 0 and cpu > 0
    ids = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(0))
    from edge_runtime.model.contiguous_kv import ContiguousKVCache

    outs = []
    for lm in (fp32, awq):
        cache = ContiguousKVCache.for_model(lm.config)
        cache.add(0, capacity=12)
        outs.append(lm.model(ids, torch.arange(12), cache.step([0], [12]), None))
    rel = (outs[0] - outs[1]).norm() / outs[0].norm()
    assert rel < 0.2, float(rel)
