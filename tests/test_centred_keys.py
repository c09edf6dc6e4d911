"""Centred int8 keys (kernels/quantize.py): the format, and the torch references that write and
read it, against float oracles. The C and Triton kernels are held to these references in their
own test files."""
import pathlib

import pytest
import torch

from kernel_helpers import default_scale, key_mean, make_cache, naive_attention, random_block_table, row_kv
from edge_runtime.kernels import dispatch
from edge_runtime.kernels.kv_write import write_kv_ref
from edge_runtime.kernels.paged_attention import paged_attention_ref
from edge_runtime.kernels.quantize import dequantize_int8_keys, quantize_int8, quantize_int8_keys


def test_a_key_is_centred_exactly_when_that_lowers_its_absmax():
    gen = torch.Generator().manual_seed(0)
    mean = key_mean(2, 16, gen)
    near = mean + 0.1 * torch.randn(5, 2, 16, generator=gen)  # centring shrinks these
    far = -mean + 0.1 * torch.randn(5, 2, 16, generator=gen)  # centring doubles these
    q, s = quantize_int8_keys(torch.cat([near, far]), mean)
    assert bool((s[:5] < 0).all()) and bool((s[5:] > 0).all())
    assert torch.equal(q[5:], quantize_int8(far)[0]) and torch.equal(s[5:], quantize_int8(far)[1])
    assert torch.equal(q[:5], quantize_int8(near - mean)[0])
    assert torch.equal(s[:5], -quantize_int8(near - mean)[1])
    back = dequantize_int8_keys(q, s, mean)
    step = s.float().abs().unsqueeze(-1)  # the error bound: half a step, plus rounding of the add
    assert bool(((back - torch.cat([near, far])).abs() <= step * 0.5 + 1e-5).all())
    # a centred key's error is that of x - m: 20x finer steps than the plain store here
    plain = quantize_int8(near)
    assert float((dequantize_int8_keys(*plain, None) - near).abs().max()) > \
        10 * float((back[:5] - near).abs().max())


def test_a_key_equal_to_the_mean_and_a_zero_key():
    mean = torch.ones(1, 8)
    q, s = quantize_int8_keys(torch.stack([mean, torch.zeros(1, 8)]), mean)
    assert float(s[0, 0]) == -1.0 and int(q[0].abs().max()) == 0  # centred to zero: scale -1
    assert float(s[1, 0]) == 1.0 and int(q[1].abs().max()) == 0  # zero key: not centred
    assert torch.equal(dequantize_int8_keys(q, s, mean), torch.stack([mean, torch.zeros(1, 8)]))


def test_no_mean_is_the_plain_store():
    x = torch.randn(4, 3, 16)
    for a, b in zip(quantize_int8_keys(x, None), quantize_int8(x)):
        assert torch.equal(a, b)
    zero = torch.zeros(3, 16)
    for a, b in zip(quantize_int8_keys(x, zero), quantize_int8(x)):  # nothing to gain: none centred
        assert torch.equal(a, b)


def test_write_kv_ref_centres_keys_not_values():
    gen = torch.Generator().manual_seed(1)
    mean = key_mean(2, 8, gen)
    k_cache, v_cache, k_scale, v_scale = make_cache(3, 4, 2, 8, torch.int8, gen)
    k = mean + 0.2 * torch.randn(5, 2, 8, generator=gen)
    v = mean + 0.2 * torch.randn(5, 2, 8, generator=gen)
    slots = torch.tensor([0, 1, 5, 6, 11])
    dispatch.write_kv(k, v, k_cache, v_cache, k_scale, v_scale, slots, k_mean=mean)
    page, off = slots // 4, slots % 4
    assert bool((k_scale[page, off] < 0).all()) and bool((v_scale[page, off] > 0).all())
    got = torch.stack([row_kv(k_cache, k_scale, [int(p)], int(o) + 1, mean)[int(o)] for p, o in zip(page, off)])
    assert torch.allclose(got, k, atol=0.01)


