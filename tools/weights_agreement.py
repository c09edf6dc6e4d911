"""Greedy outputs of a GGUF model served from its own blocks vs its float32 conversion.

    .venv/bin/python tools/weights_agreement.py [--model M] [--max-tokens 64] [--json out.json]

Prompts: the ten of tools/lab/greedy.py (plain and chat) and the first turn of each
stream of the voice traces (tools/traces, system prompt + command, chat). Both models run through
the Engine as served (int8 KV, packed linears, the C decode step), greedy, one request at a time.
Per prompt: whether the tokens are equal, the first position where they differ, and the float32
model's top-1 minus top-2 logit margin there (teacher-forced on the float32 output) and the
smallest margin over its whole output: an int4 run differs from the fp32 one only by summation
order (the same dequantized values; the int4 kernel applies a group's scale and offset to the
group's sums), so a difference can only appear where that margin is within rounding. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from lab.greedy import CHAT, PLAIN, greedy_tokens  # noqa: E402 - tools/ just went on sys.path


def project_prompts(tokenizer) -> list[tuple[str, list[int]]]:
    from edge_runtime.model.chat import encode_prompt

    out = [(p[:40], encode_prompt(tokenizer, p, chat=False)) for p in PLAIN]
    out += [(p[:40], encode_prompt(tokenizer, p, chat=True)) for p in CHAT]
    for trace in sorted((ROOT / "tools/traces").glob("*.jsonl")):
        for line in trace.read_text().splitlines():
            turn = json.loads(line)
            if turn.get("turn") == 1:
                ids = encode_prompt(tokenizer, turn["command"], chat=True, system=turn.get("system"))
                out.append((f"{trace.stem}/{turn['stream']}: {turn['command'][:24]}", ids))
    return out


def margins(model, prompt: list[int], output: list[int]) -> list[float]:
    """top-1 minus top-2 logit of `model` at each output position (teacher-forced)."""
    from edge_runtime.model.contiguous_kv import ContiguousKVCache

    ids = prompt + output[:-1]
    cache = ContiguousKVCache.for_model(model.config, dtype=torch.float32)
    cache.add(0)
    logits = model(torch.tensor(ids), cache.positions([0], [len(ids)]), cache.step([0], [len(ids)]),
                   torch.arange(len(prompt) - 1, len(ids)))
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def print_row(r: dict) -> None:
    there = "" if r["margin_there"] is None else f"{r['margin_there']:.4f}"
    print(f"| {r['prompt']!r} | {r['prompt_tokens']} | {r['tokens']} | {r['equal']} | "
          f"{'' if r['first_difference'] is None else r['first_difference']} | {there} | "
          f"{r['min_margin']:.4f} |", flush=True)


def main() -> int:
    from edge_runtime.bench.edge_systems import build_engine, load
    from edge_runtime.model.loader import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json")
    args = p.parse_args()
    quant, ref = load(args.model, "gguf"), load(args.model, "fp32")  # prepared for the back end
    reference_model = load_model(args.model, weights="fp32", progress=None).model  # unpacked
    engines = {name: build_engine(lm, "edge", max_tokens=2048) for name, lm in
               (("gguf", quant), ("fp32", ref))}
    rows = []
    print("| prompt | prompt tok | gen tok | equal | first diff | fp32 margin there | min margin |")
    print("|---|---:|---:|---|---:|---:|---:|", flush=True)
    for label, ids in project_prompts(quant.tokenizer):
        outs = {name: greedy_tokens(e, ids, args.max_tokens) for name, e in engines.items()}
        a, b = outs["gguf"], outs["fp32"]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                     None if len(a) == len(b) else min(len(a), len(b)))
        m = margins(reference_model, ids, b)
        rows.append({"prompt": label, "prompt_tokens": len(ids), "tokens": len(b), "equal": a == b,
                     "first_difference": first,
                     "margin_there": None if first is None or first >= len(m) else m[first],
                     "min_margin": min(m)})
        print_row(rows[-1])
    equal = sum(r["equal"] for r in rows)
    print(f"{equal}/{len(rows)} greedy outputs equal ({args.max_tokens} tokens max)")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
