"""load_model / ModelConfig / the generate CLI on bad input: one ModelLoadError (or exit 2 with one
line, no traceback) naming the problem. Plus: the GGUF cache is converted once and reused, and
weight_bytes counts real storage.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from model_helpers import save_random_model, tiny_hf_config

from edge_runtime.import_path import code_argv
from edge_runtime import cli
from edge_runtime.errors import ModelLoadError
from edge_runtime.kernels import cpu_native
from edge_runtime.model import gguf_convert
from edge_runtime.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from edge_runtime.model.loader import DEFAULT_MODEL, fp32_folder, load_model, resolve_model_folder


@pytest.fixture(scope="module")
def good_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("good")
    return save_random_model(tiny_hf_config("llama", max_position_embeddings=64), folder, seed=2)


def copy_of(good_folder, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(good_folder, dst)
    return dst


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(str(tmp_path / "nope"))


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_unsupported_architecture_names_supported_ones(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    edit_config(folder, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder))
    for arch in ("GPT2LMHeadModel", *SUPPORTED_ARCHITECTURES):
        assert arch in str(err.value)


def test_unsupported_rope_scaling_is_refused(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    edit_config(folder, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(ModelLoadError, match="yarn.*llama3"):
        load_model(str(folder))


def test_truncated_safetensors(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="truncated or corrupt") as err:
        load_model(str(folder))
    assert "delete" not in str(err.value)  # the user's own folder: not ours to suggest deleting


def test_truncated_conversion_in_the_gguf_cache_names_the_folder_to_delete(good_folder, tmp_path,
                                                                           monkeypatch):
    from edge_runtime.model.gguf_convert import cache_root

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = cache_root() / "tiny-0123abcd"
    folder.parent.mkdir(parents=True)
    shutil.copytree(good_folder, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=f"; delete {folder} and the GGUF is converted again$"):
        load_model(str(folder))


def test_missing_weight_and_missing_shard(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="missing 1 weights.*up_proj"):
        load_model(str(folder))
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="shard model-00002-of-00002.safetensors.*missing"):
        load_model(str(folder))


@pytest.mark.parametrize("name, content, match", [
    ("model.safetensors.index.json", "[1]", "index.json is not a valid safetensors index"),
    ("model.safetensors.index.json", '{"weight_map": ["model.safetensors"]}',
     "index.json is not a valid safetensors index: weight_map must map tensor names to shard"),
    ("model.safetensors.index.json", '{"weight_map": {"a": 5}}',
     "index.json is not a valid safetensors index: weight_map must map tensor names to shard"),
    ("tokenizer_config.json", "[1]", "tokenizer_config.json must be a JSON object of fields, got a list"),
    ("tokenizer.json", "[]", "cannot load the tokenizer in .* \\(tokenizer.json"),
])
def test_malformed_side_files_are_load_errors(good_folder, tmp_path, name, content, match):
    """JSON of the wrong shape was a TypeError/AttributeError traceback."""
    folder = copy_of(good_folder, tmp_path)
    (folder / name).write_text(content)
    with pytest.raises(ModelLoadError, match=match) as err:
        load_model(str(folder), progress=None)
    assert "\n" not in str(err.value)


def _edit_weights(folder, edit):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_shape_mismatch_is_one_line_naming_config_keys(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    edit_config(folder, intermediate_size=128)  # the checkpoint's MLPs are 160 wide
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder), progress=None)
    assert str(err.value) == (
        "checkpoint does not match config.json: model.layers.0.mlp.down_proj.weight has shape "
        "[64, 160], config.json (intermediate_size, hidden_size) expects [64, 128] (and 5 more)")
    folder = copy_of(good_folder, tmp_path / "one")
    _edit_weights(folder, lambda s: s.update({"model.layers.1.self_attn.k_proj.weight":
                                              torch.randn(64, 64)}))
    with pytest.raises(ModelLoadError, match=r"^checkpoint does not match config.json: "
                       r"model.layers.1.self_attn.k_proj.weight has shape \[64, 64\], config.json "
                       r"\(num_key_value_heads, head_dim, hidden_size\) expects \[32, 64\]$"):
        load_model(str(folder), progress=None)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_integer_weights_in_a_float_checkpoint(good_folder, tmp_path, dtype):
    folder = copy_of(good_folder, tmp_path)
    _edit_weights(folder, lambda s: s.update({"model.norm.weight": s["model.norm.weight"].to(dtype)}))
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ModelLoadError) as err:
        load_model(str(folder), progress=None)
    assert str(err.value) == (f"model.norm.weight has dtype {name}; a float checkpoint needs "
                              "float32/float16/bfloat16 weights")


def test_missing_tokenizer(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        load_model(str(folder))


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 16)
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        load_model(str(tmp_path / "weights.bin"))


def test_unknown_quantization_method(good_folder, tmp_path):
    folder = copy_of(good_folder, tmp_path)
    edit_config(folder, quantization_config={"quant_method": "gptq", "bits": 4})
    with pytest.raises(ModelLoadError, match="gptq"):
        load_model(str(folder))


@pytest.mark.parametrize("device, cuda_count, match", [
    ("cuda", 0, "device cuda is not available here \\(no CUDA device\\); use --device cpu"),
    ("cuda:3", 1, "device cuda:3 is not available here \\(this machine has 1 CUDA device"),
    ("tpu", 1, "unknown device 'tpu'"),
])
def test_unavailable_device_is_refused_before_loading(good_folder, monkeypatch, device, cuda_count,
                                                      match):
    # used to surface as "cannot read model.safetensors (truncated or corrupt?): pin_memory=..."
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_count)
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(good_folder), device=device, progress=None)


def test_good_folder_loads_with_real_weight_bytes(good_folder):
    loaded = load_model(str(good_folder), progress=None)
    assert loaded.quantization == "none" and loaded.path == good_folder
    params = {id(p): p for p in loaded.model.parameters()}
    param_bytes = sum(p.numel() * p.element_size() for p in params.values())
    buffer_bytes = sum(b.untyped_storage().nbytes() for b in loaded.model.buffers())
    assert loaded.weight_bytes == param_bytes + buffer_bytes
    assert not any(p.is_meta for p in loaded.model.parameters())
    bf16 = load_model(str(good_folder), dtype=torch.bfloat16, progress=None)
    assert bf16.model.dtype == torch.bfloat16
    assert bf16.weight_bytes < loaded.weight_bytes


def test_config_from_hf_fields_and_eos_merge():
    cfg = tiny_hf_config("mistral", sliding_window=32, max_position_embeddings=4096).to_dict()
    mc = ModelConfig.from_hf(cfg, {"eos_token_id": [2, 7]})
    assert mc.architecture == "MistralForCausalLM" and mc.max_position_embeddings == 32
    assert mc.eos_token_ids == (2, 7) and mc.num_kv_heads == 2 and mc.head_dim == 16
    qwen = ModelConfig.from_hf({**tiny_hf_config("qwen2").to_dict(), "use_sliding_window": False,
                                "sliding_window": 16})
    assert qwen.attention_bias and qwen.sliding_window is None
    with pytest.raises(ModelLoadError, match="multiple"):
        ModelConfig.from_hf({**cfg, "num_key_value_heads": 3})
    with pytest.raises(ModelLoadError, match="no 'hidden_size' field"):
        ModelConfig.from_hf({k: v for k, v in cfg.items() if k != "hidden_size"})
    with pytest.raises(ModelLoadError, match="malformed"):
        ModelConfig.from_hf({**cfg, "vocab_size": "many"})


@pytest.mark.parametrize("change, match", [
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer, got 0"),
    ({"num_attention_heads": True}, "num_attention_heads must be a positive integer"),
    ({"hidden_size": 576.5}, "hidden_size must be a positive integer"),
    ({"num_key_value_heads": -1}, "num_key_value_heads must be a positive integer"),
    ({"architectures": [["LlamaForCausalLM"]]}, "architectures must be a list of class names"),
])
def test_config_shape_fields_must_be_positive_integers(change, match):
    cfg = {k: v for k, v in tiny_hf_config("llama").to_dict().items() if k != "head_dim"}
    with pytest.raises(ModelLoadError, match=match):
        ModelConfig.from_hf({**cfg, **change})


@pytest.mark.parametrize("change, match", [
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ({"attention_bias": 1}, "attention_bias must be true or false"),
    ({"rope_theta": 0}, "rope_theta must be a positive number, got 0"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -5}},
     "rope_parameters.rope_theta must be a positive number"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor must be a positive"),
    ({"rope_parameters": {"rope_type": "linear", "factor": -2.0, "rope_theta": 1e4}},
     "rope_parameters.factor must be a positive"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 1.0}}, "high_freq_factor .* must be larger"),
    ({"rope_scaling": "linear"}, "rope_scaling must be an object"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps must be a finite number >= 0"),
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps must be a finite number"),
    ({"rms_norm_eps": "x"}, "rms_norm_eps must be a number"),
    ({"sliding_window": -5}, "sliding_window must be a positive integer, got -5"),
])
def test_config_out_of_range_values_name_the_key(change, match):
    # each of these used to load and give NaN logits or silently drop lm_head
    cfg = {k: v for k, v in tiny_hf_config("mistral").to_dict().items()
           if k not in ("rope_scaling", "rope_parameters")}
    with pytest.raises(ModelLoadError, match=match):
        ModelConfig.from_hf({**cfg, **change})
    assert ModelConfig.from_hf({**cfg, "rms_norm_eps": 0, "sliding_window": None}).rms_norm_eps == 0


@pytest.mark.parametrize("cfg, gen", [([1, 2], None), ("llama", None), ({}, [1])])
def test_config_json_that_is_not_an_object(cfg, gen):
    with pytest.raises(ModelLoadError, match="must be a JSON object"):
        ModelConfig.from_hf(cfg if cfg else tiny_hf_config("llama").to_dict(), gen)


def test_gguf_cache_converts_once_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF fake")
    calls = []

    def fake_convert(src, out):
        calls.append(src)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_convert, "_convert", fake_convert)
    monkeypatch.setattr(gguf_convert, "check_supported", lambda path: None)  # fake GGUF files
    first = gguf_convert.ensure_converted(gguf)
    second = gguf_convert.ensure_converted(gguf)
    assert first == second and len(calls) == 1
    assert first.parent == tmp_path / "cache" / "edge-runtime" / "models"
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dir left

    def failing_convert(src, out):
        (out / "config.json").write_text("{}")
        raise ModelLoadError("boom")

    monkeypatch.setattr(gguf_convert, "_convert", failing_convert)
    gguf.write_bytes(b"GGUF changed content")  # new size -> new cache key
    with pytest.raises(ModelLoadError, match="boom"):
        gguf_convert.ensure_converted(gguf)
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no half-written folder


def test_gguf_cache_removes_stale_siblings_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_convert, "check_supported", lambda path: None)  # fake GGUF files
    monkeypatch.setattr(gguf_convert, "_convert",
                        lambda src, out: (out / "config.json").write_text(
                            json.dumps({"edge_runtime_source": str(src.resolve())})))
    kept, gone = tmp_path / "kept.gguf", tmp_path / "gone.gguf"
    kept.write_bytes(b"GGUF kept")
    gone.write_bytes(b"GGUF gone")
    kept_folder = gguf_convert.ensure_converted(kept)
    gone_folder = gguf_convert.ensure_converted(gone)
    gone.unlink()  # a deleted clone: its folder can never be used again
    root = kept_folder.parent
    converting = root / ".tmp-abc"  # another process converting right now
    converting.mkdir()
    legacy = root / "old-123"  # from before source.json: only config.json's source path
    legacy.mkdir()
    (legacy / "config.json").write_text(json.dumps({"edge_runtime_source": str(tmp_path / "m.gguf")}))
    unknown = root / "hand-made"
    unknown.mkdir()
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF v1")
    first = gguf_convert.ensure_converted(model)
    assert json.loads((first / "source.json").read_text())["size"] == len(b"GGUF v1")
    assert not legacy.exists() and not gone_folder.exists()
    model.write_bytes(b"GGUF v2, reinstalled")  # same path, new size/mtime -> new key
    second = gguf_convert.ensure_converted(model)
    assert second != first and not first.exists()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [".tmp-abc", "hand-made", kept_folder.name, second.name])


def test_gguf_cache_link_and_target_share_one_folder(tmp_path, monkeypatch):
    """A link to a GGUF (a models folder entry) and the file itself convert once into one folder:
    were the folder named by the link, each conversion would remove the other's as stale."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_convert, "check_supported", lambda path: None)  # fake GGUF files
    calls = []

    def fake_convert(src, out):
        calls.append(src)
        (out / "config.json").write_text(json.dumps({"edge_runtime_source": str(src.resolve())}))

    monkeypatch.setattr(gguf_convert, "_convert", fake_convert)
    real = tmp_path / "real-model.gguf"
    real.write_bytes(b"GGUF real")
    link = tmp_path / "models" / "nickname.gguf"
    link.parent.mkdir()
    link.symlink_to(real)
    via_link = gguf_convert.ensure_converted(link)
    direct = gguf_convert.ensure_converted(real)
    assert via_link == direct and via_link.exists() and len(calls) == 1
    assert via_link.name.startswith("real-model-")
    assert gguf_convert.ensure_converted(link) == direct and len(calls) == 1


