"""The engine level of tools/gpu_check.py (`--engine`): the built-in model on a CUDA GPU, through
the engine and through transformers on the same GPU, in one call that fits in ~8 minutes.

Measured per weights variant (fp16; AWQ int4 when `--awq DIR` names a checkpoint):
- decode tokens/s at batch 1, 5 and 16 after a 512-token prompt (engine: CUDA graphs where the
  step fits a bucket; transformers: `generate`, eager, and with its static cache +
  `torch.compile` when that runs): tokens/s = batch x steps / time of the decode steps;
- prefill tokens/s at 512 and 2,048 tokens (one request, one step);
- per decode step: kernels launched and the sum of their GPU times (torch.profiler, one eager
  step), the step's wall time with graphs, host syncs inside the step's device part
  (engine/step_transfers.py SyncCounter), uploads/downloads and bytes each way;
- the voice trace (`edge-runtime bench trace --systems edge`: the engine driven in-process, not
  over the service's socket) on the GPU and on the CPU back end of the same machine: requests/s.
`summarize` turns the measurements into ratios against the targets (no GPU needed: tested on a
fake measurement); `table` prints them. Targets are reported, not enforced.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from edge_runtime.import_path import module_argv

TARGETS = {  # name -> (how it is computed, target, ">=" or "<=")
    "decode_b1_vs_hf_eager": ("edge fp16 decode tok/s / transformers eager, batch 1", 4.0, ">="),
    "decode_b5_vs_hf_eager": ("edge fp16 decode tok/s / transformers eager, batch 5", 4.0, ">="),
    "step_b1_vs_kernel_sum": ("graph step wall time / sum of its kernels' GPU time, batch 1", 1.5, "<="),
    "step_b5_vs_kernel_sum": ("graph step wall time / sum of its kernels' GPU time, batch 5", 1.5, "<="),
    "voice_gpu_vs_cpu": ("voice trace requests/s, CUDA back end / CPU back end", 3.0, ">="),
}
DEFAULT_TRACE = "tools/traces/voice-home-5x12.jsonl"


def add_arguments(ap) -> None:
    ap.add_argument("--engine", action="store_true", help="run the engine level instead of the kernels")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="engine level: the model")
    ap.add_argument("--awq", default=None, help="engine level: an AWQ int4 checkpoint of the same model")
    ap.add_argument("--batches", default="1,5,16", help="engine level: decode batch sizes")
    ap.add_argument("--prompt-tokens", type=int, default=512, help="engine level: prompt of each decode row")
    ap.add_argument("--decode-steps", type=int, default=32, help="engine level: timed decode steps")
    ap.add_argument("--prefill-tokens", default="512,2048", help="engine level: prefill lengths")
    ap.add_argument("--trace", default=DEFAULT_TRACE, help="engine level: the voice trace ('' skips it)")
    ap.add_argument("--no-compile", action="store_true", help="engine level: skip transformers + torch.compile")
    ap.add_argument("--engine-budget-s", type=float, default=420.0,
                    help="engine level: sections that would start after this many seconds are skipped")



def summarize(rows: list[dict]) -> dict:
    """rows (see `run`) -> {target name: {what, target, op, measured, met}}; measured None when a
    part was not measured (skipped or failed)."""
    def value(**match):
        hits = [r["value"] for r in rows if all(r.get(k) == v for k, v in match.items())]
        return hits[0] if hits else None

    def ratio(a, b):
        return None if a is None or not b else a / b

    step = {r["batch"]: r for r in rows if r["metric"] == "step" and r.get("weights") == "fp16"}
    measured = {
        "decode_b1_vs_hf_eager": ratio(value(system="edge", weights="fp16", metric="decode", batch=1),
                                       value(system="hf-eager", weights="fp16", metric="decode", batch=1)),
        "decode_b5_vs_hf_eager": ratio(value(system="edge", weights="fp16", metric="decode", batch=5),
                                       value(system="hf-eager", weights="fp16", metric="decode", batch=5)),
        "step_b1_vs_kernel_sum": ratio(step.get(1, {}).get("step_ms"), step.get(1, {}).get("kernel_ms")),
        "step_b5_vs_kernel_sum": ratio(step.get(5, {}).get("step_ms"), step.get(5, {}).get("kernel_ms")),
        "voice_gpu_vs_cpu": ratio(value(system="edge", metric="voice", device="cuda"),
                                  value(system="edge", metric="voice", device="cpu")),
    }
    out = {}
    for name, (what, target, op) in TARGETS.items():
        m = measured[name]
        met = None if m is None else (m >= target if op == ">=" else m <= target)
        out[name] = {"what": what, "target": target, "op": op, "measured": m, "met": met}
    return out


def table(rows: list[dict], targets: dict) -> str:
    fmt = lambda v: "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))  # noqa: E731
    cols = ["system", "weights", "metric", "batch", "tokens", "device", "value", "unit", "launches",
            "kernel_ms", "step_ms", "host_syncs", "uploads", "downloads", "bytes_up", "bytes_down"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    lines += ["", "| target | measured | wanted | met |", "|---|---|---|---|"]
    lines += [f"| {t['what']} | {fmt(t['measured'])} | {t['op']} {t['target']} | {fmt(t['met'])} |"
              for t in targets.values()]
    return "\n".join(lines)


def run(args, log, out_json: Path) -> dict:
    """Every section in turn (a failed or skipped one is recorded, the others go on); the JSON is
    rewritten after each section so a crash or a timeout keeps what was measured."""
    from gpu_lab import engine_measure as m  # start-up time: imports torch

    start = time.perf_counter()
    result = {"level": "engine", "model": args.model, "rows": [], "skipped": [], "errors": []}

    def section(name, fn):
        if time.perf_counter() - start > args.engine_budget_s:
            result["skipped"].append(f"{name}: the --engine-budget-s ran out")
            return
        log(f"[{time.perf_counter() - start:5.0f} s] {name}")
        try:
            result["rows"] += fn()
        except Exception as exc:  # noqa: BLE001 - recorded; the other sections still run
            import traceback
            traceback.print_exc()
            result["errors"].append(f"{name}: {type(exc).__name__}: {exc}")
        result["targets"] = summarize(result["rows"])
        out_json.write_text(json.dumps(result, indent=1))

    variants = [("fp16", args.model)] + ([("awq-int4", args.awq)] if args.awq else [])
    for weights, model in variants:
        section(f"engine {weights}", lambda: m.engine_rows(model, weights, args, log))
    # transformers on the fp16 weights only (its AWQ path needs autoawq, which the engine does not)
    section("transformers eager fp16", lambda: m.hf_rows(args.model, "fp16", args, compiled=False))
    if not args.no_compile:
        section("transformers static cache + torch.compile fp16",
                lambda: m.hf_rows(args.model, "fp16", args, compiled=True))
    if args.trace:
        for device in ("cuda", "cpu"):
            section(f"voice trace on {device}", lambda: voice_rows(
                args.trace, args.model, device, out_json,
                timeout=max(60.0, args.engine_budget_s - (time.perf_counter() - start))))
    result["targets"] = summarize(result["rows"])
    result["seconds"] = time.perf_counter() - start
    out_json.write_text(json.dumps(result, indent=1))
    log(table(result["rows"], result["targets"]))
    return result


def voice_rows(trace: str, model: str, device: str, out_json: Path, timeout: float = 240.0) -> list[dict]:
    """The trace through the service's engine (`edge-runtime bench trace --systems edge`)."""
    path = out_json.with_name(f"{out_json.stem}-voice-{device}.json")
    cmd = module_argv("edge_runtime", "bench", "trace", "--trace", trace, "--systems", "edge",
                      "--model", model, "--device", device, "--json", str(path))
    subprocess.run(cmd, check=True, timeout=timeout)
    data = json.loads(path.read_text())
    row = next(r for r in data["rows"] if r.get("system", "edge") == "edge")
    return [{"system": "edge", "metric": "voice", "device": device, "value": row["requests_per_s"],
             "unit": "req/s", "weights": "fp16" if device == "cuda" else "cpu-default"}]
