"""`edge-runtime generate`: complete one prompt (streamed to the terminal) or a file of prompts (one
concurrent batch), greedy or sampled, as text or JSON lines.

The generation backend is built by `build_backend(args)`; it only needs `.tokenizer`, `.config` and
`.generate(prompt_ids, max_tokens, temperature, seed, on_token) -> list[SimpleResult-like]`, so
switching from the foundation's simple generator to the Engine is a change to that one function.
Requests are validated (file readable, JSON well formed, prompt fits the context) before any
compute; every user error is an `EdgeError` (one line, exit 2).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from edge_runtime.engine.placement import add_arguments as add_placement_arguments  # no torch import
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.budget import check_page_tokens, load_budget
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.errors import InputError, RequestError
from edge_runtime.model.chat import encode_prompt
from edge_runtime.plan import check_page_size

DEFAULT_MODEL = "smollm2-135m-instruct"  # == edge_runtime.model.loader.DEFAULT_MODEL (no torch import here)
DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
PROMPT_KEYS = ("prompt", "chat", "max_tokens")  # of a --prompts-file line; the rest are flags


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate", help="complete a prompt (or a file of prompts) with a model",
        description="Generate text. One --prompt streams to the terminal; --prompts-file runs all "
                    "prompts as one concurrent batch.")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"HF folder, .gguf file or built-in name (default {DEFAULT_MODEL})")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompts-file", type=Path,
                     help='JSON lines: {"prompt": str, "chat": bool, "max_tokens": int}')
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="activation/weight dtype (default: the back end's, engine/placement.py)")
    add_placement_arguments(p)
    add_weights_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    # engine backend (edge_runtime/engine/cli_backend.py)
    p.add_argument("--kv-dtype", choices=["int8", "fp16", "fp32"], default=None,
                   help="KV cache dtype (default int8, or the budget's)")
    p.add_argument("--page-tokens", type=int, default=None, help="KV page size (default 512)")
    p.add_argument("--no-prefix-cache", action="store_true", help="do not share cached prefixes")
    p.add_argument("--no-inline", action="store_true", help="no inline slots for short prompts")
    p.add_argument("--n", type=int, default=1, help="completions per prompt (forked, sampled)")
    p.add_argument("--beams", type=int, default=1, help="beam search width (2..4)")
    p.add_argument("--config", help="budget name or YAML: size the KV pool from its memory plan")
    p.set_defaults(func=run)


def read_requests(args) -> list[dict]:
    """[{prompt, chat, max_tokens}] from --prompt or --prompts-file; InputError/RequestError on bad input."""
    if args.max_tokens < 1:
        raise RequestError(f"--max-tokens must be a positive integer, got {args.max_tokens}")
    if not args.temperature >= 0 or math.isinf(args.temperature):  # NaN fails every comparison
        raise RequestError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.page_tokens is not None:
        check_page_tokens(args.page_tokens, "--page-tokens")  # as plan and simulate require
        if getattr(args, "config", None):  # and the budget's own rules (inline slots, windows)
            from edge_runtime.budget import load_budget

            budget = load_budget(args.config)
            check_page_size(budget, args.page_tokens, getattr(args, "kv_dtype", None)
                            or budget.kv_dtype, "--page-tokens")
    if args.prompt is not None:
        return [{"prompt": args.prompt, "chat": args.chat, "max_tokens": args.max_tokens}]
    try:
        lines = args.prompts_file.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read --prompts-file {args.prompts_file}: not UTF-8 text "
                         f"(byte {exc.start}); give JSON lines") from exc
    except OSError as exc:
        raise InputError(f"cannot read --prompts-file {args.prompts_file}: {exc.strerror}") from exc
    requests = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{args.prompts_file}:{n}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise InputError(f'{args.prompts_file}:{n}: expected {{"prompt": "...", ...}}')
        unknown = sorted(set(obj) - set(PROMPT_KEYS))
        if unknown:  # a typo ("max_token") or a flag-only setting would be silently ignored
            raise InputError(f"{args.prompts_file}:{n}: unknown key(s) {', '.join(unknown)}; "
                             f"known: {', '.join(PROMPT_KEYS)}")
        max_tokens = obj.get("max_tokens", args.max_tokens)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"{args.prompts_file}:{n}: max_tokens must be a positive integer, "
                               f"got {max_tokens!r}")
        if not isinstance(obj.get("chat", args.chat), bool):
            raise RequestError(f"{args.prompts_file}:{n}: chat must be true or false, "
                               f"got {obj['chat']!r}")
        requests.append({"prompt": obj["prompt"], "chat": obj.get("chat", args.chat),
                         "max_tokens": max_tokens})
    if not requests:
        raise InputError(f"{args.prompts_file} holds no prompts")
    return requests


def placement_of(args):
    """The device, back end and weight dtype of this run (engine/placement.py)."""
    budget = None
    if getattr(args, "config", None):
        budget = load_budget(args.config)
    return resolve(args.device, args.backend, budget, DTYPES.get(args.dtype))


def build_backend(args):
    placement = placement_of(args)
    _log(f"loading model {args.model} for the {placement.backend} back end on {placement.device} "
         f"({placement.weight_dtype}, --weights {args.weights}) ...")
    start = time.perf_counter()
    loaded = load_for(args.model, placement, weights=args.weights)
    args.placement = placement
    _log(f"model ready in {time.perf_counter() - start:.1f} s "
         f"({loaded.weight_bytes / 2**20:.0f} MiB of weights)")
    from edge_runtime.engine.cli_backend import EngineBackend  # start-up time: imports numpy, torch

    return EngineBackend(loaded, args)


def _log(msg: str) -> None:
    print(f"edge-runtime: {msg}", file=sys.stderr, flush=True)


class StreamPrinter:
    """Incremental detokenization: prints only the new, complete characters of the decoded text."""

    def __init__(self, tokenizer, out=sys.stdout) -> None:
        self.tokenizer, self.out, self.ids, self.printed = tokenizer, out, [], ""

    def __call__(self, _index: int, token_id: int) -> None:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.printed):
            return  # an incomplete UTF-8 sequence: wait for the next token
        self.out.write(text[len(self.printed):])
        self.out.flush()
        self.printed = text


def run(args) -> int:
    from edge_runtime.model.simple_generate import check_prompt_fits  # start-up time: imports torch

    requests = read_requests(args)
    backend = build_backend(args)
    prompt_ids = [encode_prompt(backend.tokenizer, r["prompt"], r["chat"], args.system)
                  for r in requests]
    context = backend.config.max_position_embeddings
    for ids, req in zip(prompt_ids, requests):
        check_prompt_fits(len(ids), context)
        if len(ids) + req["max_tokens"] > context:  # the engine stops at the context anyway
            _log(f"max_tokens {req['max_tokens']} runs past the model's context of {context} "
                 f"tokens: at most {context - len(ids)} will be generated for this prompt")
    stream = len(requests) == 1 and not args.json
    printer = StreamPrinter(backend.tokenizer) if stream else None
    if not stream:
        _log(f"generating for {len(requests)} prompt(s) as one batch ...")
    start = time.perf_counter()
    results = backend.generate(prompt_ids, [r["max_tokens"] for r in requests],
                               args.temperature, args.seed, on_token=printer)
    elapsed = time.perf_counter() - start
    if stream:
        print(printer.tokenizer.decode(printer.ids, skip_special_tokens=True)[len(printer.printed):])
    else:
        _print_results(args, backend.tokenizer, requests, results)
    generated = sum(len(r.token_ids) for r in results)
    _log(f"{generated} tokens in {elapsed:.1f} s ({generated / max(elapsed, 1e-9):.1f} tok/s)")
    return 0


def _print_results(args, tokenizer, requests, results) -> None:
    for i, (req, res) in enumerate(zip(requests, results)):
        text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        if args.json:
            print(json.dumps({
                "prompt": req["prompt"], "chat": req["chat"], "max_tokens": req["max_tokens"],
                "text": text, "token_ids": res.token_ids, "prompt_tokens": res.prompt_tokens,
                "cached_prompt_tokens": getattr(res, "cached_prompt_tokens", 0),
                "finish_reason": res.finish_reason,
                **_extra_completions(tokenizer, res),
            }), flush=True)
        else:
            print(f"--- [{i}] {req['prompt'][:60]!r} ({res.finish_reason})\n{text}", flush=True)
            for j, c in enumerate(getattr(res, "completions", [])[1:], 1):
                print(f"--- [{i}.{j}] ({c.finish_reason})\n"
                      f"{tokenizer.decode(c.token_ids, skip_special_tokens=True)}", flush=True)


def _extra_completions(tokenizer, res) -> dict:
    """n > 1 / beams: every completion (the first is also the top-level text)."""
    comps = getattr(res, "completions", [])
    if len(comps) < 2:
        return {}
    return {"completions": [{"text": tokenizer.decode(c.token_ids, skip_special_tokens=True),
                             "token_ids": c.token_ids, "finish_reason": c.finish_reason}
                            for c in comps]}
