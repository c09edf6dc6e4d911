"""`edge-runtime models` (commands/models.py) and the one `--model` resolver (model/model_names.py).

The models folder is a temporary one ($EDGE_RUNTIME_MODELS) holding files made here: a copy of the
built-in SmolLM2 GGUF under another name, a header-only GGUF of an architecture the runtime refuses,
a file that is not a GGUF, a GGUF with a block type the runtime cannot serve, a Hugging Face folder
(the tiny random Llama) and a file that is neither. Each row is checked against gguf's own reader
(parameters, types) and against `edge-runtime plan --json` (the streams of 2,048 tokens).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest

from backend_helpers import tiny_folder
from edge_runtime.budget import available_budgets, load_budget
from edge_runtime.cli import main
from edge_runtime.commands.models import budget_fit, model_row
from edge_runtime.errors import ModelLoadError
from edge_runtime.kv.page_math import pages_for_tokens
from edge_runtime.model.loader import DEFAULT_MODEL, gguf_source, resolve_model_folder
from edge_runtime.model.model_names import folder_models, model_path

STREAM = 2048


def _header_only(path: Path, arch: str) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def _unserved_type(path: Path) -> Path:
    """A llama GGUF whose matrices are IQ2_XXS, a type the runtime does not serve from blocks."""
    builtin = gguf_source(DEFAULT_MODEL)
    reader = gguf.GGUFReader(builtin)
    writer = gguf.GGUFWriter(str(path), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    iq2 = gguf.GGMLQuantizationType.IQ2_XXS
    block, size = gguf.GGML_QUANT_SIZES[iq2]
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        if len(shape) == 2 and t.name.startswith("blk."):  # bytes only: never dequantized here
            raw = np.zeros((shape[0], shape[1] // block * size), np.uint8)
            writer.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=iq2)
        else:
            writer.add_tensor(t.name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape,
                              raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def models_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    # a copy, not a link: a link resolves to the built-in's path, and the GGUF cache keeps one
    # converted folder per resolved source (gguf_convert.remove_stale_siblings)
    shutil.copyfile(gguf_source(DEFAULT_MODEL), folder / "smol-copy.gguf")
    _header_only(folder / "phi4-mini.gguf", "phi3")
    (folder / "notes.gguf").write_text("not a model\n")
    _unserved_type(folder / "smol-iq2.gguf")
    (folder / "tiny-hf").symlink_to(tiny_folder(), target_is_directory=True)  # a folder: no cache
    (folder / "README.txt").write_text("ignored: neither a .gguf nor a folder with config.json\n")
    return folder


@pytest.fixture()
def in_folder(models_folder, monkeypatch) -> Path:
    monkeypatch.setenv("EDGE_RUNTIME_MODELS", str(models_folder))
    return models_folder


@pytest.fixture(scope="module")
def listing(models_folder) -> tuple[int, dict]:
    """`edge-runtime models --json MISSING` over the folder, run once for the module."""
    import contextlib
    import io
    import os

    out = io.StringIO()
    old = os.environ.get("EDGE_RUNTIME_MODELS")
    os.environ["EDGE_RUNTIME_MODELS"] = str(models_folder)
    try:
        with contextlib.redirect_stdout(out):
            rc = main(["models", "--json", "--device", "cpu", "no-such-model"])
    finally:
        if old is None:
            del os.environ["EDGE_RUNTIME_MODELS"]
        else:
            os.environ["EDGE_RUNTIME_MODELS"] = old
    return rc, json.loads(out.getvalue())


def _row(report: dict, name: str) -> dict:
    rows = {r["name"]: r for r in report["models"]}
    assert name in rows, sorted(rows)
    return rows[name]


def test_the_folder_lists_gguf_files_and_model_folders_by_name(in_folder):
    assert set(folder_models()) == {"smol-copy", "phi4-mini", "notes", "smol-iq2", "tiny-hf"}


def test_every_model_is_listed_and_a_bad_one_does_not_stop_the_others(listing):
    rc, report = listing
    assert rc == 1  # some models had a problem
    names = [r["name"] for r in report["models"]]
    assert names[0] == DEFAULT_MODEL
    assert set(names) == {DEFAULT_MODEL, "notes", "phi4-mini", "smol-iq2", "smol-copy", "tiny-hf",
                          "no-such-model"}
    assert report["budgets"] == available_budgets()
    for name in (DEFAULT_MODEL, "smol-copy", "tiny-hf"):
        row = _row(report, name)
        assert row["problem"] == "", (name, row["problem"])
        assert set(row["budgets"]) == set(available_budgets())


def test_gguf_rows_match_gguf_reader(listing):
    _, report = listing
    reader = gguf.GGUFReader(gguf_source(DEFAULT_MODEL))
    kinds = Counter(t.tensor_type.name for t in reader.tensors)
    for name in (DEFAULT_MODEL, "smol-copy"):
        row = _row(report, name)
        assert row["format"] == "gguf" and row["architecture"] == "llama"
        assert row["parameters"] == sum(int(t.n_elements) for t in reader.tensors)
        assert row["block_types"] == dict(kinds)
        assert row["file_bytes"] == gguf_source(DEFAULT_MODEL).stat().st_size


def test_folder_row_counts_its_safetensors(listing):
    from safetensors import safe_open

    _, report = listing
    row = _row(report, "tiny-hf")
    with safe_open(str(tiny_folder() / "model.safetensors"), framework="pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys()]
    assert row["format"] == "safetensors" and row["architecture"] == "LlamaForCausalLM"
    assert row["parameters"] == sum(math.prod(s) for s in shapes)
    assert sum(row["block_types"].values()) == len(shapes)


def _plan(model: str, budget: str) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--config", budget, "--model", model, "--device", "cpu", "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("budget", ["cpu-dev", "orin-nano-8gb", "agx-orin-64gb"])
def test_streams_are_the_plans_pages_over_2048_tokens(listing, budget):
    """What `plan` says for the same model and budget: its pages, in streams of 2,048 tokens."""
    _, report = listing
    plan = _plan(gguf_source(DEFAULT_MODEL).as_posix(), budget)
    fit = _row(report, DEFAULT_MODEL)["budgets"][budget]
    assert fit["weight_bytes"] == plan["weight_bytes"]
    assert fit["num_pages"] == plan["num_pages"]
    assert fit["streams"] == plan["num_pages"] // pages_for_tokens(STREAM, plan["page_tokens"])
    assert fit["fits"] and fit["streams"] > 0
    if plan["stream_context_tokens"] == STREAM:
        assert fit["streams"] == plan["streams_that_fit"]


def test_bad_models_say_what_is_wrong(listing):
    _, report = listing
    assert "not found" in _row(report, "no-such-model")["problem"]
    assert "smol-copy" in _row(report, "no-such-model")["problem"]  # the names that exist
    assert "not a GGUF file" in _row(report, "notes")["problem"]
    phi = _row(report, "phi4-mini")
    assert phi["architecture"] == "phi3"  # what could be read is shown
    assert "not supported" in phi["problem"] and "gemma3" in phi["problem"]
    iq2 = _row(report, "smol-iq2")
    assert iq2["block_types"]["IQ2_XXS"] > 0
    assert "IQ2_XXS" in iq2["problem"] and "cannot serve" in iq2["problem"]


def test_table_names_every_model_and_its_notes(in_folder, capsys):
    assert main(["models", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    for name in (DEFAULT_MODEL, "smol-copy", "tiny-hf", "phi4-mini", "notes", "smol-iq2"):
        assert f"| {name} |" in out
    assert "notes:" in out and "not supported" in out
    assert str(in_folder) in out


def test_a_budget_the_weights_do_not_fit_is_a_result_with_the_plans_reason():
    budget = load_budget("cpu-dev")
    reserved = budget.os_reserve + budget.other_reserve + budget.activation_reserve
    budget = dataclasses.replace(budget, device_memory=reserved + 2**20)
    fit = budget_fit(DEFAULT_MODEL, budget, "cpu")
    assert not fit["fits"] and fit["streams"] == 0
    assert "no room for one KV page" in fit["reason"]


def test_model_names_resolve_for_every_command(in_folder):
    """The folder's names reach the loader (and so generate, serve, bench, plan): the same file."""
    assert model_path("smol-copy") == in_folder / "smol-copy.gguf"
    assert gguf_source("smol-copy") == in_folder / "smol-copy.gguf"
    linked = json.loads((resolve_model_folder("smol-copy", progress=None) / "config.json").read_text())
    builtin = json.loads((resolve_model_folder(DEFAULT_MODEL, progress=None) / "config.json").read_text())
    for key in ("_name_or_path", "edge_runtime_source"):  # the file each was read from
        linked.pop(key), builtin.pop(key)
    assert linked == builtin
    assert model_path("tiny-hf") == in_folder / "tiny-hf"
    assert gguf_source("tiny-hf") is None
    with pytest.raises(ModelLoadError, match="not found.*smol-copy.*EDGE_RUNTIME_MODELS"):
        model_path("qwen-missing")


