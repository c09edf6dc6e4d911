"""Qwen3, Gemma 3 (text) and SmolLM3 against transformers: tiny random checkpoints made from each config
class (tests/model_helpers.py, tiny_hf_config), our logits at every position of a prefill and of
one-token decode steps, max |diff| <= 1e-4 * max |logit| (fp32, the contiguous reference cache).

Qwen3: q/k RMSNorm per head before rotary, head_dim 32 with hidden 64 and 4 heads. Gemma 3: two
local layers (window 8, rotary base 10k) and a global one (base 1M), (1 + w) norms, sandwich
norms, GeGLU, sqrt(hidden) embeddings, query_pre_attn_scalar 24, final logit softcapping; prompts
of 1 to 40 tokens, so most positions read past the window. SmolLM3: a layer without rotary
(no_rope_layers). Families we refuse are refused naming
what is missing.
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import hf_logits, our_logits, random_ids, save_random_model, tiny_hf_config

from edge_runtime.errors import ModelLoadError
from edge_runtime.model.config import ModelConfig
from edge_runtime.model.contiguous_kv import ContiguousKVCache
from edge_runtime.model.loader import load_model
from edge_runtime.model.simple_generate import generate

REL_TOL = 1e-4


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor, rel: float = REL_TOL) -> None:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert scale > 0
    assert diff <= rel * scale, f"max abs diff {diff:.3g} > {rel} * max|logit| {scale:.3g}"


@pytest.fixture(scope="module", params=["qwen3", "gemma3", "smollm3"])
def family(request, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp(request.param)
    save_random_model(tiny_hf_config(request.param), folder, seed=5)
    ours = load_model(str(folder), progress=None)
    ref = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return request.param, ours, ref, folder


@pytest.mark.parametrize("length", (1, 7, 9, 40))
def test_prefill_logits_match_transformers(family, length):
    _, ours, ref, _ = family
    ids = random_ids(length, ours.config.vocab_size, seed=length + 11)
    assert_close_logits(our_logits(ours.model, ids), hf_logits(ref, ids))


def test_decode_logits_match_transformers(family):
    """A 5-token prefill, then 30 one-token steps (past the window of 8), each row vs HF's."""
    _, ours, ref, _ = family
    ids = random_ids(35, ours.config.vocab_size, seed=3)
    want = hf_logits(ref, ids)
    cache = ContiguousKVCache.for_model(ours.config)
    cache.add(0)
    chunks = [ids[:5]] + [[t] for t in ids[5:]]
    rows = []
    for chunk in chunks:
        positions = cache.positions([0], [len(chunk)])
        rows.append(ours.model(torch.tensor(chunk), positions, cache.step([0], [len(chunk)]), None))
    assert_close_logits(torch.cat(rows), want)


def test_batched_decode_matches_transformers(family):
    """Three sequences of different lengths decoded as one padded batch (the windowed mask per
    row), against each one alone in transformers."""
    _, ours, ref, _ = family
    prompts = [random_ids(n, ours.config.vocab_size, seed=n) for n in (3, 12, 20)]
    results = generate(ours.model, prompts, max_tokens=12, eos_token_ids=())
    for prompt, res in zip(prompts, results):
        with torch.inference_mode():
            out = ref.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        want = out[0, len(prompt):].tolist()
        assert res.token_ids == want[:len(res.token_ids)] and len(res.token_ids) == len(want)


def test_configs_exercise_their_features(family):
    name, ours, _, _ = family
    cfg = ours.config
    if name == "smollm3":
        assert cfg.rope_layers == (True, True, False, True)
        assert ours.model.model.layers[2].self_attn.rope is not ours.model.model.layers[0].self_attn.rope
        return
    assert cfg.qk_norm and cfg.head_dim * cfg.num_heads != cfg.hidden_size
    attn = ours.model.model.layers[0].self_attn
    assert attn.q_norm.weight.std() > 0.05
    if name == "gemma3":
        assert cfg.layer_windows == (8, 8, None) and cfg.local_rope_theta == 10000.0
        assert cfg.rope_theta == 1e6 and cfg.norm_unit_offset and cfg.sandwich_norms
        assert cfg.hidden_act == "gelu_pytorch_tanh" and cfg.embed_scale == 8.0
        assert cfg.attention_scale == 24 ** -0.5 and cfg.final_logit_softcapping == 30.0
        # the engine masks local layers to their window: it serves the model's own limit
        assert cfg.max_position_embeddings == 2048 and cfg.model_context == 2048
    else:
        assert cfg.architecture == "Qwen3ForCausalLM" and cfg.layer_windows is None


def test_gemma3_old_config_dialect():
    """transformers < 5 configs: rope_theta + rope_local_base_freq + sliding_window_pattern."""
    cfg = ModelConfig.from_hf({
        "architectures": ["Gemma3ForCausalLM"], "vocab_size": 512, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 7, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "sliding_window": 512, "sliding_window_pattern": 6,
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
        "max_position_embeddings": 32768})
    assert cfg.layer_windows == (512,) * 5 + (None, 512)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e6, 1e4)
    assert cfg.max_position_embeddings == 32768 and cfg.model_context == 32768


@pytest.mark.parametrize("arch,missing", [
    ("Phi3ForCausalLM", "partial_rotary_factor"),
    ("Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"),
])
def test_refused_families_name_what_is_missing(arch, missing):
    with pytest.raises(ModelLoadError, match=missing) as err:
        ModelConfig.from_hf({"architectures": [arch], "vocab_size": 8, "hidden_size": 8,
                             "intermediate_size": 8, "num_hidden_layers": 1,
                             "num_attention_heads": 1})
    assert "supported: " in str(err.value) and "Qwen3ForCausalLM" in str(err.value)


def test_gemma3_attention_softcapping_is_refused():
    hf = tiny_hf_config("gemma3").to_dict()
    hf["attn_logit_softcapping"] = 50.0
    with pytest.raises(ModelLoadError, match="attn_logit_softcapping"):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize("family", ["gemma3"], indirect=True)
def test_gemma3_chat_template_folds_the_system_message_into_the_first_user_turn(family):
    """A Gemma 3 tokenizer without a template (the GGUF has none) gets Gemma's own: no system
    role, the system text opens the first user turn; <end_of_turn> ends generation."""
    name, ours, _, folder = family
    assert name == "gemma3"
    from edge_runtime.model.chat import encode_prompt
    from edge_runtime.model.family_chat import complete_chat
    from edge_runtime.model.loader import load_tokenizer

    tok = load_tokenizer(folder)
    tok.chat_template = None
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    config = complete_chat(ours.config, tok)
    ids = encode_prompt(tok, "Hi there", chat=True, system="Be brief.")
    text = tok.decode(ids)
    assert text.endswith("<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
                         "<start_of_turn>model\n"), text
    assert "system" not in text
    assert tok.convert_tokens_to_ids("<end_of_turn>") in config.eos_token_ids


def test_a_refused_gguf_family_names_what_is_missing(tmp_path):
    """A Phi-4-mini GGUF (general.architecture phi3) is refused from its header, with the reason."""
    import gguf

    from edge_runtime.model.gguf_convert import check_supported

    path = tmp_path / "phi4-mini.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="partial_rotary_factor.*supported: .*gemma3"):
        check_supported(path)
