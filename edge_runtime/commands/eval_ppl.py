"""`edge-runtime eval-ppl --model M --text FILE [--text FILE2] [--kv-dtype int8,fp32] [--json]`:
perplexity through the engine's own paged KV path, plus greedy agreement on chat prompts.

The text files are concatenated in the order given and tokenized once (no special tokens added);
the token stream is cut into non-overlapping windows of `--window` tokens (the last, shorter one
included when it has at least 2 tokens). Each window is scored from an empty context: a temporary
sequence is prefilled through the paged pool (K/V written int8 / fp16 / fp32, read back by the
paged attention) with logits at every position (engine/scoring.py). Each position reads what it
would read in generation (int8 keys before its recent-key block, docs/engine.md "What a position
reads"), so one prefill per window measures int8 KV as `--chunk 1` does, faster. Perplexity is
exp(sum of NLL / number of predicted tokens). With several KV dtypes, the first is compared with
the last (e.g. `--kv-dtype int8,fp32`: int8 relative to fp32). `--agreement N` also generates
greedily for N built-in chat prompts with each KV dtype and reports how many tokens match.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from edge_runtime.kv.recent_window import DEFAULT_WINDOW_TOKENS
from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.errors import InputError, RequestError
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.budget import check_page_tokens
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.kernels.cpu_threads import configure
from edge_runtime.kv.page_math import pages_for_sequence_at_most
from edge_runtime.model.chat import encode_prompt
from edge_runtime.paths import check_output_file

CHAT_PROMPTS = [
    "What is the capital of France?", "Write a haiku about the sea.",
    "Explain photosynthesis briefly.", "List three prime numbers.",
    "Translate 'good morning' to Spanish.", "How many legs does a spider have?",
    "What does a compiler do?", "Name a famous painter.", "Why is the sky blue?",
    "Give me a word that rhymes with cat.", "What is a black hole?",
    "Suggest a name for a pet goldfish.", "How do I boil an egg?",
    "What is the largest planet?", "Describe autumn in one sentence.",
    "What is machine learning?", "Tell me a fun fact about octopuses.",
    "What language is spoken in Brazil?", "How far is the Moon?",
    "Recommend a good habit for the morning.",
]


def register(subparsers) -> None:
    p = subparsers.add_parser("eval-ppl", help="perplexity (and int8 vs fp32 agreement) through "
                              "the engine's paged KV", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="model name or path")
    p.add_argument("--text", action="append", required=True, help="text file (repeat to concatenate)")
    add_weights_option(p)
    p.add_argument("--kv-dtype", default="int8,fp32",
                   help="comma-separated KV dtypes to evaluate (int8, fp16, fp32)")
    p.add_argument("--window", type=int, default=1024, help="tokens per window (default 1024)")
    p.add_argument("--page-tokens", type=int, default=512, help="KV page size")
    p.add_argument("--chunk", type=int, default=0,
                   help="tokens computed per engine step (default: the whole window in one prefill, "
                        "which reads the KV store as generation does: what a position reads depends "
                        "on the positions only, docs/engine.md; 1: every position as a decode step)")
    p.add_argument("--recent-window", type=int, default=None, metavar="W",
                   help="int8 KV: positions read exact per sequence (engine default "
                        f"{DEFAULT_WINDOW_TOKENS}; 0: off)")
    p.add_argument("--no-centred-keys", dest="centred_keys", action="store_false",
                   help="int8 KV: store every key as it is (default: keys centred on their layer's "
                        "mean where that lowers their absmax, docs/engine.md)")
    p.add_argument("--max-windows", type=int, default=0, help="evaluate only the first N windows")
    p.add_argument("--hf-reference", action="store_true",
                   help="also compute transformers' fp32 perplexity on the same windows")
    p.add_argument("--agreement", type=int, default=0, metavar="N",
                   help="also compare greedy continuations on N built-in chat prompts")
    p.add_argument("--agreement-tokens", type=int, default=32, help="tokens per continuation")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads, fixed (0: the cores other programs leave free, re-checked every "
                        "second)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", help="also write the JSON report to this file")
    add_placement_arguments(p)
    p.set_defaults(func=run)


def _read_texts(paths: list[str]) -> str:
    parts = []
    for p in paths:
        try:
            parts.append(Path(p).read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"cannot read the text file {p!r}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise InputError(f"{p!r} is not UTF-8 text") from exc
    return "".join(parts)


def _dtypes(spec: str) -> list[str]:
    dtypes = [d.strip() for d in spec.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("int8", "fp16", "fp32")]
    if not dtypes or bad:
        raise RequestError(f"--kv-dtype takes int8, fp16 or fp32 (comma-separated), got {spec!r}")
    return dtypes


def _windows(ids: list[int], window: int, limit: int) -> list[list[int]]:
    wins = [ids[i:i + window] for i in range(0, len(ids), window)]
    wins = [w for w in wins if len(w) >= 2]
    return wins[:limit] if limit > 0 else wins


def _engine(loaded, kv_dtype: str, page_tokens: int, window: int, prefix_cache: bool,
            chunk: int = 0, settings: dict | None = None):
    """An engine for scoring: it computes `chunk` positions per step (0: `window`, one prefill);
    settings: EngineConfig overrides (recent_window, centred_keys)."""
    from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch
    from edge_runtime.engine.engine import Engine  # start-up time: imports numpy, torch

    pages = pages_for_sequence_at_most(window, page_tokens)
    chunk = chunk or max(window, 8)
    extra = dict(settings or {})
    cfg = EngineConfig(kv_dtype=kv_dtype, page_tokens=page_tokens, num_pages=max(pages, 2 * 8),
                       enable_prefix_cache=prefix_cache, enable_inline=False,
                       max_batch_tokens=chunk, max_num_seqs=min(8, chunk), **extra)
    return Engine(loaded, cfg)


def perplexity(loaded, windows: list[list[int]], kv_dtype: str, page_tokens: int,
               window: int, chunk: int = 0, settings: dict | None = None) -> dict:
    engine = _engine(loaded, kv_dtype, page_tokens, window, False, chunk, settings)
    total, count, t0 = 0.0, 0, time.perf_counter()
    for i, w in enumerate(windows):
        print(f"\reval-ppl [{kv_dtype}] window {i + 1}/{len(windows)}", end="", file=sys.stderr,
              flush=True)
        nll = engine.scorer().nll(w)
        total += float(nll.sum())
        count += nll.numel()
    print(file=sys.stderr)
    engine.kv.check_leaks()
    return {"kv_dtype": kv_dtype, "ppl": math.exp(total / count), "nll_mean": total / count,
            "predicted_tokens": count, "seconds": time.perf_counter() - t0}


def hf_perplexity(loaded, windows: list[list[int]]) -> float:
    """transformers' own fp32 forward on the same windows (the reference for the fp32 KV run)."""
    import torch
    from transformers import AutoModelForCausalLM

    from edge_runtime.model.loader import fp32_folder  # start-up time: imports numpy, torch

    folder = loaded.path
    if loaded.quantization.startswith("gguf-"):  # served from a GGUF's blocks: its float32 folder
        folder = fp32_folder(json.loads((folder / "config.json").read_text())["edge_runtime_source"])
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    total, count = 0.0, 0
    for i, w in enumerate(windows):
        print(f"\reval-ppl [transformers fp32] window {i + 1}/{len(windows)}", end="",
              file=sys.stderr, flush=True)
        with torch.inference_mode():
            logits = hf(torch.tensor([w])).logits[0, :-1].double()  # [n - 1, vocab]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(w[1:]).unsqueeze(-1))
        total -= float(logp.sum())
        count += len(w) - 1
    print(file=sys.stderr)
    return math.exp(total / count)