def test_gguf_cache_removes_temp_folders_of_dead_converters(tmp_path, monkeypatch):
    import os
    import subprocess

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "cache" / "edge-runtime" / "models"
    dead = subprocess.run(code_argv("import os; print(os.getpid())"),
                          capture_output=True, text=True, check=True)
    killed = root / f".tmp-{int(dead.stdout)}-k1ll"  # a conversion killed by SIGTERM
    live = root / f".tmp-{os.getpid()}-l1ve"  # a conversion running right now
    no_pid = root / ".tmp-abc"
    for folder in (killed, live, no_pid):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"half")
    used = []

    def fake_convert(src, out):
        used.append(out.name)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_convert, "_convert", fake_convert)
    monkeypatch.setattr(gguf_convert, "check_supported", lambda path: None)  # fake GGUF files
    (tmp_path / "m.gguf").write_bytes(b"GGUF fake")
    target = gguf_convert.ensure_converted(tmp_path / "m.gguf")
    assert used[0].startswith(f".tmp-{os.getpid()}-")
    assert sorted(p.name for p in root.iterdir()) == sorted([live.name, no_pid.name, target.name])


def _disk_full_errors():
    import errno

    from safetensors import SafetensorError

    return [SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                            'message: "No space left on device" }) (os error 28)'),
            OSError(errno.ENOSPC, "No space left on device")]


