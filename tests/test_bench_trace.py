"""`edge-runtime bench trace` end to end on a tiny random-weight Llama: every system, JSON, PNG.

Checks structure and cross-system consistency (records per turn, cache accounting, the hf baseline
against a direct transformers generate, our engine with fp32 KV against hf), never wall-clock time.
"""

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import make_tiny_llama, write_trace  # noqa: E402

from edge_runtime.bench.stats import percentile  # noqa: E402
from edge_runtime.bench.trace_bench import compare, identical_answers, parse_systems  # noqa: E402
from edge_runtime.bench.trace_worker import later_turn_ttfts  # noqa: E402
from edge_runtime.cli import main  # noqa: E402
from edge_runtime.errors import InputError  # noqa: E402

STREAMS, TURNS = 3, 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_trace")
    return make_tiny_llama(d / "model"), write_trace(d / "trace.jsonl", STREAMS, TURNS)


@pytest.fixture(scope="module")
def report(tiny, tmp_path_factory):
    model, trace = tiny
    out = tmp_path_factory.mktemp("out")
    rc = main(["bench", "trace", "--trace", str(trace), "--model", str(model), "--no-isolate",
               "--json", str(out / "r.json"), "--plot", str(out / "r.png")])
    assert rc == 0
    return json.loads((out / "r.json").read_text()), out


def test_rows_records_and_files(report):
    data, out = report
    rows = {r["system"]: r for r in data["rows"]}
    assert set(rows) == {"edge", "edge-noshare", "edge-fp16kv", "hf"}
    for name, row in rows.items():
        assert row["requests"] == STREAMS * TURNS
        recs = data["records"][name]
        assert sorted((r["stream"], r["turn"]) for r in recs) == sorted(
            (str(s), t) for s in range(STREAMS) for t in range(TURNS))
        assert row["output_tokens"] == sum(r["output_tokens"] for r in recs) > 0
        assert row["peak_kv_bytes"] > 0 and row["peak_rss_bytes"] > 0
        assert 0 < row["ttft_p50_s"] <= row["ttft_p95_s"]
        later = [r["ttft_s"] for r in recs if r["turn"] > 0]  # turns count from 0 here
        assert len(later) == STREAMS * (TURNS - 1) == len(later_turn_ttfts(
            (r["stream"], r["turn"], r["ttft_s"]) for r in recs))
        assert row["ttft_p95_later_turns_s"] == pytest.approx(percentile(later, 95))
        assert row["jtop"].startswith("unavailable")
        # later turns carry the history, so prompts grow within a stream
        for s in range(STREAMS):
            lens = [r["prompt_tokens"] for r in recs if r["stream"] == str(s)]
            assert lens == sorted(lens) and lens[0] < lens[-1]
    assert rows["edge"]["cached_prompt_tokens"] > 0
    assert rows["edge-noshare"]["cached_prompt_tokens"] == 0 == rows["hf"]["cached_prompt_tokens"]
    assert rows["edge"]["prompt_tokens"] >= rows["edge"]["cached_prompt_tokens"]
    assert rows["edge"]["kv_dtype"] == "int8" and rows["edge-fp16kv"]["kv_dtype"] == "fp16"
    assert {c["comparison"] for c in data["comparisons"]} >= {"edge/hf requests/s"}
    assert data["edge_vs_fp16kv_identical"]["total"] == STREAMS * TURNS
    assert (out / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_hf_baseline_matches_direct_generate(tiny, report):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edge_runtime.model.chat import encode_messages

    model_dir, trace = tiny
    data, _ = report
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    first = json.loads(trace.read_text().splitlines()[0])
    ids = encode_messages(tok, [{"role": "system", "content": first["system"]},
                                {"role": "user", "content": first["command"]}])
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=first["max_tokens"],
                             do_sample=False, pad_token_id=tok.eos_token_id)
    want = tok.decode(out[0, len(ids):], skip_special_tokens=True)
    rec = next(r for r in data["records"]["hf"] if r["stream"] == "0" and r["turn"] == 0)
    assert rec["text"] == want and rec["prompt_tokens"] == len(ids)


