"""`edge-runtime bench engine` on a tiny random-weight Llama, and the command discovery."""

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import make_tiny_llama  # noqa: E402

from edge_runtime.bench.engine_bench import (STEADY_SPREAD, decode_ratios,  # noqa: E402
                                             format_ratios, parse_int_list, table_rows)
from edge_runtime.bench.engine_runs import add_roofline, random_prompts  # noqa: E402
from edge_runtime.cli import build_parser, main  # noqa: E402
from edge_runtime.errors import InputError  # noqa: E402


def test_bench_engine_json(tmp_path):
    model = make_tiny_llama(tmp_path / "m")
    out = tmp_path / "e.json"
    rc = main(["bench", "engine", "--model", str(model), "--batch", "1,2", "--prompt-tokens", "9",
               "--gen-tokens", "4", "--repeat", "2", "--bandwidth-mib", "4", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["batch"], r["prompt_tokens"]) for r in data["rows"]] == [(1, 9), (2, 9)]
    for r in data["rows"]:
        assert len(r["decode_samples"]) == 2 and min(r["decode_samples"]) > 0
        assert r["decode_tok_s"]["n"] == 2 and r["weight_read_gbps"]["mean"] > 0
        # weight GB/s is weight bytes x decode steps/s, steps/s = tok/s / batch
        want = data["weight_bytes"] * r["decode_tok_s"]["mean"] / r["batch"] / 1e9
        assert r["weight_read_gbps"]["mean"] == pytest.approx(want)
        # each run's roofline is the higher of the readings taken right before and after it
        assert len(r["bandwidth"]) == 2
        roofs = [max(x["read_gbps"], y["read_gbps"]) for x, y in r["bandwidth"]]
        assert min(roofs) > 0
        assert r["roofline_read_gbps"]["mean"] == pytest.approx(sum(roofs) / 2)
        pct = [100 * g / x for g, x in zip(r["weight_read_gbps_samples"], roofs)]
        assert r["roofline_pct"]["mean"] == pytest.approx(sum(pct) / 2)
    # runs are interleaved: batch 1's run i sits between batch 2's runs i-1 and i, so each
    # reading after a run is the reading before the next run of the other batch size
    b1, b2 = data["rows"]
    assert b1["bandwidth"][0][1] == b2["bandwidth"][0][0]
    assert b2["bandwidth"][0][1] == b1["bandwidth"][1][0]
    assert data["bandwidth"]["read_gbps"] > 0 and data["machine"]["cpu_model"]
    # batch 2 over batch 1: of the means, and run i over run i with batch 1's roofline of run i
    (ratio,) = data["decode_ratios"]
    assert (ratio["batch"], ratio["prompt_tokens"]) == (2, 9)
    assert ratio["of_means"] == pytest.approx(b2["decode_tok_s"]["mean"] / b1["decode_tok_s"]["mean"])
    assert ratio["per_run"] == pytest.approx([y / x for x, y in zip(b1["decode_samples"],
                                                                      b2["decode_samples"])])
    assert ratio["batch1_roofline_gbps"] == pytest.approx(
        [max(x["read_gbps"], y["read_gbps"]) for x, y in b1["bandwidth"]])
    assert ratio["roofline_gbps"] == pytest.approx(
        [max(x["read_gbps"], y["read_gbps"]) for x, y in b2["bandwidth"]])
    for steady, a, b in zip(ratio["steady"], b1["bandwidth"], b2["bandwidth"]):
        readings = [r["read_gbps"] for r in (*a, *b)]
        assert steady == (max(readings) <= STEADY_SPREAD * min(readings))


def test_ratio_pairs_whose_bandwidth_changed_are_marked():
    def row(batch, samples, reads):
        return {"prompt_tokens": 8, "batch": batch, "decode_tok_s": {"mean": sum(samples) / 2},
                "decode_samples": samples,
                "bandwidth": [({"read_gbps": a}, {"read_gbps": b}) for a, b in reads]}

    ratios = decode_ratios([row(1, [10.0, 10.0], [(60, 62), (33, 61)]),
                            row(5, [35.0, 45.0], [(62, 61), (35, 34)])])
    (q,) = ratios
    assert q["per_run"] == pytest.approx([3.5, 4.5]) and q["steady"] == [True, False]
    lines = format_ratios(ratios)
    assert "3.50 (62/62 GB/s)" in lines[0] and "4.50 (61/35 GB/s, unsteady)" in lines[0]
    assert lines[-1].startswith("unsteady:")


