"""`edge-runtime bench threads`: engine step times by the thread that runs them.

The service, the voice loop and `bench trace` load the model in one thread and step the engine in
another. This times the same steps on the main thread, on a second thread while the building
thread's OpenMP pool is alive, and on a second thread after that pool was released
(kernels/openmp_pool.py, as AsyncEngine does). Workload per measurement: `--requests` requests of
`--suffix` new tokens each over one cached `--prefix`-token prompt (a prefill step with a prefix
hit, as turn 2+ of a voice session), then their decode steps. Medians over `--rounds` rounds, the
three modes alternated in every round.
"""
from __future__ import annotations

import random
import statistics
import sys
import threading
import time

from edge_runtime.bench.checks import check_context, check_min
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.bench.engine_runs import random_prompts
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.kernels.openmp_pool import release_thread_pool

MODES = ("main thread", "second thread, builder's pool alive", "second thread, pool released")
COLUMNS = [Column("mode", "thread"), Column("prefill_step_ms", "prefill step ms", "{:.1f}"),
           Column("decode_step_ms", "decode step ms", "{:.1f}")]


def serve(engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[float]]:
    """(first step s, later steps s) of serving `prompts` to the end."""
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    steps = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t0)
    return steps[0], steps[1:]


def in_new_thread(fn):
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", fn()))
    thread.start()
    thread.join()
    return out["result"]


def measure(engine, loaded, args) -> list[dict]:
    rng = random.Random(0)
    special = set(getattr(loaded.tokenizer, "all_special_ids", []) or [])
    vocab = loaded.config.vocab_size
    (prefix,) = random_prompts(rng, vocab, special, 1, args.prefix)
    serve(engine, [prefix], 1)  # caches the prefix (and warms up)

    def batch():
        return [prefix + s for s in random_prompts(rng, vocab, special, args.requests, args.suffix)]

    times = {mode: ([], []) for mode in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            if mode == MODES[0]:
                first, later = serve(engine, batch(), args.gen)
            else:
                if mode == MODES[2]:
                    release_thread_pool()  # the main thread's pool, as AsyncEngine does
                first, later = in_new_thread(lambda: serve(engine, batch(), args.gen))
            times[mode][0].append(first * 1e3)
            times[mode][1].extend(x * 1e3 for x in later)
        print(f"[bench threads] round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    return [{"mode": m, "prefill_step_ms": statistics.median(f),
             "decode_step_ms": statistics.median(d)}
            for m, (f, d) in times.items()]


def run(args) -> int:
    import torch

    from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch
    from edge_runtime.engine.engine import Engine  # start-up time: imports numpy, torch

    check_min(args, rounds=1, prefix=1, suffix=1, requests=1, gen=2)
    check_context(args.model, args.prefix + args.suffix + args.gen, "--prefix + --suffix + --gen")
    set_threads(args.threads)
    print(f"[bench threads] loading {args.model}...", file=sys.stderr)
    loaded = load_for(args.model, resolve("cpu"), progress=lambda msg: None)
    engine = Engine(loaded, EngineConfig())
    rows = measure(engine, loaded, args)
    print(f"{args.requests} requests x {args.suffix} new tokens over a cached {args.prefix}-token "
          f"prefix, {torch.get_num_threads()} torch threads, medians of {args.rounds} rounds")
    print(markdown_table(rows, COLUMNS))
    if args.json:
        write_json(args.json, {"bench": "threads", "model": args.model, "prefix": args.prefix,
                               "suffix": args.suffix, "requests": args.requests, "gen": args.gen,
                               "rounds": args.rounds, "threads": torch.get_num_threads(),
                               "rows": rows})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("threads", help="engine step times on the main thread vs a second "
                                              "thread, with and without the builder's OpenMP pool")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--prefix", type=int, default=400, help="tokens of the cached prompt")
    p.add_argument("--suffix", type=int, default=15, help="new tokens per request")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--gen", type=int, default=8, help="tokens generated per request")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json")
    p.set_defaults(func=run)