def test_write_kv_ref_refuses_a_mean_it_cannot_use():
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(2, 2, 8)
    caches = make_cache(2, 4, 2, 8, torch.int8, gen)
    with pytest.raises(ValueError, match="k_mean"):
        write_kv_ref(k, k, *caches, torch.tensor([0, 1]), torch.zeros(3, 8))
    with pytest.raises(ValueError, match="k_mean"):
        write_kv_ref(k, k, *make_cache(2, 4, 2, 8, torch.float32, gen), torch.tensor([0, 1]),
                     torch.zeros(2, 8))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_paged_attention_ref_reads_centred_keys(heads, kv_heads):
    gen = torch.Generator().manual_seed(heads + kv_heads)
    d, page_tokens = 16, 4
    mean = key_mean(kv_heads, d, gen)
    k_cache, v_cache, k_scale, v_scale = make_cache(12, page_tokens, kv_heads, d, torch.int8, gen,
                                                    k_mean=mean)
    assert 0.2 < float((k_scale < 0).float().mean()) < 0.8  # a mix of centred and plain keys
    bt = random_block_table(3, 4, 12, gen)
    seq_idx = torch.tensor([0, 1, 1, 1, 2], dtype=torch.int32)
    kv_lens = torch.tensor([9, 5, 6, 7, 1], dtype=torch.int32)
    q = torch.randn(5, heads, d, generator=gen)
    args = (q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d))
    out, lse = paged_attention_ref(*args, k_mean=mean)
    want_out, want_lse = naive_attention(*args, k_mean=mean)
    assert torch.allclose(out, want_out, atol=1e-4, rtol=1e-4)
    assert torch.allclose(lse, want_lse, atol=1e-4, rtol=1e-4)
    # read without the mean, the centred keys are wrong: the mean is not optional for such a store
    assert not torch.allclose(paged_attention_ref(*args)[1], want_lse, atol=1e-2)


# --- the mean keys and the engine -----------------------------------------------------------------
def test_key_means_are_the_models_mean_roped_keys_after_the_sink():
    """measure_key_means against the model's own keys: each layer's roped keys of positions 1..
    of one prefill (recorded through a float KV context), averaged; rotated into the int8 basis."""
    from engine_helpers import tiny
    from edge_runtime.kv.key_means import _KeyRecorder, key_means_for, measure_key_means
    from edge_runtime.kernels import hadamard

    loaded = tiny()
    ids = list(range(3, 40))
    means = measure_key_means(loaded.model, ids, rotated=False)
    cfg = loaded.config
    assert means.shape == (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) and means.dtype == torch.float32
    rec = _KeyRecorder(cfg.head_dim ** -0.5)
    loaded.model(torch.tensor(ids), torch.arange(len(ids)), rec)
    for layer in range(cfg.num_layers):
        torch.testing.assert_close(means[layer], rec.keys[layer][1:].mean(0))
        assert not torch.allclose(means[layer], rec.keys[layer].mean(0))  # position 0 left out
    rotated = measure_key_means(loaded.model, ids, rotated=True)
    torch.testing.assert_close(rotated, hadamard.rotate(means))
    # the engine's: a pure function of the model (the same for every engine of it)
    torch.testing.assert_close(key_means_for(loaded, True), key_means_for(loaded, True), rtol=0, atol=0)


def test_calibration_ids_use_the_shipped_text_or_fixed_random_ids():
    from edge_runtime.kv.key_means import calibration_ids

    class Tok:
        def __call__(self, text, add_special_tokens):
            assert "<|im_start|>" in text and add_special_tokens is False
            return type("Enc", (), {"input_ids": [ord(c) for c in text]})()

    ids = calibration_ids(Tok(), 200)  # ids past the vocabulary are dropped
    assert 500 < len(ids) <= 1024 and max(ids) < 200
    random_ids = calibration_ids(None, 50)
    assert random_ids == calibration_ids(None, 50) and len(set(random_ids)) > 20
    assert len(calibration_ids(Tok(), 200, max_tokens=64)) == 64  # no longer than the context
    assert calibration_ids(None, 50, max_tokens=64) == random_ids[:64]


def test_key_means_of_a_model_with_a_short_context(tmp_path, monkeypatch):
    """A model whose context (or sliding window) is below the calibration text's length is
    calibrated on its context's worth of tokens (it used to fail with an IndexError)."""
    from engine_helpers import TINY_VOCAB
    from model_helpers import save_random_model, tiny_hf_config
    from edge_runtime.kv.key_means import key_means_for
    from edge_runtime.model.loader import load_model

    folders = [save_random_model(tiny_hf_config(arch, vocab_size=TINY_VOCAB, num_hidden_layers=1, **kw),
                                 tmp_path / arch)  # the tokenizer from the default model's cache
               for arch, kw in (("llama", {"max_position_embeddings": 64}), ("mistral", {"sliding_window": 48}))]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for folder in folders:
        loaded = load_model(str(folder), progress=None)
        assert loaded.tokenizer is not None and loaded.config.max_position_embeddings <= 64
        means = key_means_for(loaded, rotated=False)
        assert means.shape == (1, 2, 16) and torch.isfinite(means).all()


def _generate(engine, prompts):
    from engine_helpers import greedy

    return [r.completions[0].token_ids for r in engine.generate(prompts, greedy(10, ignore_eos=True))]


