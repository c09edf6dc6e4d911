"""The GPU measurements of tools/gpu_check.py's engine level (gpu_lab/engine_check.py says what
and why). Every function returns rows: dicts with system, weights, metric, batch, tokens, value,
unit (and the step's counts for metric "step"). CUDA only: nothing here runs in CI.

Timing: `torch.cuda.synchronize()` around the timed steps (an engine step ends with its token-id
download, so it is synchronous anyway); random prompt ids from a fixed seed; greedy; eos ignored.
"""

from __future__ import annotations

import statistics
import time

import torch

from edge_runtime.bench.checks import parse_int_list
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.engine.step_transfers import SyncCounter
from edge_runtime.kv.page_math import pages_for_tokens

DEVICE = "cuda"


def median_ms(seconds: list[float]) -> float:
    return 1e3 * statistics.median(seconds)


def _engine(model: str, weights: str, args):
    placement = resolve(DEVICE, "cuda")
    loaded = load_for(model, placement, progress=lambda msg: None)
    batches, prefills = parse_int_list(args.batches, "--batches"), parse_int_list(args.prefill_tokens, "--prefill-tokens")
    page = EngineConfig.page_tokens  # the engine below keeps the default page size
    per_seq = pages_for_tokens(args.prompt_tokens + args.decode_steps + 8, page)
    pages = max(batches) * per_seq + pages_for_tokens(max(prefills), page) + 4
    cfg = EngineConfig(**placement.engine_settings(), num_pages=pages, max_num_seqs=max(batches),
                       max_batch_tokens=max(max(prefills), max(batches)), enable_prefix_cache=False)
    t0 = time.perf_counter()
    engine = Engine(loaded, cfg)
    return loaded, engine, time.perf_counter() - t0


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab - 1, (n, length), generator=g).tolist()


def _params(max_tokens: int):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def engine_rows(model: str, weights: str, args, log) -> list[dict]:
    loaded, engine, build_s = _engine(model, weights, args)
    graphs = engine.stats()["decode_graphs"] or {}
    log(f"engine built in {build_s:.1f} s; decode graphs: {graphs}")
    rows = [{"system": "edge", "weights": weights, "metric": "start", "value": build_s, "unit": "s",
             "capture_s": graphs.get("capture_s"), "capture_bytes": graphs.get("capture_bytes")}]
    vocab = loaded.config.vocab_size
    for batch in parse_int_list(args.batches, "--batches"):
        rows += _decode(engine, weights, batch, args.prompt_tokens, args.decode_steps, vocab)
    for length in parse_int_list(args.prefill_tokens, "--prefill-tokens"):
        rows.append(_prefill(engine, weights, length, vocab))
    return rows


def _decode(engine, weights: str, batch: int, prompt_len: int, steps: int, vocab: int) -> list[dict]:
    prefilled = engine.counters["prefill_tokens"] + batch * prompt_len
    for p in _prompts(batch, prompt_len, vocab, seed=batch):
        engine.add_request(p, _params(steps + 6))
    while engine.counters["prefill_tokens"] < prefilled:
        engine.step()  # the prefills (each row's first token comes with its last chunk)
    engine.step()  # warm: the first decode step
    before = dict(engine.runner.transfers.counters)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    per_step = {k: (engine.runner.transfers.counters[k] - before.get(k, 0)) / steps
                for k in ("uploads", "downloads", "bytes_up", "bytes_down")}
    with SyncCounter() as counter:
        engine.step()
    launches, kernel_ms = _profile_eager_step(engine)
    while engine.has_unfinished():
        engine.step()
    tok_s = batch * steps / sum(times)
    runner = engine.runner
    return [{"system": "edge", "weights": weights, "metric": "decode", "batch": batch, "tokens": prompt_len,
             "value": tok_s, "unit": "tok/s"},
            {"system": "edge", "weights": weights, "metric": "step", "batch": batch, "tokens": prompt_len,
             "step_ms": median_ms(times), "kernel_ms": kernel_ms, "launches": launches,
             "host_syncs": counter.total_syncs, "graph": bool(runner.graphs and runner.graphs.graphs),
             "value": median_ms(times), "unit": "ms", **per_step}]


def _profile_eager_step(engine) -> tuple[int, float]:
    """Kernels launched by one eager decode step and the sum of their GPU times (ms)."""
    from torch.profiler import ProfilerActivity, profile

    graphs, engine.runner.graphs = engine.runner.graphs, None
    try:
        engine.step()  # warm the eager shapes
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.step()
            torch.cuda.synchronize()
    finally:
        engine.runner.graphs = graphs
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels), sum(e.device_time for e in kernels) / 1e3


def _prefill(engine, weights: str, length: int, vocab: int) -> dict:
    warm, timed = _prompts(2, length, vocab, seed=1000 + length)
    engine.generate([warm], _params(1))  # compiles this prefill's kernels
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.generate([timed], _params(1))
    dt = time.perf_counter() - t0
    return {"system": "edge", "weights": weights, "metric": "prefill", "batch": 1, "tokens": length,
            "value": length / dt, "unit": "tok/s"}


def hf_rows(model: str, weights: str, args, compiled: bool) -> list[dict]:
    """transformers `generate` on the same GPU: decode tok/s = batch x (n - 1) / (t(n) - t(1)),
    each t the best of two runs after a warm-up."""
    from transformers import AutoModelForCausalLM

    path = load_for(model, resolve(DEVICE, "cuda"), progress=lambda msg: None).path
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float16).to(DEVICE).eval()
    system = "hf-compiled" if compiled else "hf-eager"
    if compiled:
        hf.generation_config.cache_implementation = "static"
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    rows = []
    for batch in parse_int_list(args.batches, "--batches"):
        ids = torch.tensor(_prompts(batch, args.prompt_tokens, hf.config.vocab_size, seed=batch), device=DEVICE)
        n = args.decode_steps + 1
        gen = lambda k: _timed_generate(hf, ids, k)  # noqa: E731
        gen(n), gen(1)  # warm-up (and compilation)
        dt = min(gen(n) for _ in range(2)) - min(gen(1) for _ in range(2))
        rows.append({"system": system, "weights": weights, "metric": "decode", "batch": batch,
                     "tokens": args.prompt_tokens, "value": batch * (n - 1) / dt, "unit": "tok/s"})
    return rows


def _timed_generate(hf, ids, new_tokens: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0