def test_a_path_wins_over_a_folder_name(in_folder, tmp_path, monkeypatch):
    (tmp_path / "smol-copy").mkdir()
    (tmp_path / "smol-copy" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert model_path("smol-copy") == Path("smol-copy")


def test_generate_takes_a_folder_name(in_folder, capsys):
    """The copy under its folder name answers as the built-in file does (greedy, the same ids)."""
    answers = []
    for model in ("smol-copy", DEFAULT_MODEL):
        rc = main(["generate", "--model", model, "--prompt", "The capital of France is",
                   "--max-tokens", "4", "--temperature", "0", "--json"])
        assert rc == 0
        answers.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"])
    assert answers[0] == answers[1] and answers[0]


def test_without_the_folder_the_listing_has_the_builtin(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("EDGE_RUNTIME_MODELS", str(tmp_path / "absent"))
    assert main(["models", "--json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in report["models"]] == [DEFAULT_MODEL]
    assert report["models_folder"] == str(tmp_path / "absent")


def test_default_models_folder_follows_xdg(monkeypatch, tmp_path):
    from edge_runtime.paths import models_dir

    monkeypatch.delenv("EDGE_RUNTIME_MODELS", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert models_dir() == tmp_path / "edge-runtime" / "models"


def test_an_unreadable_model_is_a_row_with_the_reason(monkeypatch, tmp_path):
    """What the OS refuses (here a permission error, which root's test runs cannot provoke with
    chmod) becomes the row's problem, not the listing's end."""
    from edge_runtime.model import model_info

    def unreadable(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(model_info, "describe_model", unreadable)
    row = model_row("x", "given", tmp_path / "x.gguf", "", [], "cpu")
    assert "cannot read" in row["problem"] and "Permission denied" in row["problem"]
    assert str(tmp_path / "x.gguf") in row["problem"]