def test_edge_backend_fp32_kv_matches_hf_first_turns(tiny, report):
    from edge_runtime.bench.edge_systems import EdgeBackend, build_engine, load
    from edge_runtime.bench.replay import replay
    from edge_runtime.bench.trace import load_trace

    model_dir, trace_path = tiny
    loaded = load(str(model_dir))
    backend = EdgeBackend(loaded, "edge", build_engine(loaded, "edge", kv_dtype="fp32"))
    try:
        result = asyncio.run(replay(load_trace(trace_path), backend))
    finally:
        backend.close()
    hf = {(r["stream"], r["turn"]): r for r in report[0]["records"]["hf"]}
    for rec in result.records:
        if rec.turn == 0:
            assert rec.text == hf[(rec.stream, 0)]["text"]
            assert rec.prompt_tokens == hf[(rec.stream, 0)]["prompt_tokens"]
    assert backend.kv.peak > 0 and backend.kv.samples[-1][1] == 0  # all released when idle


def test_compare_and_identical_helpers():
    rows = {"edge": {"requests_per_s": 10.0, "ttft_p95_s": 0.01, "peak_kv_bytes": 50},
            "hf": {"requests_per_s": 2.0, "ttft_p95_s": 0.2, "peak_kv_bytes": None}}
    got = {c["comparison"]: c for c in compare(rows)}
    assert got["edge/hf requests/s"]["ratio"] == 5.0 and got["edge/hf requests/s"]["pass"] is True
    assert got["edge/hf TTFT p95"]["pass"] is True
    assert "edge/edge-noshare TTFT p95" not in got
    a = [{"stream": "0", "turn": 0, "text": "x"}, {"stream": "0", "turn": 1, "text": "y"}]
    b = [{"stream": "0", "turn": 0, "text": "x"}, {"stream": "0", "turn": 1, "text": "z"}]
    assert identical_answers(a, b) == {"identical": 1, "total": 2, "identical_first_turn": 1,
                                       "first_turn_total": 1}
    # the 4-bit decode target is a batch-1 one: met only when one stream is replayed
    fp32w = {"edge": {"tpot_p50_s": 0.006}, "edge-fp32w": {"tpot_p50_s": 0.018}}
    assert compare(fp32w, streams=1)[0]["pass"] is True
    at_five = compare(fp32w, streams=5)[0]
    assert at_five["pass"] is None and at_five["ratio"] == pytest.approx(1 / 3)
    assert "--streams 1" in at_five["target"]
    with pytest.raises(InputError):
        parse_systems("edge,vllm")
    # streams that start at different turn numbers: each stream's own first turn counts
    c = [{"stream": "a", "turn": 0, "text": "x"}, {"stream": "a", "turn": 1, "text": "y"},
         {"stream": "b", "turn": 1, "text": "x"}]
    assert identical_answers(c, c)["first_turn_total"] == 2


def test_report_header_shows_uneven_streams():
    from edge_runtime.bench.trace_bench import _shape

    recs = [{"stream": s, "turn": t} for s, t in [("a", 0), ("a", 1), ("a", 2), ("b", 1)]]
    assert _shape({"edge": {"records": recs}}) == "2 streams, 4 requests (1-3 turns per stream)"
    assert _shape({"edge": {"records": recs[:1] + recs[3:]}}) == "2 streams x 1 turns"


