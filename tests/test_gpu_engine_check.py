"""tools/gpu_check.py's engine level without a GPU: its arguments, the ratios and the table from a
fake measurement, and the run's bookkeeping (a failed section is recorded and the others go on, a
spent budget skips the rest, the JSON holds what was measured)."""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the gpu_lab package
from gpu_lab import engine_check as check  # noqa: E402
from gpu_lab import engine_measure as measure  # noqa: E402


def _rows():
    step = dict(system="edge", weights="fp16", metric="step", unit="ms", launches=400, host_syncs=0)
    return [
        dict(system="edge", weights="fp16", metric="decode", batch=1, tokens=512, value=900.0, unit="tok/s"),
        dict(system="edge", weights="fp16", metric="decode", batch=5, tokens=512, value=3000.0, unit="tok/s"),
        dict(system="hf-eager", weights="fp16", metric="decode", batch=1, tokens=512, value=150.0, unit="tok/s"),
        dict(system="hf-eager", weights="fp16", metric="decode", batch=5, tokens=512, value=1000.0, unit="tok/s"),
        dict(step, batch=1, step_ms=1.2, kernel_ms=1.0, value=1.2),
        dict(step, batch=5, step_ms=2.0, kernel_ms=1.0, value=2.0),
        dict(system="edge", metric="voice", device="cuda", value=2.0, unit="req/s"),
    ]


def test_summarize_ratios_against_targets():
    got = check.summarize(_rows())
    assert got["decode_b1_vs_hf_eager"]["measured"] == 6.0 and got["decode_b1_vs_hf_eager"]["met"] is True
    assert got["decode_b5_vs_hf_eager"]["measured"] == 3.0 and got["decode_b5_vs_hf_eager"]["met"] is False
    assert got["step_b1_vs_kernel_sum"]["met"] is True  # 1.2 <= 1.5
    assert got["step_b5_vs_kernel_sum"]["measured"] == 2.0 and got["step_b5_vs_kernel_sum"]["met"] is False
    assert got["voice_gpu_vs_cpu"] == {**got["voice_gpu_vs_cpu"], "measured": None, "met": None}  # no CPU row
    text = check.table(_rows(), got)
    assert "| edge | fp16 | decode | 1 | 512 | - | 900.00 | tok/s |" in text
    assert "| edge fp16 decode tok/s / transformers eager, batch 5 | 3.00 | >= 4.0 | False |" in text


def _args(**kw):
    ap = argparse.ArgumentParser()
    check.add_arguments(ap)
    return ap.parse_args(["--engine", *kw.pop("argv", [])])


def test_run_records_failures_and_skips_and_writes_json(tmp_path, monkeypatch):
    calls = []

    def engine_rows(model, weights, args, log):
        calls.append(("engine", weights))
        return _rows()[:2] + _rows()[4:6]

    def hf_rows(model, weights, args, compiled):
        calls.append(("hf", compiled))
        if compiled:
            raise RuntimeError("torch.compile is not available here")
        return _rows()[2:4]

    voice = {"cuda": 2.0, "cpu": 0.5}
    monkeypatch.setattr(measure, "engine_rows", engine_rows)
    monkeypatch.setattr(measure, "hf_rows", hf_rows)
    monkeypatch.setattr(check, "voice_rows", lambda trace, model, device, out, timeout: [
        dict(system="edge", metric="voice", device=device, value=voice[device], unit="req/s")])
    out = tmp_path / "engine.json"
    result = check.run(_args(), lambda msg: None, out)
    assert calls == [("engine", "fp16"), ("hf", False), ("hf", True)]
    assert result["errors"] == ["transformers static cache + torch.compile fp16: RuntimeError: "
                                "torch.compile is not available here"]
    assert result["targets"]["voice_gpu_vs_cpu"]["measured"] == 4.0
    assert json.loads(out.read_text())["targets"]["decode_b1_vs_hf_eager"]["measured"] == 6.0

    spent = check.run(_args(argv=["--engine-budget-s", "-1", "--trace", ""]), lambda msg: None, out)
    assert spent["rows"] == [] and len(spent["skipped"]) == 3


def _tool():
    path = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_tool_engine", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv", [["--batches", "1,x"], ["--prefill-tokens", "0"], []])
def test_engine_level_arguments_are_checked(tmp_path, argv, capsys):
    tool = _tool()
    if tool.torch.cuda.is_available() and not argv:
        pytest.skip("a CUDA device is present: the engine level may run")
    with pytest.raises(SystemExit) as exc:
        tool.parse_args(["--engine", "--json", str(tmp_path / "x.json"), *argv])
    assert exc.value.code == 2
    assert ("positive integers" if argv else "CUDA GPU") in capsys.readouterr().err
