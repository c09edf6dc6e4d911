"""Decode-step time of a GGUF's K / IQ4 linears in their file-sized forms vs earlier forms.

    .venv/bin/python tools/gguf_forms_bench.py FILE.gguf [--before one-level|4-bit] [--rows 1] \
        [--reps 30] [--threads 1] [--json out.json]

Every tensor of the file in Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL or IQ4_XS is converted twice:
as the loader holds it (two-level parameters, Q2_K / Q3_K in 2 / 3 bits, Q6_K in 6 bits, IQ4 as
codebook indices) and in an earlier form of the same values: `--before one-level` (the default)
fp32 d sc per group, Q6_K and the IQ4 codebook values as int8, Q2_K / Q3_K's integers in 4 bits;
`--before 4-bit` (Q2_K and Q3_K only) the two-level 4-bit form they were held in before their
2- / 3-bit ones (int8 codes, Q3_K's q3 + 4 with an offset -4 d (sc - 32)). Each pass times one `rows`-row call of linear_int4.c (the decode kernel, torch's
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
    integers as int8, 2- / 3-bit ones in 4 bits: the forms these types were held in before the
    two-level ones."""
    if rows.bits in (2, 3):
        rows = four_bit(rows)
    scales, offsets = rows.params()
    if rows.super_scales is None:  # IQ4_NL: its fp16 d as it was
        scales = rows.scales
    bits = 8 if rows.bits == 6 or rows.codebook is not None else rows.bits
    q = rows.values().to(torch.int8) if bits == 8 else rows.q
    return GroupedRows(q, scales, offsets, bits, rows.group_size)


def four_bit(rows: GroupedRows) -> GroupedRows:
    """Q2_K / Q3_K's 2- / 3-bit rows as the two-level 4-bit form: unsigned 4-bit integers (a
    signed 3-bit q3 as q3 + 4 with an offset -4 s: code 4 sc times super -d), int8 codes."""
    if not rows.signed:
        return GroupedRows(rows.q, rows.scales.to(torch.int8), rows.offsets.to(torch.int8), 4,
                           rows.group_size, rows.super_scales, rows.super_offsets)
    assert rows.offsets is None, "a signed 3-bit form has no offset"
    q = (rows.q.to(torch.int16) + 4).to(torch.uint8)
    return GroupedRows(q, rows.scales, (4 * rows.scales.to(torch.int16)).to(torch.int8), 4,
                       rows.group_size, rows.super_scales, -rows.super_scales)


BEFORE = {"one-level": (CHANGED, one_level), "4-bit": (("Q2_K", "Q3_K"), four_bit)}


def linears(path: Path, before: str) -> dict[str, list[tuple[QuantLinear, QuantLinear]]]:
    import gguf

    types, earlier = BEFORE[before]
    out = defaultdict(list)
    for t in gguf.GGUFReader(path).tensors:
        name = t.tensor_type.name
        if name in types and len(t.shape) == 2:
            rows = gguf_blocks.grouped_rows(np.asarray(t.data), name, t.name)
            now, then = (BlockedQuantWeight.from_rows(r) for r in (rows, earlier(rows)))
            assert torch.equal(now.dequantize(), then.dequantize()), f"{t.name}: forms differ"
            out[name].append((QuantLinear(now), QuantLinear(then)))
    if not out:
        raise SystemExit(f"{path} holds no 2-D tensor of {', '.join(types)}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--before", choices=sorted(BEFORE), default="one-level",
                   help="the earlier form to time against (4-bit: Q2_K / Q3_K only)")
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    by_type = linears(args.model, args.before)
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
    print(f"{args.model.name}, {args.rows} row(s), {torch.get_num_threads()} threads, {args.reps} passes, "
          f"before: {args.before}")
    print("| type | form | tensors | bytes | ms min | ms median |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['type']} | {r['form']} | {r['tensors']} | {r['bytes']:,} | {r['ms_min']:.3f} | "
              f"{r['ms_median']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "rows": args.rows,
                                         "before": args.before,
                                         "threads": torch.get_num_threads(), "results": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
