"""`edge-runtime bench kv-groups`: the KV bytes one long sequence of a sliding-window model holds
in the engine's pool with layer groups (kv/layer_groups.py), against the same sequence stored in
every layer, next to the ratio `plan` predicts (plan.layer_group_bytes).

One request of `--tokens` positions (a random prompt, then `--gen` greedy tokens) runs through a
real Engine. At its last decode step the pool is read: the slices the sequence holds live (its
global groups' slice of every page, its local groups' slices of the pages in its window) times the
bytes of one slice (the pool tensors' bytes over their slices), plus its inline slots; "every
layer" is the same pages with every group's slice (what a pool without layer groups holds).
The local slices it dropped are cached (evictable, first in line) and reported apart.
"""

from __future__ import annotations

import sys

from edge_runtime.bench.checks import check_context, check_min
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.kv.page_math import pages_for_sequence_at_most
from edge_runtime.plan import layer_group_bytes

MIB = 1 << 20
COLUMNS = [Column("tokens", "tokens"), Column("pages", "pages"),
           Column("local_pages", "pages with local slices"),
           Column("all_layers_mib", "every layer MiB", "{:.2f}"),
           Column("grouped_mib", "layer groups MiB", "{:.2f}"),
           Column("ratio", "measured ratio", "{:.3f}"),
           Column("predicted_ratio", "plan's ratio", "{:.3f}"),
           Column("predicted_grouped_mib", "plan's groups MiB", "{:.2f}"),
           Column("cached_local_mib", "dropped local, cached MiB", "{:.2f}")]


def held_bytes(engine, seq_id) -> dict:
    """What the sequence holds in the pool now, grouped and as every layer would."""
    kv, storage = engine.kv, engine.storage
    pool, seq = kv.pool, kv.seqs[seq_id]
    slice_bytes = storage.pool.nbytes() // pool.num_pages
    slot_bytes = storage.inline.nbytes() // storage.inline.num_blocks if storage.inline else 0
    pages = seq.all_pages()
    local_pages = len(pages) - seq.local_from
    grouped = (len(pages) * pool.global_slices + local_pages * pool.local_slices) * slice_bytes
    all_layers = len(pages) * pool.page_slices * slice_bytes
    inline = len(seq.inline_slots) * slot_bytes
    cached_local = sum(1 for pg in pool.pages if pg.local and pg.state == "cached") * slice_bytes
    return {"tokens": seq.num_tokens, "pages": len(pages), "local_pages": local_pages,
            "slice_bytes": slice_bytes, "grouped_bytes": grouped + inline,
            "all_layers_bytes": all_layers + inline, "cached_local_bytes": cached_local}


def measure(engine, prompt: list[int], gen: int) -> dict:
    rid = engine.add_request(prompt, SamplingParams(max_tokens=gen, temperature=0.0,
                                                    ignore_eos=True))
    last, step = None, 0
    while engine.has_unfinished():
        engine.step()
        step += 1
        seqs = [s for s in engine.kv.seqs.values()]
        if seqs:
            last = held_bytes(engine, seqs[0].seq_id)
            print(f"[bench kv-groups] step {step}: {last['tokens']} tokens", file=sys.stderr,
                  flush=True)
    assert last is not None, f"request {rid} ran no step"
    return last


def run(args) -> int:
    import random

    from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch
    from edge_runtime.engine.engine import Engine  # start-up time: imports numpy, torch

    check_min(args, tokens=2, gen=2, page_tokens=1)
    check_context(args.model, args.tokens, "--tokens")
    print(f"[bench kv-groups] loading {args.model}...", file=sys.stderr)
    loaded = load_for(args.model, resolve("cpu"), progress=lambda msg: None)
    groups = layer_group_bytes(loaded.config, args.kv_dtype, args.page_tokens, args.tokens)
    if groups is None:
        print(f"{args.model} has no local (sliding-window) layers: nothing to compare",
              file=sys.stderr)
        return 2
    pages = pages_for_sequence_at_most(args.tokens, args.page_tokens) + 1
    engine = Engine(loaded, EngineConfig(device="cpu", page_tokens=args.page_tokens,
                                         kv_dtype=args.kv_dtype, num_pages=pages,
                                         max_batch_tokens=args.chunk))
    rng = random.Random(0)
    # the last step finishes the request: the one before it holds prompt + gen - 2 positions
    prompt = [rng.randrange(10, loaded.config.vocab_size) for _ in range(args.tokens - args.gen + 2)]
    got = measure(engine, prompt, args.gen)
    row = {"tokens": got["tokens"], "pages": got["pages"], "local_pages": got["local_pages"],
           "all_layers_mib": got["all_layers_bytes"] / MIB, "grouped_mib": got["grouped_bytes"] / MIB,
           "ratio": got["grouped_bytes"] / got["all_layers_bytes"],
           "predicted_ratio": groups.ratio, "predicted_grouped_mib": groups.stream_bytes_grouped / MIB,
           "cached_local_mib": got["cached_local_bytes"] / MIB}
    print(f"{args.model}: {groups.global_layers} global / {groups.local_layers} local layers "
          f"(window {groups.window}), {args.kv_dtype} KV, {args.page_tokens}-token pages, "
          f"one sequence at its last decode step")
    print(markdown_table([row], COLUMNS))
    if args.json:
        write_json(args.json, {"bench": "kv-groups", "model": args.model, "kv_dtype": args.kv_dtype,
                               "page_tokens": args.page_tokens, "gen": args.gen, "row": row,
                               "measured": got, "predicted": {**groups.__dict__,
                                                              "ratio": groups.ratio}})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("kv-groups", help="KV bytes of one long sequence with layer groups "
                                                "vs every layer, next to plan's prediction")
    p.add_argument("--model", required=True, help="a model with local (sliding-window) layers")
    p.add_argument("--tokens", type=int, default=8192, help="positions of the sequence at its end")
    p.add_argument("--gen", type=int, default=4, help="greedy tokens after the prompt")
    p.add_argument("--page-tokens", type=int, default=512)
    p.add_argument("--kv-dtype", default="int8", choices=("int8", "fp16", "fp32"))
    p.add_argument("--chunk", type=int, default=512, help="prefill tokens per step")
    p.add_argument("--json")
    p.set_defaults(func=run)
