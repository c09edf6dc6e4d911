"""Scoring through the paged path (perplexity): NLL equals transformers' on random weights (fp32 KV,
chunked prefill across pages), int8 stays close; the eval-ppl command end to end."""

import json

import torch

from engine_helpers import engine_for, tiny, tiny_folder, tiny_hf, tiny_prompts

from edge_runtime.cli import main


def _hf_nll(ids):
    with torch.inference_mode():
        logits = tiny_hf()(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return -logp.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def test_score_matches_transformers_fp32_chunked():
    ids = tiny_prompts([150], seed=1000)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16, max_batch_tokens=40,
                     enable_prefix_cache=False)
    nll = eng.scorer().nll(ids)  # 4 chunks of <= 40 tokens, each attending to earlier pages
    torch.testing.assert_close(nll, _hf_nll(ids), atol=1e-4, rtol=1e-4)
    eng.kv.check_leaks()
    eng8 = engine_for(tiny(), kv_dtype="int8", page_tokens=16, num_pages=16, max_batch_tokens=40,
                      enable_prefix_cache=False)
    rel = abs(float(eng8.scorer().nll(ids).mean()) / float(nll.mean()) - 1)
    assert 0 < rel < 0.01, rel  # quantization changes the numbers, a little


def test_one_prefill_scores_int8_like_decode_steps():
    """The default scoring (a window in one prefill) reads the int8 store as generation does: the
    same NLL as scoring every position as a decode step (chunk 1), and not fp32 KV's."""
    ids = tiny_prompts([70], seed=1001)[0]
    cfg = dict(page_tokens=16, num_pages=16, enable_prefix_cache=False, max_num_seqs=1)
    one = engine_for(tiny(), kv_dtype="int8", max_batch_tokens=70, **cfg).scorer().nll(ids)
    steps = engine_for(tiny(), kv_dtype="int8", max_batch_tokens=1, **cfg).scorer().nll(ids)
    fp32 = engine_for(tiny(), kv_dtype="fp32", max_batch_tokens=70, **cfg).scorer().nll(ids)
    torch.testing.assert_close(one, steps, atol=1e-6, rtol=0)  # the LM head's rows: BLAS vs C
    assert float((one - fp32).abs().max()) > 1e-4  # it reads int8: not fp32 KV's numbers


def test_eval_ppl_command(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 12)
    out = tmp_path / "r.json"
    rc = main(["eval-ppl", "--text", str(text), "--window", "48", "--max-windows", "2",
               "--kv-dtype", "int8,fp32", "--threads", "1", "--hf-reference", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["windows"] == 2 and [r["kv_dtype"] for r in report["results"]] == ["int8", "fp32"]
    assert all(1 < r["ppl"] < 100 and r["predicted_tokens"] == 94 for r in report["results"])
    fp32 = report["results"][1]["ppl"]
    assert abs(report["transformers_fp32_ppl"] / fp32 - 1) < 1e-5  # same numbers as transformers
    fid = report["fidelity"]
    assert (fid["test"], fid["reference"], fid["positions"]) == ("int8", "fp32", 94)
    assert 0 < fid["mean_kl"] < 0.01 and 0 <= fid["near_tie_flips"] <= fid["argmax_flips"] <= 94
    printed = capsys.readouterr().out
    assert "int8 vs fp32" in printed and "mean KL" in printed
    assert main(["eval-ppl", "--text", str(tmp_path / "missing.txt")]) == 2


def test_eval_ppl_bad_out_and_page_tokens_fail_before_loading(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("hello world")
    model = str(tmp_path / "no-model")  # never reached: the checks come first
    for argv, message in ((["--out", "/nonexistent/dir/r.json"], "/nonexistent/dir does not exist"),
                          (["--page-tokens", "500"], "--page-tokens must be a power of two")):
        assert main(["eval-ppl", "--text", str(text), "--model", model, *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


def _short_context_model(tmp_path, vocab_size):
    """A tiny random Llama with SmolLM2's tokenizer and a 64-token context."""
    from model_helpers import save_random_model, tiny_hf_config

    return str(save_random_model(tiny_hf_config("llama", vocab_size=vocab_size, num_hidden_layers=1,
                                                max_position_embeddings=64), tmp_path / "m"))


def test_eval_ppl_refuses_a_window_beyond_the_context_and_foreign_token_ids(tmp_path, capsys):
    """--window above the context was an IndexError; a tokenizer whose ids pass the model's
    vocabulary was an IndexError in the embedding; --agreement without a chat template failed
    only after the perplexities (and named --chat, which eval-ppl does not have)."""
    from engine_helpers import TINY_VOCAB

    text = tmp_path / "a.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
    model = _short_context_model(tmp_path, TINY_VOCAB)
    capsys.readouterr()
    assert main(["eval-ppl", "--text", str(text), "--model", model, "--window", "65"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--window 65 is longer than the model's context (64 tokens); "
                        "give --window 64 or less") and "Traceback" not in err, err
    (tmp_path / "m" / "chat_template.jinja").unlink()
    assert main(["eval-ppl", "--text", str(text), "--model", model, "--window", "64",
                 "--agreement", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "eval-ppl [" not in err and "run without --agreement" in err.splitlines()[-1], err
    small = _short_context_model(tmp_path / "small", 512)
    capsys.readouterr()
    assert main(["eval-ppl", "--text", str(text), "--model", small, "--window", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is outside the vocabulary (0..511): the tokenizer does not match the " \
                               "model" in err[0], err


def test_eval_ppl_sizes_the_pool_to_the_longest_window_not_to_window(tmp_path, monkeypatch, capsys):
    """A huge --window on a short text used to size the pool for --window tokens (25 GB)."""
    from edge_runtime.commands import eval_ppl

    text = tmp_path / "a.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 2)
    built = []
    real = eval_ppl._engine
    monkeypatch.setattr(eval_ppl, "_engine", lambda loaded, kv, pt, window, *a, **k:
                        built.append(window) or real(loaded, kv, pt, window, *a, **k))
    model = str(tiny_folder())  # 2048-token context, SmolLM2's tokenizer
    assert main(["eval-ppl", "--text", str(text), "--model", model, "--window", "2048",
                 "--kv-dtype", "fp32", "--threads", "1"]) == 0
    report_tokens = int(capsys.readouterr().out.split("tokens ")[1].split()[0])
    assert built == [report_tokens] and report_tokens < 40