def fidelity(loaded, windows: list[list[int]], test: str, ref: str, page_tokens: int,
             window: int, chunk: int = 0, settings: dict | None = None) -> dict:
    """Next-token distributions of KV dtype `test` vs `ref` at every position of the windows:
    mean KL(ref || test), and how often the greedy (argmax) token differs, overall and where the
    reference's top two logits are within 0.5 (near-ties, where greedy decoding flips). Far less
    noisy than a perplexity difference, whose per-token changes cancel."""
    import torch

    engines = {d: _engine(loaded, d, page_tokens, window, False, chunk, settings)
               for d in (test, ref)}
    kl_sum, flips, ties, tie_flips, n = 0.0, 0, 0, 0, 0
    for i, w in enumerate(windows):
        print(f"\reval-ppl [{test} vs {ref}] window {i + 1}/{len(windows)}", end="",
              file=sys.stderr, flush=True)
        test_chunks, ref_chunks = engines[test].scorer().logits(w), engines[ref].scorer().logits(w)
        for (start, a), (_, b) in zip(test_chunks, ref_chunks):
            keep = min(a.shape[0], len(w) - 1 - start)  # positions that predict a next token
            a, b = a[:keep].double(), b[:keep].double()
            lp_a, lp_b = torch.log_softmax(a, dim=-1), torch.log_softmax(b, dim=-1)
            kl_sum += float((lp_b.exp() * (lp_b - lp_a)).sum())
            flip = a.argmax(-1) != b.argmax(-1)
            top2 = b.topk(2, dim=-1).values
            near = (top2[:, 0] - top2[:, 1]) < 0.5
            flips, ties, tie_flips = flips + int(flip.sum()), ties + int(near.sum()), \
                tie_flips + int((flip & near).sum())
            n += a.shape[0]
    print(file=sys.stderr)
    return {"test": test, "reference": ref, "positions": n, "mean_kl": kl_sum / n,
            "argmax_flips": flips, "near_ties": ties, "near_tie_flips": tie_flips}


