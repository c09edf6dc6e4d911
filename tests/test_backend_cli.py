"""The back-end switch on the command line: `generate --device cpu --backend cuda` (the Triton
kernels in the interpreter) gives `--backend cpu`'s greedy token_ids, `serve` answers a request
on the CUDA back end, and a CUDA device this machine lacks is one line."""

import json

import pytest
import torch

from backend_helpers import tiny_folder
from service_helpers import client, start_server, stop_server, wait_ready, write_config

from edge_runtime.cli import main
from edge_runtime.kernels import dispatch

needs_triton = pytest.mark.skipif(not dispatch.triton_importable(), reason="needs triton (interpreter)")


def _generate(capsys, prompts, *argv):
    code = main(["generate", "--model", str(tiny_folder()), "--prompts-file", str(prompts),
                 "--json", "--page-tokens", "16", "--max-tokens", "4", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line)["token_ids"] for line in out.splitlines()], err


@needs_triton
def test_generate_cuda_back_end_in_the_interpreter_matches_cpu(capsys, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    system = "You are a helpful robot that answers in one sentence. " * 2  # > one 16-token page
    prompts.write_text("\n".join(json.dumps({"prompt": system + q}) for q in ("Hi.", "Bye.", "Why?"))
                       + "\n" + json.dumps({"prompt": "short"}))
    cpu, cpu_err = _generate(capsys, prompts, "--device", "cpu", "--backend", "cpu")
    cuda, cuda_err = _generate(capsys, prompts, "--device", "cpu", "--backend", "cuda")
    assert "cuda back end on cpu" in cuda_err and "cpu back end on cpu" in cpu_err
    assert cuda == cpu and all(len(t) == 4 for t in cpu)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_missing_cuda_device_is_one_line(capsys):
    code = main(["generate", "--model", str(tiny_folder()), "--prompt", "x", "--device", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "torch sees no CUDA device" in err


def test_cuda_back_end_on_cpu_needs_the_interpreter(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    code = main(["generate", "--model", str(tiny_folder()), "--prompt", "x", "--device", "cpu",
                 "--backend", "cuda"])
    err = capsys.readouterr().err
    assert code == 2 and ("TRITON_INTERPRET=1" in err or "needs triton" in err), err


@needs_triton
def test_serve_answers_on_the_cuda_back_end(tmp_path):
    sock = str(tmp_path / "api.sock")
    proc = start_server(sock, write_config(tmp_path / "budget.yaml"), str(tiny_folder()),
                        extra_env={"TRITON_INTERPRET": "1"},
                        extra_args=("--device", "cpu", "--backend", "cuda"))
    try:
        wait_ready(proc, sock, timeout=300)
        with client(sock, timeout=300) as c:
            body = {"model": tiny_folder().name, "prompt": "hello there", "max_tokens": 3,
                    "temperature": 0}
            reply = c.post("/v1/completions", json=body).json()
            stats = c.get("/v1/stats").json()
        assert reply["usage"]["completion_tokens"] == 3, reply
        assert stats["kernel_backends"]["backend"] == "cuda"
        assert stats["kernel_backends"]["kernels"]["decode_attention"] == "triton positional_attention"
    finally:
        stop_server(proc)
