"""Calibration corpus and the quantize command's input checks (no model load needed)."""

from __future__ import annotations

import pytest
import torch

from awq_helpers import tiny_llama
from edge_runtime.cli import main
from edge_runtime.errors import InputError
from edge_runtime.quant import awq_algo, calibration


class _CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 256 for c in text]


def test_stdlib_docstrings_are_long_and_not_the_eval_text():
    docs = calibration.stdlib_docstrings(seed=0)  # parses the whole stdlib: once per test run
    assert len(docs) > 500 and all(len(d) >= 200 for d in docs)
    joined = "\n".join(docs)
    assert "GNU GENERAL PUBLIC LICENSE" not in joined
    assert "Apache License" not in joined


def test_calibration_ids_shape_and_short_text_error(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text("first paragraph of text\n\nsecond paragraph here\n")
    texts = calibration.read_text_file(str(path))
    assert texts == ["first paragraph of text", "second paragraph here"]
    ids = calibration.calibration_ids(_CharTokenizer(), texts * 10, num_samples=3, seq_len=16)
    assert ids.shape == (3, 16) and ids.dtype == torch.long
    with pytest.raises(InputError, match="fewer than samples x seq-len"):
        calibration.calibration_ids(_CharTokenizer(), texts, num_samples=100, seq_len=512)
    with pytest.raises(InputError, match="does not exist"):
        calibration.read_text_file(str(tmp_path / "missing.txt"))
    with pytest.raises(InputError, match="/dev/null is not a regular file"):  # said "does not exist"
        calibration.read_text_file("/dev/null")


def test_group_size_must_divide_in_features():
    model = tiny_llama(hidden_size=96, intermediate_size=192, num_attention_heads=3,
                       num_key_value_heads=1, head_dim=32)
    awq_algo.check_group_size(model.model.layers, 32)
    with pytest.raises(ValueError, match="group size 64 does not divide"):
        awq_algo.check_group_size(model.model.layers, 64)


def test_quantize_refuses_a_non_empty_output_folder(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    assert main(["quantize", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists and is not empty" in err[0]


def test_calibration_file_that_is_a_folder_or_unreadable(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="is a folder"):
        calibration.read_text_file(str(tmp_path))
    path = tmp_path / "calib.txt"
    path.write_text("text\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(calibration.Path, "read_text", denied)
    with pytest.raises(InputError, match=r"cannot be read \(Permission denied\)"):
        calibration.read_text_file(str(path))


@pytest.fixture()
def no_model_load(monkeypatch):
    """quantize's argument checks must fail before the model is loaded."""
    import edge_runtime.model.loader as loader

    def load_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(loader, "load_model", load_model)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("out, extra, match", [
    ("file", [], "is a file; give a folder name"),
    ("missing/out", [], "does not exist; create it"),
    ("file/sub", [], "--out file/sub: file is a file, not a folder"),  # said "does not exist"
    ("/proc/edge-runtime-quantize-test", [], "cannot create a folder in /proc"),
    ("new", ["--samples", "0"], "--samples must be >= 1, got 0"),
    ("new", ["--samples", "-3"], "--samples must be >= 1, got -3"),
    ("new", ["--seq-len", "0"], "--seq-len must be >= 16, got 0"),
    ("new", ["--calib", "missing.txt"], "missing.txt does not exist"),
    ("new", ["--calib", "empty.txt"], "empty.txt is empty"),
])
def test_quantize_checks_arguments_before_loading(tmp_path, monkeypatch, capsys, no_model_load,
                                                  out, extra, match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty.txt").write_text("")
    assert main(["quantize", "--out", out, *extra]) == 2
    assert match in _one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "file"]


def test_quantize_refuses_seq_len_beyond_the_model_context(tmp_path, monkeypatch, capsys):
    from types import SimpleNamespace

    import edge_runtime.model.loader as loader

    lm = SimpleNamespace(quantization="none", config=SimpleNamespace(max_position_embeddings=64))
    monkeypatch.setattr(loader, "load_model", lambda *a, **k: lm)
    assert main(["quantize", "--out", str(tmp_path / "q"), "--seq-len", "65"]) == 2
    assert "--seq-len 65 is longer than the model's context (64 tokens)" in _one_error_line(capsys)


@pytest.mark.parametrize("rope_scaling", [{"rope_type": "linear", "factor": 2.0},
                                          {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 256}])
def test_quantize_refuses_rope_scaling_in_one_line(tmp_path, capsys, rope_scaling):
    """docs/awq.md "Known limits": the searches assume default RoPE (was an AttributeError)."""
    from model_helpers import copy_tokenizer

    folder = tmp_path / "model"
    tiny_llama(num_hidden_layers=1, rope_scaling=rope_scaling).save_pretrained(folder)
    copy_tokenizer(folder)
    capsys.readouterr()
    assert main(["quantize", "--model", str(folder), "--out", str(tmp_path / "q")]) == 2
    line = _one_error_line(capsys)
    assert f"default RoPE only; this model has {rope_scaling['rope_type']!r} rope scaling" in line
    assert not (tmp_path / "q").exists()
