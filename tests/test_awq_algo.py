"""AWQ algorithm on tiny random Llamas: block forwards match transformers, searches restore weights,
and the full quantizer beats round-to-nearest."""

from __future__ import annotations

import copy

import torch

from awq_helpers import tiny_llama
from edge_runtime.quant import awq_algo, awq_blocks, awq_pack, awq_search


def _hf_layer_out(model, layer_idx, hidden):
    layer = model.model.layers[layer_idx]
    pos = torch.arange(hidden.shape[1])[None].expand(hidden.shape[0], -1)
    pe = model.model.rotary_emb(hidden, pos)
    mask = torch.full((hidden.shape[1],) * 2, float("-inf")).triu(1)[None, None]
    out = layer(hidden, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    return out[0] if isinstance(out, tuple) else out


def test_decoder_layer_matches_transformers():
    model = tiny_llama(seed=1)
    arch = awq_blocks.LayerArch.from_config(model.config)
    ids = torch.randint(0, model.config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.model.embed_tokens(ids)
        rope = awq_blocks.rope_tables(arch, 40)
        feats = {}
        ours = awq_blocks.decoder_layer(model.model.layers[0], hidden, arch, rope, collect=feats)
        ref = _hf_layer_out(model, 0, hidden)
    assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-4), (ours - ref).abs().max()
    assert set(feats) == {"self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"}


def test_search_scale_restores_weights_and_fold_preserves_function():
    torch.manual_seed(0)
    norm = torch.nn.Module()
    norm.weight = torch.nn.Parameter(torch.rand(128) + 0.5)
    fcs = [torch.nn.Linear(128, 64, bias=False), torch.nn.Linear(128, 32, bias=False)]
    x = torch.randn(256, 128) * torch.linspace(0.1, 5.0, 128)
    before = [fc.weight.data.clone() for fc in fcs]

    def block(inp):
        return torch.cat([fc(inp) for fc in fcs], dim=-1)

    scales = awq_search.search_scale(block, x, fcs, group_size=64, n_grid=10)
    assert all(torch.equal(fc.weight.data, w) for fc, w in zip(fcs, before))
    assert scales.shape == (128,) and torch.all(scales > 0)
    normed = torch.randn(16, 128)
    want = block(normed * norm.weight)
    awq_search.fold_scale(norm, fcs, scales)
    assert torch.allclose(block(normed * norm.weight), want, atol=1e-4, rtol=1e-4)


def test_search_clip_matches_autoawq_broadcast_formulation():
    torch.manual_seed(1)
    w = torch.randn(64, 128)
    x = torch.randn(300, 128)
    got = awq_search.search_clip(w, x, group_size=32, n_grid=10, max_shrink=0.5, clip_tokens=512,
                                 oc_batch=32)
    # AutoAWQ's own formulation: [co, 1, n_group, G] * [1, T, n_group, G], summed over G
    wg, xg = w.view(64, 1, 4, 32), x.view(1, 300, 4, 32)
    org_out = (xg * wg).sum(-1)
    org_max = wg.abs().amax(dim=-1, keepdim=True)
    best, best_err = org_max.clone(), torch.full_like(org_max, 1e9)
    for i in range(5):
        mv = org_max * (1 - i / 10)
        q = awq_pack.fake_quantize(torch.clamp(wg, -mv, mv).reshape(64, 128), 32).view(64, 1, 4, 32)
        err = ((xg * q).sum(-1) - org_out).pow(2).mean(dim=1).view(best_err.shape)
        better = err < best_err
        best_err[better], best[better] = err[better], mv[better]
    assert torch.allclose(got, best.view(64, 4))


def _output_error(model_q, model_ref, ids):
    with torch.no_grad():
        return float((model_q(ids).logits - model_ref(ids).logits).pow(2).mean())


def _apply(model, tensors, group_size):
    for path, (qw, qz, sc, _b) in tensors.items():
        w = awq_pack.dequantize(qw, qz, sc, group_size).t()
        model.get_submodule(path).weight.data = w.contiguous()


def test_awq_beats_round_to_nearest_on_tiny_llama():
    ref = tiny_llama(seed=2, num_hidden_layers=2)
    arch = awq_blocks.LayerArch.from_config(ref.config)
    gen = torch.Generator().manual_seed(5)
    calib = torch.randint(0, ref.config.vocab_size, (4, 64), generator=gen)
    test_ids = torch.randint(0, ref.config.vocab_size, (2, 64), generator=gen)
    errors = {}
    for name, st in {"rtn": awq_algo.AWQSettings(group_size=32, scale=False, clip=False),
                     "awq": awq_algo.AWQSettings(group_size=32, n_grid=10, clip=True)}.items():
        model = copy.deepcopy(ref)
        tensors = awq_algo.awq_quantize(model, arch, calib, st)
        assert len(tensors) == 7 * 2
        _apply(model, tensors, 32)
        errors[name] = _output_error(model, ref, test_ids)
    assert errors["awq"] < 0.8 * errors["rtn"], errors
