"""`bench peer` (bench/peer_bench.py, peer_servers.py, busy.py): argument checks, medians and ratios on
made-up rows, and one replay against a stand-in llama-server (tests/fake_openai_server.py) started,
measured and stopped as the bench does it, with a busy process spinning."""

import os
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from edge_runtime.bench import peer_bench
from edge_runtime.bench.busy import BusyLoad
from edge_runtime.bench.http_client import TargetError
from edge_runtime.bench.peer_servers import ServerProcess, ServerSpec, free_port, llama_spec
from edge_runtime.errors import InputError

FAKE = Path(__file__).with_name("fake_openai_server.py")
TRACE = Path(__file__).parent.parent / "tools" / "traces" / "voice-car-5x12.jsonl"


def _args(tmp_path, **kw):
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    base = dict(llama_server=str(binary), gguf=str(gguf), traces=str(TRACE))
    return Namespace(**{**base, **kw})


def test_busy_counts_are_checked():
    assert peer_bench.parse_busy("0,1") == [0, 1]
    for bad in ("", "x", "0,-1"):
        with pytest.raises(InputError, match="--busy"):
            peer_bench.parse_busy(bad)


def test_paths_are_checked_with_what_to_do(tmp_path):
    with pytest.raises(InputError, match="build_llama_server.sh"):
        peer_bench.check_paths(_args(tmp_path, llama_server=None))
    with pytest.raises(InputError, match="not an executable"):
        peer_bench.check_paths(_args(tmp_path, llama_server=str(tmp_path)))
    with pytest.raises(InputError, match="not a .gguf"):
        peer_bench.check_paths(_args(tmp_path, gguf=str(tmp_path / "missing.gguf")))
    with pytest.raises(InputError, match="nope.jsonl not found"):
        peer_bench.check_paths(_args(tmp_path, traces=f"{TRACE},nope.jsonl"))
    binary, gguf, traces = peer_bench.check_paths(_args(tmp_path))
    assert gguf.name == "m.gguf" and traces == [str(TRACE)]


def _row(system, busy, rps, ttft95, rnd=0, trace="car"):
    return {"system": system, "busy": busy, "trace": trace, "round": rnd, "requests_per_s": rps,
            "ttft_p50_s": ttft95 / 2, "ttft_p95_s": ttft95, "tpot_p50_s": 0.01,
            "peak_rss_bytes": 100 << 20}


def test_medians_over_rounds_and_the_issue_ratios():
    rows = [_row("edge", 0, 1.0, 0.2, 0), _row("edge", 0, 3.0, 0.4, 1), _row("edge", 0, 2.0, 0.3, 2),
            _row("llama.cpp", 0, 1.0, 1.0), _row("edge", 1, 0.8, 0.5),
            _row("llama.cpp", 1, 0.5, 0.9)]
    summary = peer_bench.summarize(rows)
    edge_quiet = next(s for s in summary if s["system"] == "edge" and s["busy"] == 0)
    assert edge_quiet["runs"] == 3 and edge_quiet["requests_per_s"] == 2.0
    assert edge_quiet["ttft_p95_s"] == 0.3
    got = {c["comparison"]: (pytest.approx(c["ratio"]), c["pass"]) for c in peer_bench.compare(summary)}
    assert got == {
        "car busy 0: edge/llama.cpp requests/s": (2.0, True),
        "car busy 0: edge/llama.cpp TTFT p95": (0.3, True),
        "car busy 1: edge/llama.cpp requests/s": (1.6, True),
        "car busy 1: edge/llama.cpp TTFT p95": (pytest.approx(0.5 / 0.9), False),
        "car: edge busy 1/quiet requests/s": (0.4, False),
        "car: llama.cpp busy 1/quiet requests/s": (0.5, None),  # shown, no target
    }


def test_busy_load_spins_and_is_reaped():
    with BusyLoad(1) as busy:
        (pid,) = busy.pids
        assert os.path.exists(f"/proc/{pid}")
    assert not os.path.exists(f"/proc/{pid}") or "Z" not in Path(f"/proc/{pid}/stat").read_text()
    with pytest.raises(ValueError):
        BusyLoad(-1)


def _fake_spec(extra=()):
    spec = llama_spec(Path(sys.executable), Path("m.gguf"), free_port(), 5, 5 * 2048, list(extra))
    return ServerSpec(spec.name, [sys.executable, str(FAKE), *spec.command[1:]], spec.target,
                      spec.health_url)


def test_one_run_against_a_stand_in_server_with_a_busy_process(tmp_path):
    spec = _fake_spec()
    assert spec.command[-6:] == ["--port", spec.target.rsplit(":", 1)[1], "-np", "5", "-c", "10240"]
    opts = {"streams": 1, "ready_timeout_s": 60, "target_model": None}
    row = peer_bench.run_one(spec, str(TRACE), 1, opts, tmp_path / "fake.log")
    assert row["system"] == "llama.cpp" and row["busy"] == 1 and row["trace"] == TRACE.stem
    assert row["requests"] == 12 and row["output_tokens"] == 12 * 3
    assert row["requests_per_s"] > 0 and row["ttft_p95_s"] > 0
    assert row["peak_rss_bytes"] > 1 << 20  # the server's own VmHWM, read before it stopped


def test_a_server_that_fails_to_start_is_reported_with_its_log(tmp_path):
    spec = _fake_spec(["--fail-start"])
    with pytest.raises(TargetError, match="exited with status 3.*cannot load the model"):
        with ServerProcess(spec, tmp_path / "fail.log", ready_timeout_s=60):
            pass
