"""Our forward vs transformers (fp32, same weights): max |diff| <= 1e-4 * max |logit|.

SmolLM2-135M-Instruct (the default model) and small random-weight Llama (GQA, untied, llama3 rope
scaling), Qwen2 (q/k/v bias, tied, bf16 checkpoint) and Mistral (sharded fp16 checkpoint, linear
rope scaling) made here; prompts of 1, 7, 200 and 1000 random tokens. Also: a varlen batch gives the
same logits as running each sequence alone, for prefill and for a mixed prefill-chunk + decode step.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import (hf_logits, our_logits, random_ids, save_random_model, smollm2,
                           smollm2_hf, tiny_hf_config)

from edge_runtime.model.contiguous_kv import ContiguousKVCache
from edge_runtime.model.loader import load_model

PROMPT_LENGTHS = (1, 7, 200, 1000)
REL_TOL = 1e-4


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor, rel: float = REL_TOL) -> None:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    assert ours.dtype == torch.float32
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert scale > 0
    assert diff <= rel * scale, f"max abs diff {diff:.3g} > {rel} * max|logit| {scale:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_smollm2_logits_match_transformers(length):
    ours = smollm2()
    ids = random_ids(length, ours.config.vocab_size, seed=length)
    assert_close_logits(our_logits(ours.model, ids), hf_logits(smollm2_hf(), ids))


ARCH_CASES = {
    # GQA (4 heads, 2 kv heads), untied lm_head, llama3 rope scaling active past position 256
    "llama-gqa-untied-llama3rope": ("llama", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 256}), torch.float32, None),
    "qwen2-bias-bf16": ("qwen2", dict(tie_word_embeddings=True), torch.bfloat16, None),
    "mistral-sharded-fp16-linearrope": ("mistral", dict(head_dim=32, hidden_size=96, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}), torch.float16, "200KB"),
}


@pytest.fixture(scope="module", params=sorted(ARCH_CASES))
def arch_pair(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    arch, overrides, dtype, shard = ARCH_CASES[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    save_random_model(tiny_hf_config(arch, **overrides), folder, seed=1, dtype=dtype,
                      max_shard_size=shard)
    ours = load_model(str(folder), progress=None)
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return request.param, ours, ref


@pytest.mark.parametrize("length", PROMPT_LENGTHS)
def test_random_architectures_match_transformers(arch_pair, length):
    name, ours, ref = arch_pair
    ids = random_ids(length, ours.config.vocab_size, seed=length + 7)
    assert_close_logits(our_logits(ours.model, ids), hf_logits(ref, ids))


def test_case_configs_exercise_their_features(arch_pair):
    name, ours, _ = arch_pair
    cfg = ours.config
    if name.startswith("llama"):
        assert cfg.num_kv_heads < cfg.num_heads and not cfg.tie_word_embeddings
        assert cfg.rope_scaling is not None and cfg.rope_scaling.rope_type == "llama3"
    elif name.startswith("qwen2"):
        assert cfg.attention_bias and ours.model.model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    else:
        assert cfg.architecture == "MistralForCausalLM" and cfg.rope_scaling.rope_type == "linear"
        assert len(list(ours.path.glob("*.safetensors"))) > 1


def _run_step(model, cache, seq_ids, chunks):
    """One forward over a varlen batch; returns each sequence's logits rows [n_i, vocab]."""
    lens = [len(c) for c in chunks]
    ids = torch.tensor([t for c in chunks for t in c])
    positions = cache.positions(seq_ids, lens)
    logits = model(ids, positions, cache.step(seq_ids, lens), None)
    return list(torch.split(logits, lens))


def test_varlen_batch_equals_one_by_one(tmp_path):
    folder = save_random_model(tiny_hf_config("llama"), tmp_path / "m", seed=3)
    model = load_model(str(folder), progress=None).model
    vocab = model.config.vocab_size
    prompts = [random_ids(n, vocab, seed=n) for n in (5, 1, 33)]
    follow = [random_ids(1, vocab, 91), random_ids(4, vocab, 92), random_ids(1, vocab, 93)]

    batch = ContiguousKVCache.for_model(model.config)
    for i in range(3):
        batch.add(i)
    batched_prefill = _run_step(model, batch, [0, 1, 2], prompts)
    batched_next = _run_step(model, batch, [0, 1, 2], follow)  # decode, 4-token chunk, decode

    for i in range(3):
        alone = ContiguousKVCache.for_model(model.config)
        alone.add("x")
        ref_prefill = _run_step(model, alone, ["x"], [prompts[i]])[0]
        ref_next = _run_step(model, alone, ["x"], [follow[i]])[0]
        assert_close_logits(batched_prefill[i], ref_prefill, rel=1e-5)
        assert_close_logits(batched_next[i], ref_next, rel=1e-5)
        assert_close_logits(ref_next, our_logits(model, prompts[i] + follow[i])[-len(follow[i]):])


def test_logits_indices_select_rows(tmp_path):
    folder = save_random_model(tiny_hf_config("llama"), tmp_path / "m", seed=4)
    model = load_model(str(folder), progress=None).model
    ids = random_ids(9, model.config.vocab_size, seed=5)
    full = our_logits(model, ids)
    cache = ContiguousKVCache.for_model(model.config)
    cache.add(0)
    picked = model(torch.tensor(ids), cache.positions([0], [9]), cache.step([0], [9]),
                   torch.tensor([8, 2]))
    assert picked.shape == (2, model.config.vocab_size)
    assert_close_logits(picked, full[[8, 2]], rel=1e-6)


def test_rotary_table_grows_past_the_preloaded_positions():
    from edge_runtime.model.config import ModelConfig
    from edge_runtime.model.llama import FULL_ROPE_TABLE, Rotary, rope_inv_freq

    hf = tiny_hf_config("llama", max_position_embeddings=3 * FULL_ROPE_TABLE).to_dict()
    config = ModelConfig.from_hf(hf)
    rotary = Rotary(config)
    rotary.build(FULL_ROPE_TABLE)
    positions = torch.tensor([5, FULL_ROPE_TABLE + 100, 3 * FULL_ROPE_TABLE - 1])
    cos, sin = rotary(positions, torch.float32)  # [3, 1, D]
    assert rotary.cos.shape[0] == 3 * FULL_ROPE_TABLE
    freqs = positions[:, None].float() * rope_inv_freq(config)[None, :]
    torch.testing.assert_close(cos[:, 0], torch.cat((freqs, freqs), -1).cos(), rtol=0, atol=0)
    torch.testing.assert_close(sin[:, 0], torch.cat((freqs, freqs), -1).sin(), rtol=0, atol=0)
