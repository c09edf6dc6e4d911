"""`edge-runtime generate` on the Engine backend: engine flags, cached tokens and n > 1 completions
in --json, beams, bad flags as one-line errors."""

import json

from engine_helpers import tiny_folder

from edge_runtime.cli import main


def _run(capsys, *argv):
    code = main(["generate", "--model", str(tiny_folder()), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_reports_cached_tokens_and_completions(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    system = "You are a helpful robot that answers in one sentence. " * 3
    prompts.write_text("\n".join(json.dumps({"prompt": system + q}) for q in ("Hi.", "Bye.")))
    code, out, err = _run(capsys, "--prompts-file", str(prompts), "--max-tokens", "4", "--json",
                          "--kv-dtype", "fp32", "--page-tokens", "16", "--n", "2",
                          "--temperature", "0.7", "--seed", "3")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 2 and all(len(r["completions"]) == 2 for r in rows)
    assert all("cached_prompt_tokens" in r and len(r["token_ids"]) == 4 for r in rows)


def test_generate_beams_and_flags(capsys):
    code, out, err = _run(capsys, "--prompt", "hello there", "--max-tokens", "3", "--json",
                          "--beams", "2", "--no-prefix-cache", "--no-inline", "--kv-dtype", "int8")
    assert code == 0, err
    assert len(json.loads(out)["completions"]) == 2
    code, out, err = _run(capsys, "--prompt", "x", "--beams", "9")
    assert code == 2 and "beam_width" in err and "Traceback" not in err
