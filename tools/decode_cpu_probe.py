"""Batch-1 decode through the Engine, a GGUF's own blocks vs its float32 conversion, in tokens per
process-CPU second as well as per wall second (one torch thread, forms interleaved round by round).

    .venv/bin/python tools/decode_cpu_probe.py [--model M] [--rounds 4] [--gen-tokens 64]

On a machine shared with other jobs the wall rate mostly measures waiting for a CPU; the CPU-second
rate is closer to what an idle core gives (memory bandwidth is still shared). `bench engine
--weights gguf,fp32` is the wall-clock benchmark.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time


def decode_rates(engine, vocab: int, rng: random.Random, gen_tokens: int) -> tuple[float, float]:
    from edge_runtime.bench.engine_runs import random_prompts
    from edge_runtime.engine.api import SamplingParams

    prompt = random_prompts(rng, vocab, set(), 1, 64)[0]
    engine.add_request(prompt, SamplingParams(max_tokens=gen_tokens, temperature=0.0, ignore_eos=True))
    engine.step()  # prefill and the first token
    cpu0, wall0, n = time.process_time(), time.perf_counter(), 0
    while engine.has_unfinished():
        n += sum(len(ev.token_ids) for ev in engine.step())
    return n / (time.process_time() - cpu0), n / (time.perf_counter() - wall0)


def main() -> int:
    from edge_runtime.bench.edge_systems import build_engine, load

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--gen-tokens", type=int, default=64)
    args = p.parse_args()
    from edge_runtime.kernels.cpu_threads import configure

    configure(pinned=1)
    forms = {f: load(args.model, f) for f in ("gguf", "fp32")}
    engines = {f: build_engine(lm, "edge", max_batch=1, max_tokens=64 + args.gen_tokens)
               for f, lm in forms.items()}
    rng = random.Random(0)
    rates = {f: [] for f in forms}
    for f in forms:  # warm-up
        decode_rates(engines[f], forms[f].config.vocab_size, rng, 8)
    for _ in range(args.rounds):
        for f in forms:
            rates[f].append(decode_rates(engines[f], forms[f].config.vocab_size, rng, args.gen_tokens))
    for f, r in rates.items():
        print(f"{f}: tokens/CPU-s {[round(c, 1) for c, _ in r]}, tokens/wall-s {[round(w, 1) for _, w in r]}")
    cpu = {f: statistics.median(c for c, _ in r) for f, r in rates.items()}
    print(f"median tokens/CPU-s gguf {cpu['gguf']:.1f}, fp32 {cpu['fp32']:.1f}: "
          f"{cpu['gguf'] / cpu['fp32']:.2f}x; round by round "
          f"{[round(a[0] / b[0], 2) for a, b in zip(rates['gguf'], rates['fp32'])]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
