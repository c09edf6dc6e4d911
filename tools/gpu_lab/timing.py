"""GPU timing helpers for tools/gpu_check.py: CUDA-graph timing, copy bandwidth, L2-defeating copies.

`time_us` measures CUDA events around a CUDA graph of `iters` calls (a stream loop when the callable
cannot be captured, e.g. it syncs), median of `reps`, after a warm-up; on CPU it falls back to wall
time. Callables take the call index, so inputs can rotate over copies that together exceed the L2.
"""
import math
import statistics
import time

import torch

ITERS, REPS = 20, 7


def log(msg):
    print(msg, flush=True)


def time_us(fn, cuda, graph=True, iters=ITERS, reps=REPS):
    """Median microseconds per call of fn(i) (i = call index, for rotating inputs)."""
    if not cuda:
        fn(0)
        samples = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn(1)
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples), "cpu-wall"
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    run, how = (lambda: [fn(i) for i in range(iters)]), "stream"
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for i in range(iters):
                    fn(i)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(iters):
                    fn(i)
            run, how = g.replay, "graph"
        except Exception as exc:  # noqa: BLE001 - reported, then the stream loop is used
            log(f"  (no CUDA graph: {type(exc).__name__}: {exc}; timing the stream loop)")
            torch.cuda.synchronize()
    run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(samples), how


def copy_bandwidth(cuda, dev):
    n = (1 << 30) if cuda else (1 << 24)
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_()
    b = torch.empty_like(a)
    us, _ = time_us(lambda i: b.copy_(a), cuda, graph=False, iters=5)
    return 2 * n / us / 1e3  # GB/s, read + write


def n_copies(one_bytes, l2_bytes):
    return max(1, min(16, math.ceil(2 * l2_bytes / max(1, one_bytes))))