def agreement(loaded, dtypes: list[str], n: int, max_tokens: int, page_tokens: int,
              settings: dict | None = None) -> dict:
    prompts = [encode_prompt(loaded.tokenizer, q, chat=True) for q in CHAT_PROMPTS[:n]]
    outs = {}
    for d in dtypes:
        print(f"eval-ppl [{d}] greedy on {len(prompts)} chat prompts", file=sys.stderr)
        engine = _engine(loaded, d, page_tokens, 1024, prefix_cache=True, settings=settings)
        outs[d] = [r.token_ids for r in engine.generate(prompts, SamplingParams(max_tokens=max_tokens))]
    a, b = outs[dtypes[0]], outs[dtypes[-1]]
    same = sum(x == y for x, y in zip(a, b))
    prefix = [_common_prefix(x, y) for x, y in zip(a, b)]
    return {"prompts": len(prompts), "max_tokens": max_tokens, "identical_completions": same,
            "mean_common_prefix_tokens": sum(prefix) / len(prefix),
            "matching_token_fraction": sum(prefix) / max(1, sum(max(len(x), len(y))
                                                              for x, y in zip(a, b)))}


def _common_prefix(x: list[int], y: list[int]) -> int:
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def run(args) -> int:
    import torch

    dtypes = _dtypes(args.kv_dtype)
    if args.threads > 0:
        configure(pinned=args.threads)
    if args.window < 2 or args.page_tokens < 1 or args.chunk < 0:
        raise RequestError("--window must be >= 2, --page-tokens >= 1 and --chunk >= 0")
    if args.recent_window is not None and args.recent_window < 0:
        raise RequestError("--recent-window must be >= 0 (0 turns the window off)")
    check_page_tokens(args.page_tokens, "--page-tokens")  # as generate, plan and simulate
    if args.out:
        check_output_file(args.out, "--out")  # before the evaluation, not after it
    text = _read_texts(args.text)
    placement = resolve(args.device, args.backend)
    loaded = load_for(args.model, placement, weights=args.weights)
    _check_model_fits(loaded, args)
    ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    _check_vocabulary(ids, loaded.config.vocab_size)
    windows = _windows(ids, args.window, args.max_windows)
    if not windows:
        raise InputError("the text has fewer than 2 tokens; nothing to evaluate")
    pool_window = max(len(w) for w in windows)  # the pool holds the longest window, not --window
    recent = args.recent_window
    settings = dict(placement.engine_settings())
    if recent is not None:
        settings["recent_window"] = recent
    if not args.centred_keys:
        settings["centred_keys"] = False
    report = {"model": args.model, "weights": loaded.quantization, "text": args.text,
              "tokens": len(ids), "window": args.window,
              "windows": len(windows), "page_tokens": args.page_tokens,
              "chunk": args.chunk or args.window,
              "recent_window": DEFAULT_WINDOW_TOKENS if recent is None else recent,
              "centred_keys": args.centred_keys, **placement.describe(),
              "torch_threads": torch.get_num_threads(), "results": []}
    for d in dtypes:
        report["results"].append(perplexity(loaded, windows, d, args.page_tokens, pool_window,
                                            args.chunk, settings))
    if args.hf_reference:
        report["transformers_fp32_ppl"] = hf_perplexity(loaded, windows)
    if len(dtypes) > 1:
        first, last = report["results"][0], report["results"][-1]
        report["relative_ppl_change"] = first["ppl"] / last["ppl"] - 1
        report["fidelity"] = fidelity(loaded, windows, dtypes[0], dtypes[-1], args.page_tokens,
                                      pool_window, args.chunk, settings)
    if args.agreement > 0:
        report["agreement"] = agreement(loaded, dtypes, min(args.agreement, len(CHAT_PROMPTS)),
                                        args.agreement_tokens, args.page_tokens, settings)
    _print(report, args.json)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _check_model_fits(loaded, args) -> None:
    """Checks that need the model but not the evaluation: the window fits the context, and the
    agreement prompts have a chat template."""
    context = loaded.config.max_position_embeddings
    if args.window > context:
        raise InputError(f"--window {args.window} is longer than the model's context ({context} "
                         f"tokens); give --window {context} or less")
    if args.agreement > 0 and not getattr(loaded.tokenizer, "chat_template", None):
        raise InputError("--agreement needs a model with a chat template (its prompts are chat "
                         "turns); this model has none: run without --agreement")


