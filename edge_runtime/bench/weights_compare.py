"""Several weight forms of one model side by side in `bench engine --weights gguf,fp32`.

Rounds are interleaved (round i of every weight form, then round i + 1; within a round the batch
sizes as bench_prompt runs them), so a machine whose speed drifts hits every form alike and their
ratio is fair. Each round is one bench_prompt call with repeat=1 (its warm-up included); the rounds'
samples are merged into one row per (weights, prompt, batch). `weight_ratios` gives decode and
prefill tokens/s of the first form over each other one, of the means and round by round.
"""
from __future__ import annotations

from edge_runtime.bench.engine_runs import add_roofline, bench_prompt
from edge_runtime.bench.stats import Summary
from edge_runtime.errors import InputError

WEIGHT_FORMS = ("auto", "gguf", "fp32", "fp16", "bf16")


def parse_weights(text: str) -> list[str]:
    forms = [w.strip() for w in text.split(",")]
    bad = [w for w in forms if w not in WEIGHT_FORMS]
    if bad or not forms or len(set(forms)) != len(forms):
        raise InputError(f"--weights must be distinct comma-separated forms of {', '.join(WEIGHT_FORMS)}"
                         f", got {text!r}")
    return forms


def merge_rounds(rounds: list[dict]) -> dict:
    """One row from the rows of several single-run rounds of the same (prompt, batch)."""
    row = dict(rounds[0])
    for key in ("prefill_samples", "decode_samples", "weight_read_gbps_samples", "bandwidth"):
        if key in row:
            row[key] = [x for r in rounds for x in r[key]]
    row["repeat"] = len(row["decode_samples"])
    for key in ("prefill", "decode"):
        row[f"{key}_tok_s"] = Summary.of(row[f"{key}_samples"]).to_dict()
    row["weight_read_gbps"] = Summary.of(row["weight_read_gbps_samples"]).to_dict()
    if "bandwidth" in row:
        add_roofline(row, [max(a["read_gbps"], b["read_gbps"]) for a, b in row["bandwidth"]])
    return row


def bench_interleaved(systems: dict, batches, prompt_len, gen_tokens, repeat, rng, progress,
                      measure=None) -> list[dict]:
    """systems: weights form -> (engine, loaded). Rows with a "weights" key, per form and batch."""
    rounds: dict[tuple[str, int], list[dict]] = {}
    for i in range(repeat):
        for form, (engine, loaded) in systems.items():
            progress(f"weights {form}: round {i + 1}/{repeat}")
            for row in bench_prompt(engine, loaded, batches, prompt_len, gen_tokens, 1, rng,
                                    lambda msg: None, measure):
                rounds.setdefault((form, row["batch"]), []).append(row)
    return [{"weights": form, **merge_rounds(rows)} for (form, _), rows in rounds.items()]


def weight_ratios(rows: list[dict]) -> list[dict]:
    """Per prompt and batch: tokens/s of the first weights form over each other form's."""
    forms = list(dict.fromkeys(r["weights"] for r in rows))
    out = []
    for other in forms[1:]:
        for r in rows:
            if r["weights"] != forms[0]:
                continue
            o = next(x for x in rows if x["weights"] == other and x["batch"] == r["batch"]
                     and x["prompt_tokens"] == r["prompt_tokens"])
            out.append({"weights": forms[0], "vs": other, "batch": r["batch"],
                        "prompt_tokens": r["prompt_tokens"],
                        "decode_of_means": r["decode_tok_s"]["mean"] / o["decode_tok_s"]["mean"],
                        "prefill_of_means": r["prefill_tok_s"]["mean"] / o["prefill_tok_s"]["mean"],
                        "decode_per_round": [a / b for a, b in zip(r["decode_samples"],
                                                                   o["decode_samples"])]})
    return out


def format_weight_ratios(ratios: list[dict]) -> list[str]:
    return [f"{q['weights']}/{q['vs']} at batch {q['batch']}, {q['prompt_tokens']}-token prompts: "
            f"decode {q['decode_of_means']:.2f}x, prefill {q['prefill_of_means']:.2f}x (means); "
            f"decode round by round: {', '.join(f'{x:.2f}' for x in q['decode_per_round'])}"
            for q in ratios]