def test_cli_errors_are_one_line(tiny, capsys):
    _, trace = tiny
    assert main(["bench", "trace", "--trace", "/nonexistent.jsonl"]) == 2
    assert main(["bench", "trace", "--trace", str(trace), "--systems", "bogus"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "--systems" in err and "Traceback" not in err


def test_from_json_reports_saved_runs(tiny, report, tmp_path, capsys):
    data, out = report
    _, trace = tiny
    merged = tmp_path / "m.json"
    assert main(["bench", "trace", "--trace", str(trace), "--from-json", str(out / "r.json"),
                 "--json", str(merged), "--plot", str(tmp_path / "m.png")]) == 0
    again = json.loads(merged.read_text())
    assert again["rows"] == data["rows"] and again["comparisons"] == data["comparisons"]
    printed = capsys.readouterr().out
    assert "edge/hf requests/s" in printed and "answers identical to hf" in printed
    assert main(["bench", "trace", "--trace", str(trace), "--from-json", str(trace)]) == 2
    # the saved run's settings are reported, not this command line's replay options
    assert main(["bench", "trace", "--trace", str(tmp_path / "other.jsonl"), "--model", "/other",
                 "--history", "scripted", "--from-json", str(out / "r.json"),
                 "--json", str(merged)]) == 0
    again = json.loads(merged.read_text())
    assert (again["trace"], again["model"], again["history"]) == (data["trace"], data["model"],
                                                                  "generated")
    assert f"trace {data['trace']}: {STREAMS} streams x {TURNS} turns" in capsys.readouterr().out
    (tmp_path / "empty.json").write_text('{"bench": "trace", "rows": [], "records": {}}')
    (tmp_path / "engine.json").write_text('{"bench": "engine", "rows": []}')
    for bad, message in [("empty.json", "hold(s) no runs"), ("engine.json", "bench engine run")]:
        assert main(["bench", "trace", "--from-json", str(tmp_path / bad)]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("kv_dtype", ["int8", "fp16", "fp32"])
def test_kv_bytes_per_token_matches_engine_tensors(tiny, kv_dtype):
    from edge_runtime.bench.edge_systems import KVProbe, build_engine, kv_bytes_per_token, load

    loaded = load(str(tiny[0]))
    engine = build_engine(loaded, "edge", kv_dtype=kv_dtype, num_pages=3, page_tokens=64)
    per_token = kv_bytes_per_token(loaded.config, kv_dtype)
    assert engine.storage.pool.nbytes() == per_token * 64 * 3  # the bytes the pool really holds
    probe = KVProbe(engine, loaded.config)
    held, cached, _ = probe.read({"pages_live": 2, "inline_slots_used": 1, "pages_cached": 1,
                                  "page_utilization": 0.5})
    assert held == per_token * (2 * 64 + engine.config.inline_tokens) and cached == per_token * 64
    # recent-key windows (int8 only) count at the bytes the window store really holds per window
    held_w, _, _ = probe.read({"pages_live": 2, "inline_slots_used": 1, "pages_cached": 1,
                               "page_utilization": 0.5, "windows_used": 3})
    window = engine.storage.window
    per_window = 0 if window is None else window.nbytes() // window.num_blocks
    assert (window is None) == (kv_dtype != "int8")
    assert held_w == held + 3 * per_window


def test_prewarm_makes_first_turns_hit_the_cache(tiny, tmp_path):
    model, trace = tiny
    out = tmp_path / "w.json"
    assert main(["bench", "trace", "--trace", str(trace), "--model", str(model), "--systems", "edge",
                 "--prewarm", "--no-isolate", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    first = [r for r in data["records"]["edge"] if r["turn"] == 0]
    assert len(first) == STREAMS and all(r["cached_prompt_tokens"] > 0 for r in first)
    assert data["prewarm"] is True and data["rows"][0]["requests"] == STREAMS * TURNS


_GOOD = {"stream": "s0", "turn": 1, "system": "You are terse.", "command": "x", "max_tokens": 8}


@pytest.mark.parametrize("change, message", [
    ({"arrival_s": "soon"}, r":1: arrival_s must be a number of seconds >= 0 .*'soon'"),
    ({"arrival_s": [1]}, r":1: arrival_s must be a number"),
    ({"arrival_s": float("nan")}, r":1: arrival_s must be a number"),
    ({"answer": 42}, r":1: answer must be a string"),
    ({"max_tokens": True}, r":1: max_tokens must be a positive integer, got True"),
    ({"turn": "2"}, r":1: turn must be an integer"),
    ({"command": {"text": "x"}}, r":1: command must be a string"),
    ({"stream": [1]}, r":1: stream must be a string or an integer id"),
])
def test_trace_field_types_are_checked_per_line(tmp_path, change, message):
    from edge_runtime.bench.trace import load_trace

    (tmp_path / "t.jsonl").write_text(json.dumps({**_GOOD, **change}) + "\n")
    with pytest.raises(InputError, match=message):
        load_trace(tmp_path / "t.jsonl")


def test_trace_that_is_not_utf8_or_a_folder(tmp_path):
    from edge_runtime.bench.trace import load_trace

    (tmp_path / "t.jsonl").write_bytes(b'{"stream": "\xff"}\n')
    with pytest.raises(InputError, match="not UTF-8"):
        load_trace(tmp_path / "t.jsonl")
    with pytest.raises(InputError, match="is a folder"):
        load_trace(tmp_path)
    (tmp_path / "ok.jsonl").write_text(json.dumps({**_GOOD, "arrival_s": 0, "stream": 3}))
    assert load_trace(tmp_path / "ok.jsonl").streams["3"][0].arrival_s == 0.0


def test_trace_loader_takes_what_json_lines_allow(tmp_path):
    """A byte-order mark, CRLF line ends, and raw U+2028 / U+0085 inside a string (JSON allows them
    unescaped; str.splitlines() would cut the line there)."""
    from edge_runtime.bench.trace import load_trace

    lines = [json.dumps({**_GOOD, "command": "turn on\u2028the light"}, ensure_ascii=False),
             json.dumps({**_GOOD, "turn": 2, "command": "caf\u00e9\u0085x"}, ensure_ascii=False)]
    (tmp_path / "t.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    turns = load_trace(tmp_path / "t.jsonl").streams["s0"]
    assert [t.command for t in turns] == ["turn on\u2028the light", "caf\u00e9\u0085x"]


def test_trace_loader_refuses_surrogates_and_deep_nesting(tmp_path):
    from edge_runtime.bench.trace import load_trace

    (tmp_path / "s.jsonl").write_text(json.dumps({**_GOOD, "command": "\ud800"}))  # "\\ud800" in the file
    with pytest.raises(InputError, match=r":1: command holds a lone UTF-16 surrogate"):
        load_trace(tmp_path / "s.jsonl")
    (tmp_path / "d.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError, match=r":1: not valid JSON"):
        load_trace(tmp_path / "d.jsonl")


def test_edge_backend_sends_do_not_wait_for_a_running_step(tiny):
    """A stream's send during a long engine step (a cold-start prefill) must not stall the event
    loop, and so every other stream's send, until the step ends: the driver thread adds requests
    between steps, as the service's AsyncEngine does. A request the engine refuses fails alone."""
    import threading
    import time

    from edge_runtime.bench.edge_systems import EdgeBackend, build_engine, load

    loaded = load(str(tiny[0]))
    engine = build_engine(loaded, "edge")
    first_step, step = threading.Event(), engine.step

    def slow_step():
        with engine.lock:  # as a long prefill holds it
            if not first_step.is_set():
                first_step.set()
                time.sleep(0.6)
            return step()

    engine.step = slow_step
    backend = EdgeBackend(loaded, "edge", engine)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]

    async def run():
        first = asyncio.create_task(backend.complete("s0", msgs, 3))
        await asyncio.to_thread(first_step.wait)
        t = time.perf_counter()
        second = asyncio.create_task(backend.complete("s1", msgs + [{"role": "user", "content": "x"}], 3))
        await asyncio.sleep(0)  # the second send runs up to its first await
        sent_s = time.perf_counter() - t
        too_long = [{"role": "user", "content": "word " * 20000}]  # past the model's context
        with pytest.raises(InputError, match="refused request s2-1: the prompt has .* tokens; "
                                               "this model accepts at most 2047$"):
            await backend.complete("s2", too_long, 3)
        return sent_s, await first, await second

    try:
        sent_s, a, b = asyncio.run(run())
    finally:
        backend.close()
    assert sent_s < 0.3, sent_s  # not the 0.6 s step
    assert a.output_tokens == 3 and b.output_tokens == 3
