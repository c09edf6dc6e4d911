"""Decode-step time of a GGUF's K / IQ4 linears in their file-sized forms vs the one-level forms.

    .venv/bin/python tools/gguf_forms_bench.py FILE.gguf [--rows 1] [--reps 30] [--threads 1] [--json out.json]

Every tensor of the file in Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS is converted twice:
as the loader holds it (two-level parameters, Q6_K in 6 bits, IQ4 as codebook indices) and in the
one-level form the same values took before (fp32 d sc per group, Q6_K and the IQ4 codebook values
as int8). Each pass times one `rows`-row call of linear_int4.c (the decode kernel, torch's
--threads) on every such tensor in one form, then in the other, alternating, so both see the
same machine load; per type: bytes held, and the minimum and median over the passes of the summed
ms. Both forms compute the same sums (tests/test_kernel_cpu_int4.py), so only the bytes read and
the instructions that expand them differ. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_tree import import_edge_runtime  # noqa: E402 - tools/ just went on sys.path

import_edge_runtime()
from edge_runtime.kernels.cpu_int4 import QuantLinear  # noqa: E402
from edge_runtime.quant import gguf_blocks  # noqa: E402
from edge_runtime.quant.int4_format import BlockedQuantWeight, GroupedRows  # noqa: E402

CHANGED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")


def one_level(rows: GroupedRows) -> GroupedRows:
    """The same values with fp32 (IQ4_NL: fp16) parameters per group, 6-bit and codebook
    integers as int8: the forms these types were held in before the two-level ones."""
    scales, offsets = rows.params()
    if rows.super_scales is None:  # IQ4_NL: its fp16 d as it was
        scales = rows.scales
    bits = 8 if rows.bits == 6 or rows.codebook is not None else rows.bits
    q = rows.values().to(torch.int8) if bits == 8 else rows.q
    return GroupedRows(q, scales, offsets, bits, rows.group_size)


def linears(path: Path) -> dict[str, list[tuple[QuantLinear, QuantLinear]]]:
    import gguf

    out = defaultdict(list)
    for t in gguf.GGUFReader(path).tensors:
        name = t.tensor_type.name
        if name in CHANGED and len(t.shape) == 2:
            rows = gguf_blocks.grouped_rows(np.asarray(t.data), name, t.name)
            out[name].append((QuantLinear(BlockedQuantWeight.from_rows(rows)),
                              QuantLinear(BlockedQuantWeight.from_rows(one_level(rows)))))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    by_type = linears(args.model)
    xs = {m.in_features: torch.randn(args.rows, m.in_features)
          for pairs in by_type.values() for pair in pairs for m in pair}
    times = {(t, form): [] for t in by_type for form in ("now", "before")}
    for _ in range(args.reps):
        for t, pairs in by_type.items():
            for i, form in enumerate(("now", "before")):
                start = time.perf_counter()
                for pair in pairs:
                    pair[i].c_kernel(xs[pair[i].in_features])
                times[(t, form)].append(1e3 * (time.perf_counter() - start))
    rows = []
    for t, pairs in by_type.items():
        for i, form in enumerate(("now", "before")):
            ms = times[(t, form)]
            rows.append({"type": t, "form": form, "tensors": len(pairs),
                         "bytes": sum(pair[i].weight.nbytes for pair in pairs),
                         "ms_min": min(ms), "ms_median": statistics.median(ms)})
    print(f"{args.model.name}, {args.rows} row(s), {torch.get_num_threads()} threads, {args.reps} passes")
    print("| type | form | tensors | bytes | ms min | ms median |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['type']} | {r['form']} | {r['tensors']} | {r['bytes']:,} | {r['ms_min']:.3f} | "
              f"{r['ms_median']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "rows": args.rows,
                                         "threads": torch.get_num_threads(), "results": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