def test_helpers():
    assert parse_int_list("1,2, 5", "--batch") == [1, 2, 5]
    for bad in ("", "0", "a,b"):
        with pytest.raises(InputError):
            parse_int_list(bad, "--batch")
    prompts = random_prompts(random.Random(0), 50, {0, 1, 2}, 3, 20)
    assert len(prompts) == 3 and all(len(p) == 20 for p in prompts)
    assert not {0, 1, 2} & {t for p in prompts for t in p} and len({tuple(p) for p in prompts}) == 3
    row = {"batch": 1, "prompt_tokens": 8, "gen_tokens": 4,
           "prefill_tok_s": {"mean": 10.0, "stddev": 1.0, "n": 2},
           "decode_tok_s": {"mean": 5.0, "stddev": 0.5, "n": 2},
           "weight_read_gbps": {"mean": 2.5, "stddev": 0.7, "n": 2},
           "weight_read_gbps_samples": [3.0, 2.0], "repeat": 2}
    add_roofline(row, [6.0, 8.0])  # the runs' rooflines
    assert row["roofline_read_gbps"]["mean"] == 7.0
    assert row["roofline_pct"]["mean"] == pytest.approx((50.0 + 25.0) / 2)
    shown = table_rows([row])[0]
    assert shown["decode"] == "5.0 ± 0.5" and shown["roofline"].startswith("38 ± ")


def test_bench_subcommands_discovered(capsys):
    parser = build_parser()
    args = parser.parse_args(["bench", "engine", "--batch", "1"])
    assert args.func.__module__ == "edge_runtime.bench.engine_bench"
    args = parser.parse_args(["bench", "trace", "--trace", "x.jsonl"])
    assert args.func.__module__ == "edge_runtime.bench.trace_bench"
    assert main(["bench"]) == 2
    assert "engine" in capsys.readouterr().out