def _check_vocabulary(ids: list[int], vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise InputError(f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1}): "
                         "the tokenizer does not match the model")


def _print(report: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"model {report['model']}  tokens {report['tokens']}  windows {report['windows']} x "
          f"{report['window']}  page_tokens {report['page_tokens']}  chunk {report['chunk']}  "
          f"recent_window {report['recent_window']}  centred_keys {report['centred_keys']}")
    print(f"{'kv_dtype':>8} {'ppl':>10} {'nll':>8} {'tokens':>8} {'seconds':>8}")
    for r in report["results"]:
        print(f"{r['kv_dtype']:>8} {r['ppl']:>10.4f} {r['nll_mean']:>8.5f} "
              f"{r['predicted_tokens']:>8} {r['seconds']:>8.1f}")
    if "relative_ppl_change" in report:
        first, last = report["results"][0]["kv_dtype"], report["results"][-1]["kv_dtype"]
        print(f"{first} vs {last}: {100 * report['relative_ppl_change']:+.3f}% perplexity")
    if "fidelity" in report:
        f = report["fidelity"]
        print(f"{f['test']} vs {f['reference']} next-token distributions: mean KL {f['mean_kl']:.3e}, "
              f"argmax differs at {f['argmax_flips']}/{f['positions']} positions "
              f"({f['near_tie_flips']} of them among {f['near_ties']} near-ties, top-2 gap < 0.5)")
    if "transformers_fp32_ppl" in report:
        print(f"transformers fp32 (same windows): {report['transformers_fp32_ppl']:.4f}")
    if "agreement" in report:
        a = report["agreement"]
        print(f"greedy agreement: {a['identical_completions']}/{a['prompts']} identical "
              f"completions of {a['max_tokens']} tokens, {100 * a['matching_token_fraction']:.1f}% "
              f"of tokens before the first divergence")
