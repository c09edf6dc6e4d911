"""`edge-runtime simulate --trace F`: replay a voice trace through the real KV bookkeeping.

No model runs: prompts are the model's chat template over system + earlier turns + the command,
tokenized by the model's own tokenizer; the generated tokens are the trace's `answer` (tokenized
as the chat template renders it, ending with the end-of-turn token), or, where a line has no
answer, a synthetic answer of `--synthetic-answer-words` words. Every page size is replayed
twice: with prefix sharing + inline slots, and with neither (the baseline), same pool size.
See edge_runtime/kv/simulator.py for the replay rules.
"""

from __future__ import annotations

import json
import sys

from edge_runtime.errors import InputError, OutOfPages
from edge_runtime.bench.checks import parse_int_list
from edge_runtime.bench.trace import load_trace
from edge_runtime.budget import check_page_tokens
from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.page_math import pages_for_sequence_at_most
from edge_runtime.kv.simulator import SimRequest, Simulator
from edge_runtime.model.chat import as_id_list
from edge_runtime.paths import check_output_file, same_file
from edge_runtime.plan import kv_bytes_per_token, model_for_plan


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="replay a trace through the KV bookkeeping",
                              description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, help="JSON-lines trace (docs/trace-format.md)")
    p.add_argument("--page-tokens", default="16,64,256,512", help="comma-separated page sizes")
    p.add_argument("--inline-tokens", type=int, default=128, help="tokens per inline slot")
    p.add_argument("--inline-slots", type=int, default=8)
    p.add_argument("--pages", type=int, help="pool pages (default: enough to never evict)")
    p.add_argument("--max-running", type=int, default=8, help="concurrent sequences")
    p.add_argument("--kv-dtype", choices=["int8", "fp16", "fp32"], default="int8")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--synthetic-answer-words", type=int, default=12)
    p.add_argument("--admit-together", action="store_true",
                   help="admit a step's requests before prefilling any (no sharing among them)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=run)


def _ids(encoded) -> list[int]:
    return as_id_list(encoded)


def build_requests(trace, tokenizer, synthetic_words: int) -> dict:
    """stream -> [SimRequest]: prompt ids and answer ids (end-of-turn token included)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(eos, int) or eos < 0:
        eos = tokenizer.eos_token_id
    streams = {}
    for sid, turns in trace.streams.items():
        messages, reqs = [{"role": "system", "content": turns[0].system}], []
        for t in turns:
            messages.append({"role": "user", "content": t.command})
            prompt = _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=True))
            answer = t.answer if t.answer is not None else " ".join(["ok"] * synthetic_words)
            messages.append({"role": "assistant", "content": answer})
            full = _ids(tokenizer.apply_chat_template(messages, tokenize=True))
            if full[:len(prompt)] == prompt and eos in full[len(prompt):]:
                rest = full[len(prompt):]
                answer_ids = rest[:rest.index(eos) + 1]
            else:  # the template re-tokenized across the boundary: use the answer alone
                answer_ids = _ids(tokenizer(answer, add_special_tokens=False)) + [eos]
            reqs.append(SimRequest(sid, t.turn, prompt, answer_ids[:t.max_tokens]))
        streams[sid] = reqs
    return streams


def default_pages(streams: dict, page_tokens: int) -> int:
    """Enough pages that nothing is ever evicted, sharing or not."""
    return sum(pages_for_sequence_at_most(len(r.prompt_ids) + len(r.answer_ids), page_tokens)
               for reqs in streams.values() for r in reqs)


def simulate_all(streams: dict, page_sizes: list[int], args, bytes_per_token: int) -> list:
    import copy

    results = []
    for P in page_sizes:
        pages = default_pages(streams, P) if args.pages is None else args.pages
        inline_on = args.inline_slots > 0 and 0 < args.inline_tokens <= P
        for sharing in (True, False):
            print(f"  page {P}: {'sharing+inline' if sharing else 'baseline'} ...",
                  file=sys.stderr, flush=True)
            mgr = KVManager(pages, P, args.inline_slots if inline_on else 0,
                            args.inline_tokens if inline_on else 0, enable_prefix_cache=sharing,
                            enable_inline=sharing and inline_on)
            sim = Simulator(mgr, copy.deepcopy(streams), args.max_running, P * bytes_per_token,
                            args.inline_tokens * bytes_per_token, check_every=16,
                            admit_together=args.admit_together)
            res = sim.run()
            results.append({"inline": sharing and inline_on, **res.__dict__,
                            "computed_fraction": res.computed_fraction})
    return results


def format_table(results: list[dict]) -> str:
    head = ("| page | mode | pages | peak pages | peak live | inline | peak KV MiB | KV vs base "
            "| live KV MiB | live vs base | util@peak | hit rate | computed/base | sys copies "
            "| copies | evictions | preempt |")
    lines = [head, "|" + "---|" * 17]
    base = {r["page_tokens"]: r for r in results if not r["sharing"]}

    def vs(value, baseline, spec=".0%") -> str:
        return format(value / baseline, spec) if baseline else "-"  # an empty trace has no baseline

    for r in results:
        b = base[r["page_tokens"]]
        mode = ("sharing+inline" if r["inline"] else "sharing") if r["sharing"] else "baseline"
        lines.append(
            f"| {r['page_tokens']} | {mode} | {r['num_pages']} | {r['peak_pages']} | "
            f"{r['peak_live_pages']} | {r['peak_inline_slots']} | {r['peak_kv_bytes'] / 2**20:.2f} | "
            f"{vs(r['peak_kv_bytes'], b['peak_kv_bytes'])} | "
            f"{r['peak_live_kv_bytes'] / 2**20:.2f} | "
            f"{vs(r['peak_live_kv_bytes'], b['peak_live_kv_bytes'])} | {r['utilization_at_peak']:.0%} | "
            f"{r['hit_rate']:.1%} | {vs(r['computed_prompt_tokens'], b['prompt_tokens'], '.1%')} | "
            f"{r['system_prompt_copies']} | {r['copies']} | {r['evictions']} | {r['preemptions']} |")
    return "\n".join(lines)


# Upper bounds: the bookkeeping keeps Python state per page, slot and answer word, so a typo like
# 10000000000 would hang or exhaust memory; these are far beyond any device's pool.
MAX_PAGES = 1_000_000
MAX_INLINE_SLOTS = 100_000
MAX_SYNTHETIC_WORDS = 10_000  # an answer is cut to its turn's max_tokens anyway
MAX_RUNNING = 10_000


def _check_args(args) -> None:
    """Before any work; `--pages 0` used to mean the default and `--max-running 0` never ended."""
    for flag, value, least, most in (
            ("--pages", args.pages, 1, MAX_PAGES), ("--max-running", args.max_running, 1, MAX_RUNNING),
            ("--inline-slots", args.inline_slots, 0, MAX_INLINE_SLOTS),
            ("--inline-tokens", args.inline_tokens, 0, None),
            ("--synthetic-answer-words", args.synthetic_answer_words, 0, MAX_SYNTHETIC_WORDS)):
        if value is not None and value < least:
            raise InputError(f"{flag} must be at least {least}, got {value}")
        if value is not None and most is not None and value > most:
            raise InputError(f"{flag} must be at most {most:,}, got {value:,}")
    if args.out:
        check_output_file(args.out, "--out")
        if same_file(args.out, args.trace):
            raise InputError(f"--out {args.out} is the --trace file this run reads; write the "
                             "report to another file")


def run(args) -> int:
    # start-up time: imports numpy, torch
    from edge_runtime.model.loader import load_tokenizer, resolve_model_folder

    sizes = parse_int_list(args.page_tokens, "--page-tokens")
    for P in sizes:
        check_page_tokens(P, "--page-tokens")
    _check_args(args)
    trace = load_trace(args.trace)
    print(f"loading the tokenizer of {args.model} ...", file=sys.stderr, flush=True)
    tokenizer = load_tokenizer(resolve_model_folder(args.model))
    config, _, _ = model_for_plan(args.model, "fp16")
    print(f"tokenizing {trace.num_requests} requests ...", file=sys.stderr, flush=True)
    streams = build_requests(trace, tokenizer, args.synthetic_answer_words)
    bytes_per_token = kv_bytes_per_token(config, args.kv_dtype)
    try:
        results = simulate_all(streams, sizes, args, bytes_per_token)
    except OutOfPages as exc:
        raise InputError(f"{exc}; give a larger --pages (or leave it out: enough to never "
                         "evict)") from None
    report = json.dumps({"trace": args.trace, "model": args.model, "kv_dtype": args.kv_dtype,
                         "bytes_per_token": bytes_per_token, "results": results}, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(report + "\n")
    print(report if args.json else format_table(results))
    return 0