def test_bench_step_json(tmp_path):
    model = make_tiny_llama(tmp_path / "m")
    out = tmp_path / "s.json"
    assert main(["bench", "step", "--model", str(model), "--batch", "1,3", "--prompt-tokens", "7",
                 "--steps", "4", "--profile", "3", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["engine_step_ms"] > 0 and r["hf_forward_ms"] > 0
        assert r["throughput_ratio"] == pytest.approx(r["batch"] / r["step_ratio"])
        assert 0 < r["layers_ms"] < r["engine_step_ms"] and 0 < r["lm_head_ms"] < r["engine_step_ms"]
        assert r["other_ms"] > 0


def test_bench_step_decoder_phases(tmp_path, monkeypatch, capsys):
    """With EDGE_RUNTIME_CPU_PHASE_TIMES=1 the kernels build with timers and `--decoder-phases`
    reports the six phases of the C decoder layers per step, per thread."""
    from edge_runtime.kernels import cpu_native
    from edge_runtime.kernels.cpu_decoder import DECODER_PHASES

    if cpu_native.library() is None:
        pytest.skip("kernels/csrc not built (no C compiler)")
    model = make_tiny_llama(tmp_path / "m")
    out = tmp_path / "s.json"
    monkeypatch.setenv(cpu_native.ENV_PHASE_TIMES, "1")
    cpu_native.library.cache_clear()
    try:
        assert main(["bench", "step", "--model", str(model), "--batch", "1,3", "--prompt-tokens",
                     "7", "--steps", "4", "--threads", "2", "--decoder-phases",
                     "--json", str(out)]) == 0
    finally:
        monkeypatch.delenv(cpu_native.ENV_PHASE_TIMES)
        cpu_native.library.cache_clear()
    rows = json.loads(out.read_text())["rows"]
    for r in rows:
        assert [p["phase"] for p in r["decoder_phases"]] == list(DECODER_PHASES)
        assert all(p["ms"] > 0 and len(p["work_ms"]) == 2 for p in r["decoder_phases"])
        # per step: each phase, and each thread's work over all phases, lies inside the step, so
        # stays below the steps' mean (phases of different threads may overlap on a busy machine,
        # and the median step leaves out the descheduled ones the means include)
        mean = r["engine_step_mean_ms"] * 1.05
        assert all(p["ms"] <= mean for p in r["decoder_phases"])
        assert all(sum(p["work_ms"][t] for p in r["decoder_phases"]) <= mean for t in range(2))
    assert "decoder layers of a batch-3 step, by phase" in capsys.readouterr().out


@pytest.mark.parametrize("fused", ["1", "0"], ids=["c-stack", "torch-layers"])
def test_step_phases_time_layers_and_head_then_leave_the_model_as_it_was(tmp_path, monkeypatch,
                                                                        fused):
    from edge_runtime.bench.edge_systems import build_engine, load
    from edge_runtime.bench.step_phases import StepPhases
    from edge_runtime.engine.api import SamplingParams

    monkeypatch.setenv("EDGE_RUNTIME_CPU_FUSED", fused)
    engine = build_engine(load(str(make_tiny_llama(tmp_path / "m"))), "edge", max_tokens=64)
    before = engine.model.fused_decoder
    if fused == "1" and before is None:
        pytest.skip("kernels/csrc not built (no C compiler): no C layer stack")
    assert (before is None) == (fused == "0")
    phases = StepPhases(engine.model)
    engine.add_request([5, 6, 7], SamplingParams(max_tokens=4, temperature=0.0))
    while engine.has_unfinished():
        engine.step()
        split = phases.take()
        assert split["layers"] > 0 and split["lm_head"] > 0, split
    phases.remove()
    assert engine.model.fused_decoder is before
    engine.step()
    assert phases.take() == {"layers": 0.0, "lm_head": 0.0}


def test_bench_linear_json(tmp_path):
    from edge_runtime.bench.linear_bench import packed_kinds

    model = make_tiny_llama(tmp_path / "m")
    out = tmp_path / "l.json"
    assert main(["bench", "linear", "--model", str(model), "--rows", "1,3", "--repeat", "2",
                 "--bandwidth-mib", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    backends = ["torch F.linear (MKL)"] + packed_kinds()
    assert [(r["backend"], r["rows"]) for r in data["rows"]] == [(b, n) for b in backends for n in (1, 3)]
    for r in data["rows"]:
        assert r["gbps"] == pytest.approx(data["weight_bytes"] / (r["ms"] / 1e3) / 1e9)


def test_bench_attention_json(tmp_path, capsys):
    from edge_runtime.kernels import cpu_native

    if cpu_native.library() is None:
        pytest.skip("kernels/csrc not built (no C compiler)")
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--rows", "1,2", "--keys", "9,20", "--layers", "2",
                 "--page-tokens", "8", "--flush-mib", "1", "--repeat", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(r["rows"], r["keys"]) for r in data["rows"]] == [(1, 9), (1, 20), (2, 9), (2, 20)]
    for r in data["rows"]:  # ns per (row, kv head, key, layer) visit, from the same best time
        assert r["ns_per_key"] == pytest.approx(r["ms"] * 1e6 / (r["rows"] * 3 * r["keys"] * 2))
    assert "ns per key visit" in capsys.readouterr().out
    assert main(["bench", "attention", "--heads", "8", "--kv-heads", "3"]) != 0
    assert "multiple of --kv-heads" in capsys.readouterr().err


def test_bench_linear_quantized_chain_is_the_gguf_s_blocks_as_the_cpu_back_end_holds_them(tmp_path,
                                                                                          monkeypatch):
    from edge_runtime.bench.linear_bench import quantized_chain
    from edge_runtime.kernels import cpu_native

    if cpu_native.library() is None:
        pytest.skip("kernels/csrc not built (no C compiler)")
    from types import SimpleNamespace

    from backend_helpers import gguf_config, tiny_gguf_file

    from edge_runtime.model import loader
    from edge_runtime.model.gguf_int4 import build_gguf_model

    def load_blocks(path, progress=None, weights="auto"):  # the tiny file has no tokenizer
        assert weights == "gguf"
        model, quantization = build_gguf_model(Path(path), gguf_config(), "llama")
        return SimpleNamespace(model=model, quantization=quantization)

    assert quantized_chain(str(make_tiny_llama(tmp_path / "m"))) == ("", [])
    monkeypatch.setattr(loader, "load_model", load_blocks)
    quantization, chain = quantized_chain(str(tiny_gguf_file()))
    assert quantization.startswith("gguf-") and chain
    storages = {t.untyped_storage().data_ptr() for m in chain for t in (m.data, m.scales)}
    assert len(storages) == 1  # one huge-page arena, as the engine reads them
    import torch

    x = torch.randn(2, chain[0].in_features)
    torch.testing.assert_close(chain[0](x), chain[0].reference_forward(x), rtol=1e-5, atol=1e-5)
