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


def _bad_input(capsys, tmp_path, content: bytes | None, *argv):
    if content is not None:
        (tmp_path / "p.jsonl").write_bytes(content)
        argv = ("--prompts-file", str(tmp_path / "p.jsonl"), *argv)
    code, out, err = _run(capsys, *argv)
    assert code == 2 and "Traceback" not in err and out == "", err
    return err


def test_generate_bad_prompts_file_and_flags_are_one_line_errors(capsys, tmp_path):
    assert "not UTF-8" in _bad_input(capsys, tmp_path, b'{"prompt": "\xff\xfe"}\n')
    err = _bad_input(capsys, tmp_path, b'{"prompt": "x", "max_tokens": true}\n')
    assert "max_tokens must be a positive integer, got True" in err  # not read as 1
    assert "chat must be true or false" in _bad_input(capsys, tmp_path, b'{"prompt": "x", "chat": "no"}')
    # unknown keys were silently ignored: a typo, or a setting that only exists as a flag
    err = _bad_input(capsys, tmp_path, b'{"prompt": "x"}\n{"prompt": "y", "max_token": 8, '
                     b'"temperature": 0.5}\n')
    assert err.strip().endswith("p.jsonl:2: unknown key(s) max_token, temperature; known: prompt, "
                                "chat, max_tokens"), err
    for value in ("nan", "inf"):
        err = _bad_input(capsys, tmp_path, None, "--prompt", "x", "--temperature", value)
        assert "--temperature must be a finite number" in err
    err = _bad_input(capsys, tmp_path, None, "--prompt", "x", "--page-tokens", "500")
    assert "--page-tokens must be a power of two" in err
    # a page shorter than the budget's inline slots: refused before the model loads
    err = _bad_input(capsys, tmp_path, None, "--prompt", "x", "--config", "cpu-dev",
                     "--model", str(tmp_path / "no-model"), "--page-tokens", "16")
    assert "--page-tokens (16) is smaller than inline.tokens (128)" in err, err


def test_huge_max_tokens_sizes_the_pool_by_the_context(capsys):
    from types import SimpleNamespace

    from engine_helpers import tiny

    from edge_runtime.engine.cli_backend import engine_config
    from edge_runtime.engine.placement import resolve

    args = SimpleNamespace(n=1, beams=1, no_prefix_cache=False, no_inline=False, kv_dtype=None,
                           page_tokens=16, config=None, placement=resolve("cpu"))
    loaded = tiny()
    cfg = engine_config(args, loaded, [([1, 2, 3], 10**9)])  # used to ask for 5.7 TB on SmolLM2
    context = loaded.config.max_position_embeddings
    assert cfg.num_pages <= max(context // 16 + 1, 1024 // 16)
    code, out, err = _run(capsys, "--prompt", "hello", "--max-tokens", "1000000000",
                          "--page-tokens", "16", "--json")
    assert code == 0 and f"model's context of {context} tokens" in err, err