def test_engine_centres_keys_by_default_and_can_be_told_not_to():
    from engine_helpers import engine_for, tiny, tiny_prompts

    prompts = tiny_prompts([40, 25, 61], seed=3)
    on = engine_for(tiny(), kv_dtype="int8")
    off = engine_for(tiny(), kv_dtype="int8", centred_keys=False)
    _generate(on, prompts)
    _generate(off, prompts)
    assert on.storage.k_means is not None and off.storage.k_means is None
    assert bool((on.storage.pool.k_scale < 0).any())  # some stored keys are centred
    assert not bool((off.storage.pool.k_scale < 0).any())
    assert engine_for(tiny(), kv_dtype="fp16").storage.k_means is None  # float KV is exact


def test_centred_keys_setting_is_validated():
    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="centred_keys must be true or false"):
        EngineConfig(centred_keys="yes")


def test_budget_key_is_checked_and_reaches_the_plan(tmp_path):
    from edge_runtime.budget import load_budget
    from edge_runtime.errors import ConfigError

    src = (pathlib.Path(__file__).parents[1] / "configs/orin/cpu-dev.yaml").read_text()
    assert "centred_keys: true" in src
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("centred_keys: true", "centred_keys: 1"))
    with pytest.raises(ConfigError, match="kv.centred_keys must be true or false"):
        load_budget(str(bad))
    off = tmp_path / "off.yaml"
    off.write_text(src.replace("centred_keys: true", "centred_keys: false"))
    assert load_budget(str(off)).centred_keys is False


SCORED_TEXT = (  # fixed here (not a repository file that may change), and not the calibration text
    "The committee met on a cold morning to decide the future of the old railway line. Some members "
    "wanted to turn it into a cycle path, others to sell the land for houses, and a few still hoped "
    "that trains would return one day. After two hours of argument they agreed on a compromise: the "
    "track would be kept, a path built beside it, and the question asked again in ten years. The "
    "station building, empty since the last train left, would become a small museum run by "
    "volunteers, with the signal box open to visitors on summer weekends. Funding would come from "
    "the county, a lottery grant and a local brewery that promised to name a beer after the line.")


@pytest.mark.slow
def test_centred_keys_bring_smollm2_closer_to_fp32_kv():
    """The reason for the format: on the real model, every position scored as a decode step (as
    generation reads it), int8 KV with centred keys is nearer fp32 KV than without (KL of the
    next-token distributions; docs/engine.md has the full-window figures)."""
    from engine_helpers import engine_for, smollm2

    loaded = smollm2()
    ids = loaded.tokenizer(SCORED_TEXT, add_special_tokens=False).input_ids[:160]

    def logprobs(**cfg):  # one position per step: every position read as a decode token
        eng = engine_for(loaded, enable_prefix_cache=False, enable_inline=False, max_batch_tokens=1,
                         max_num_seqs=1, **cfg)
        return torch.cat([lg for _, lg in eng.scorer().logits(ids)]).log_softmax(-1).double()

    ref = logprobs(kv_dtype="fp32")
    kl = {}
    for centred in (True, False):
        test = logprobs(kv_dtype="int8", centred_keys=centred)
        kl[centred] = float((ref.exp() * (ref - test)).sum(-1).mean())
    assert kl[True] < 0.8 * kl[False], kl


def test_key_means_are_cached_on_disk_by_model_files(tmp_path, monkeypatch):
    """Measured once per model folder (and its files' sizes and times), read back by a new process
    (here: a new model object), measured again for a damaged entry or a changed model file."""
    import os

    from engine_helpers import tiny_folder
    from edge_runtime.kv import key_means
    from edge_runtime.model.loader import load_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "model"
    folder.mkdir()
    for f in tiny_folder().iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    first = key_means.key_means_for(load_model(str(folder), progress=None), rotated=False)
    entries = list((tmp_path / "cache" / "edge-runtime" / "key-means").glob("*.pt"))
    assert len(entries) == 1

    measured = []
    real = key_means.measure_key_means
    monkeypatch.setattr(key_means, "measure_key_means",
                        lambda *a, **k: measured.append(1) or real(*a, **k))
    again = key_means.key_means_for(load_model(str(folder), progress=None), rotated=False)
    assert measured == [] and torch.equal(again, first)  # read from the cache
    entries[0].write_bytes(b"not a tensor")
    assert torch.equal(key_means.key_means_for(load_model(str(folder), progress=None), False), first)
    assert measured == [1]  # a damaged entry is measured again (and rewritten)
    weights = next(folder.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    key_means.key_means_for(load_model(str(folder), progress=None), False)
    assert measured == [1, 1]  # a changed model file is another entry
    assert len(list(entries[0].parent.glob("*.pt"))) == 2 and not list(entries[0].parent.glob("*.tmp"))
