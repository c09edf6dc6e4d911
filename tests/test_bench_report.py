"""bench.report (markdown table, JSON), bench.trace loading, bench.plot, bench.bandwidth."""

import json

import pytest

from edge_runtime.bench.bandwidth import measure_bandwidth
from edge_runtime.bench.plot import plot_trace
from edge_runtime.bench.report import Column, fmt_ms, markdown_table, write_json
from edge_runtime.bench.trace import load_trace
from edge_runtime.errors import InputError


def test_markdown_table_formats_and_marks_missing():
    rows = [{"system": "edge", "ttft": 0.0123, "rps": 4.5}, {"system": "hf", "ttft": None, "rps": 1.25}]
    cols = [Column("system", "system"), Column("ttft", "TTFT ms", fmt_ms), Column("rps", "req/s", "{:.2f}")]
    text = markdown_table(rows, cols).splitlines()
    assert text[0] == "| system | TTFT ms | req/s |"
    assert text[1] == "|---|---:|---:|"
    assert text[2] == "| edge | 12.3 | 4.50 |"
    assert text[3] == "| hf | n/a | 1.25 |"


def test_write_json_adds_machine_and_roundtrips(tmp_path):
    out = write_json(tmp_path / "r.json", {"rows": [{"a": 1.5}]})
    data = json.loads(out.read_text())
    assert data["rows"] == [{"a": 1.5}]
    assert data["machine"]["logical_cpus"] >= 1 and "cpu_model" in data["machine"]
    with pytest.raises(InputError):
        write_json(tmp_path / "missing" / "r.json", {})


def _write_trace(path, lines):
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_load_trace_groups_and_orders(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [
        {"stream": 1, "turn": 1, "system": "S1", "command": "b", "max_tokens": 8},
        {"stream": 0, "turn": 0, "system": "S0", "command": "x", "max_tokens": 4, "arrival_s": 0.5},
        {"stream": 1, "turn": 0, "system": "S1", "command": "a", "max_tokens": 8, "answer": "ok"},
    ]
    _write_trace(p, rows)
    tr = load_trace(p)
    assert list(tr.streams) == ["0", "1"] and tr.num_requests == 3
    assert [t.command for t in tr.streams["1"]] == ["a", "b"]
    assert tr.streams["0"][0].arrival_s == 0.5 and tr.streams["1"][0].answer == "ok"
    assert list(tr.limit_streams(1).streams) == ["0"]


@pytest.mark.parametrize("bad,msg", [
    ({"stream": 0, "turn": 0, "system": "s", "command": "c"}, "missing"),
    ({"stream": 0, "turn": 0, "system": "s", "command": "c", "max_tokens": 0}, "max_tokens"),
])
def test_load_trace_rejects_bad_lines(tmp_path, bad, msg):
    p = tmp_path / "bad.jsonl"
    _write_trace(p, [bad])
    with pytest.raises(InputError, match=msg):
        load_trace(p)
    with pytest.raises(InputError, match="does not exist"):
        load_trace(tmp_path / "nope.jsonl")


def test_load_trace_rejects_gaps(tmp_path):
    p = tmp_path / "gap.jsonl"
    _write_trace(p, [{"stream": 0, "turn": t, "system": "s", "command": "c", "max_tokens": 1}
                     for t in (0, 2)])
    with pytest.raises(InputError, match="non-consecutive"):
        load_trace(p)


def test_plot_writes_png(tmp_path):
    out = plot_trace(tmp_path / "p.png", {
        "edge": {"ttft_s": [0.01, 0.03, 0.02], "kv_timeline": [[0.0, 1000], [1.0, 5000]]},
        "hf": {"ttft_s": [0.2, 0.5], "kv_timeline": []},
    })
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bandwidth_is_positive_and_labelled():
    bw = measure_bandwidth(size_mib=8, repeats=2)
    assert bw.read_gbps > 0 and bw.copy_gbps > 0
    assert bw.tensor_bytes == 8 * 2**20 and bw.device == "cpu"