@pytest.mark.parametrize("error", _disk_full_errors(), ids=["safetensors", "oserror"])
def test_gguf_conversion_on_a_full_disk_is_one_clear_error(tmp_path, monkeypatch, error):
    import safetensors.torch
    import transformers

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = transformers.AutoModelForCausalLM.from_config(tiny_hf_config("llama"))
    monkeypatch.setattr(gguf_convert, "gguf_architecture", lambda path: "llama")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)

    def full_disk(*args, **kwargs):
        raise error

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    (tmp_path / "m.gguf").write_bytes(b"GGUF fake")
    root = tmp_path / "cache" / "edge-runtime" / "models"
    with pytest.raises(ModelLoadError, match=re.escape(
            f"no space left on device writing the converted model to {root}; free space or set "
            "XDG_CACHE_HOME to a larger disk")):
        gguf_convert.ensure_converted(tmp_path / "m.gguf")
    assert list(root.iterdir()) == []  # the partial folder is gone


@pytest.mark.slow
def test_default_model_cache_is_reused():
    """Both caches of the built-in GGUF: config + tokenizer (what serving its blocks needs, no
    weights) and the float32 folder (--weights fp32)."""
    for resolve, weights in ((resolve_model_folder, False), (fp32_folder, True)):
        first = resolve(DEFAULT_MODEL)  # converts on a fresh machine
        messages = []
        assert resolve(DEFAULT_MODEL, progress=messages.append) == first
        assert messages == []  # nothing converted the second time
        assert (first / "model.safetensors").is_file() == weights
        assert (first / "chat_template.jinja").is_file() and (first / "tokenizer.json").is_file()


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


