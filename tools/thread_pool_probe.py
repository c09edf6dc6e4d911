"""Engine step times by the thread that runs them: the main thread, a second thread while the
building thread's OpenMP pool is alive, and a second thread after it was released
(kernels/openmp_pool.py), the situation of the service, the voice loop and bench trace, where
the model is loaded in one thread and stepped in another.

Workload per measurement: `--requests` requests of `--suffix` new tokens each over one cached
`--prefix`-token prompt (a prefill step with a prefix hit, as turn 2+ of a voice session), then
decode steps of the batch. Medians over `--rounds` rounds, the modes alternated in every round.

    python tools/thread_pool_probe.py [--rounds 4 --prefix 400 --suffix 15 --requests 4] [--json F]
"""
import argparse
import json
import random
import statistics
import threading
import time

import torch

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.kernels.openmp_pool import release_thread_pool
from edge_runtime.engine.placement import load_for, resolve

MODES = ("main thread", "second thread, builder's pool alive", "second thread, pool released")


def measure(engine, prompts, max_tokens: int) -> tuple[float, list[float]]:
    """(first step s, later step s) of serving `prompts` to the end."""
    for i, p in enumerate(prompts):
        engine.add_request(p, SamplingParams(max_tokens=max_tokens), request_id=f"r{time.time_ns()}-{i}")
    steps = []
    while engine.has_unfinished():
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    return steps[0], steps[1:]


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out["r"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prefix", type=int, default=400)
    ap.add_argument("--suffix", type=int, default=15)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--gen", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    engine = Engine(load_for(args.model, resolve("cpu"), progress=lambda msg: None), EngineConfig())
    rng = random.Random(0)
    prefix = [rng.randrange(100, 40000) for _ in range(args.prefix)]  # ids any tokenizer here has
    measure(engine, [prefix], 1)  # cache the prefix (and warm up)
    batch = lambda: [prefix + [rng.randrange(100, 40000) for _ in range(args.suffix)]
                     for _ in range(args.requests)]
    results = {m: ([], []) for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            if mode == MODES[0]:
                first, later = measure(engine, batch(), args.gen)
            else:
                if mode == MODES[2]:
                    release_thread_pool()  # the main thread's pool, as AsyncEngine does
                first, later = in_thread(lambda: measure(engine, batch(), args.gen))
            results[mode][0].append(first * 1e3)
            results[mode][1].extend(x * 1e3 for x in later)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = [{"mode": m, "prefill_step_ms": statistics.median(f), "decode_step_ms": statistics.median(d)}
            for m, (f, d) in results.items()]
    print(f"\n{args.requests} requests x {args.suffix} new tokens over a cached {args.prefix}-token "
          f"prefix, {torch.get_num_threads()} torch threads, medians of {args.rounds} rounds\n")
    print("| thread | prefill step ms | decode step ms |\n|---|---:|---:|")
    for row in rows:
        print(f"| {row['mode']} | {row['prefill_step_ms']:.1f} | {row['decode_step_ms']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
