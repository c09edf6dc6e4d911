"""`edge-runtime bench attention`: the CPU decode attention kernel alone (kernels/csrc/flat_kv.c).

Builds an int8 pool laid out as the engine's ([pages, layers, page tokens, kv heads, head dim], K/V
rows of a token's kv heads adjacent), gives each of `rows` sequences `keys` keys in its own pages,
and times one decode step's attention: one call per layer over every layer, with a read of
`--flush-mib` of other memory before each layer (a layer's weights stream through the caches
between two attention calls in a real step, so K/V rows come from DRAM). Reports the best of
`--repeat` steps (after a warm-up) in ms per step and ns per key visit (per row, kv head and key:
the unit of work, one int8 K row and one int8 V row). The default shape is SmolLM2-135M's.
"""
from __future__ import annotations

import sys
import time

from edge_runtime.bench.checks import check_fits_in_memory, check_min, parse_int_list
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.errors import InputError
from edge_runtime.kernels import cpu_native
from edge_runtime.kv.page_math import pages_for_tokens

COLUMNS = [Column("rows", "rows"), Column("keys", "keys per row"),
           Column("ms", "ms per step (all layers)", "{:.2f}"),
           Column("ns_per_key", "ns per key visit", "{:.1f}"), Column("threads", "threads")]


def _pool(rows: int, keys: int, layers: int, page: int, kv_heads: int, head_dim: int, gen):
    """int8 K/V stores with random values and fp16 scales, and each row's index over its pages."""
    import torch

    pages_per_row = pages_for_tokens(keys, page)
    shape = (rows * pages_per_row, layers, page, kv_heads, head_dim)
    k = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    v = torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)
    ks = (torch.rand(shape[:-1], generator=gen) * 0.02 + 0.001).half()
    vs = (torch.rand(shape[:-1], generator=gen) * 0.02 + 0.001).half()
    from edge_runtime.kv.flat_index import block_bases  # start-up time: imports numpy, torch

    index = torch.empty(rows, kv_heads, keys, dtype=torch.long)
    for r in range(rows):  # row r's keys fill its own pages, as the engine's layer-0 rows
        pages = tuple(range(r * pages_per_row, (r + 1) * pages_per_row))
        base = torch.from_numpy(block_bases(pages, keys, page, layers * page, kv_heads))
        index[r] = base[None, :] + torch.arange(kv_heads)[:, None]
    lens = torch.full((rows,), keys, dtype=torch.int32)
    return (k.view(-1, head_dim), v.view(-1, head_dim), ks.view(-1), vs.view(-1), index, lens,
            page * kv_heads)


def pool_bytes(rows: int, keys: int, args) -> int:
    """Bytes _pool allocates: int8 K and V, their fp16 scales, the int64 index."""
    pages = rows * pages_for_tokens(keys, args.page_tokens)
    slots = pages * args.layers * args.page_tokens * args.kv_heads
    return slots * (2 * args.head_dim + 2 * 2) + rows * args.kv_heads * keys * 8


def measure(lib, rows: int, keys: int, args, flush) -> dict:
    import torch

    # start-up time: imports torch
    from edge_runtime.kernels.flat_kv_cpu import NativeDecodeAttention

    gen = torch.Generator().manual_seed(rows * 1000 + keys)
    part = _pool(rows, keys, args.layers, args.page_tokens, args.kv_heads, args.head_dim, gen)
    att = NativeDecodeAttention(lib, [part], args.heads, args.head_dim ** -0.5)
    q = torch.randn(rows, args.heads, args.head_dim, generator=gen)
    best = float("inf")
    for i in range(args.repeat + 1):
        spent = 0.0
        for layer in range(args.layers):
            if flush is not None:
                flush.sum()  # evict the K/V rows as a layer's weights would
            t0 = time.perf_counter()
            att(q, layer)
            spent += time.perf_counter() - t0
        if i:  # the first step is the warm-up
            best = min(best, spent)
    visits = rows * args.kv_heads * keys * args.layers
    return {"rows": rows, "keys": keys, "ms": best * 1e3, "ns_per_key": best * 1e9 / visits,
            "threads": torch.get_num_threads()}


def run(args) -> int:
    import torch

    rows_list, keys_list = parse_int_list(args.rows, "--rows"), parse_int_list(args.keys, "--keys")
    check_min(args, repeat=1, layers=1, heads=1, kv_heads=1, head_dim=1, page_tokens=1,
              flush_mib=0)
    if args.heads % args.kv_heads:
        raise InputError(f"--heads ({args.heads}) must be a multiple of --kv-heads ({args.kv_heads})")
    check_fits_in_memory(max(pool_bytes(r, k, args) for r in rows_list for k in keys_list)
                         + max(args.flush_mib, 0) * 2**20, "the largest --rows x --keys pool")
    lib = cpu_native.library()
    if lib is None:
        raise InputError("the C kernels are not built here (no C compiler?): nothing to measure")
    set_threads(args.threads)
    flush = torch.ones(args.flush_mib << 18) if args.flush_mib > 0 else None  # fp32: MiB * 2^18
    results = []
    for rows in rows_list:
        for keys in keys_list:
            print(f"[bench attention] {rows} rows x {keys} keys...", file=sys.stderr, flush=True)
            results.append(measure(lib, rows, keys, args, flush))
    print(f"shape: {args.heads} query heads, {args.kv_heads} kv heads, head_dim {args.head_dim}, "
          f"{args.layers} layers, int8 K/V; {args.flush_mib} MiB read before each layer")
    print(markdown_table(results, COLUMNS))
    if args.json:
        write_json(args.json, {"bench": "attention", "heads": args.heads, "kv_heads": args.kv_heads,
                               "head_dim": args.head_dim, "layers": args.layers,
                               "flush_mib": args.flush_mib, "rows": results})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("attention", help="the CPU int8 decode attention kernel alone")
    p.add_argument("--rows", default="1,5", help="decode rows (sequences) per step")
    p.add_argument("--keys", default="128,560", help="keys each row attends to")
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--page-tokens", type=int, default=512)
    p.add_argument("--flush-mib", type=int, default=14,
                   help="memory read before each layer (SmolLM2-135M's layer weights: ~14 MiB)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json")
    p.set_defaults(func=run)