CLI_CASES = {"missing": "not found", "no-config": "no config.json", "bad-arch": "FalconForCausalLM",
             "truncated": "truncated or corrupt", "long-prompt": "context is 64",
             "bad-prompts-file": "cannot read --prompts-file"}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_bad_input_is_one_line_exit_2(case, good_folder, tmp_path, capsys):
    folder = copy_of(good_folder, tmp_path)
    model, prompt = str(folder), "hello"
    if case == "missing":
        model = str(tmp_path / "missing")
    elif case == "no-config":
        (folder / "config.json").unlink()
    elif case == "bad-arch":
        edit_config(folder, architectures=["FalconForCausalLM"])
    elif case == "truncated":
        (folder / "model.safetensors").write_bytes(b"\x10\x00")
    elif case == "long-prompt":
        prompt = "hello world " * 100  # the model's context is 64 tokens
    code, out, err = run_cli(capsys, "generate", "--model", model, "--max-tokens", "2",
                             *(["--prompts-file", str(tmp_path / "none.jsonl")]
                               if case == "bad-prompts-file" else ["--prompt", prompt]))
    lines = [line for line in err.splitlines() if line.startswith("edge-runtime generate: error:")]
    assert code == 2 and len(lines) == 1, err
    assert CLI_CASES[case] in lines[0], lines[0]
    assert "Traceback" not in err and out == ""


def _gguf_header(arch: str) -> bytes:
    import struct

    def string(s: str) -> bytes:
        return struct.pack("<Q", len(s)) + s.encode()

    kv = (string("general.alignment") + struct.pack("<II", 4, 32)
          + string("general.tags") + struct.pack("<IIQ", 9, 8, 2) + string("a") + string("bc")
          + string("general.architecture") + struct.pack("<I", 8) + string(arch))
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + kv


@pytest.mark.parametrize("content,match", [(b"NOPE" + b"\0" * 40, "not a GGUF file"),
                                           (_gguf_header("phi3"), "'phi3' is not supported"),
                                           (_gguf_header("llama")[:30], "not a valid GGUF")])
def test_bad_gguf_refused_before_conversion(content, match, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "m.gguf").write_bytes(content)
    said = []
    with pytest.raises(ModelLoadError, match=match):
        load_model(str(tmp_path / "m.gguf"), progress=said.append)
    assert not any("converting" in m for m in said), said  # refused before announcing the work
    models = tmp_path / "cache" / "edge-runtime" / "models"
    assert not models.exists() or list(models.iterdir()) == []


def test_gguf_random_bytes_after_magic_are_refused_without_allocating(tmp_path):
    import struct

    # a u64 string length of ~2e20 used to be allocated (MemoryError)
    (tmp_path / "r.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="runs past the end of the file"):
        gguf_convert.gguf_architecture(tmp_path / "r.gguf")
    tags = b"".join([struct.pack("<Q", 7), b"general", struct.pack("<IIQ", 9, 8, 2**40)])
    (tmp_path / "a.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + tags)
    with pytest.raises(ModelLoadError, match="runs past the end"):  # a huge string array
        gguf_convert.gguf_architecture(tmp_path / "a.gguf")


def test_gguf_truncated_after_the_header_is_a_load_error(tmp_path):
    import struct

    header = _gguf_header("llama")  # claims 5 tensors whose descriptions are cut off
    (tmp_path / "t.gguf").write_bytes(header[:4] + struct.pack("<IQQ", 3, 5, 3) + header[24:])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        gguf_convert._convert(tmp_path / "t.gguf", tmp_path)


def test_gguf_header_reader_finds_architecture_after_other_keys(tmp_path):
    (tmp_path / "h.gguf").write_bytes(_gguf_header("qwen2"))
    assert gguf_convert.gguf_architecture(tmp_path / "h.gguf") == "qwen2"


def test_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch, request):
    # The C kernels' build also fails under this cache and library() keeps the first outcome for
    # the process: forget it afterwards, or later tests would plan without the kernels.
    request.addfinalizer(cpu_native.library.cache_clear)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file: nothing can be created below it
    (tmp_path / "m.gguf").write_bytes(_gguf_header("llama"))
    with pytest.raises(ModelLoadError, match="XDG_CACHE_HOME"):
        load_model(str(tmp_path / "m.gguf"), progress=None)
