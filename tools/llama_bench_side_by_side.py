"""llama.cpp's `llama-bench` next to `edge-runtime bench engine` on the same GGUF file, alternated.

    .venv/bin/python tools/llama_bench_side_by_side.py --llama-bench PATH --model FILE_OR_NAME \
        [--rounds 2] [--threads 2] [--out side_by_side.json]

Each round runs both (the order swaps every round, so a machine whose speed drifts hits both
alike): llama-bench's pp512 and tg128 (`-p 512 -n 128 -r 1`, its own warm-up run first), and
`bench engine` at batch 1 with prompts of 16 and 512 tokens and 128 generated (`--repeat 1`, its
own warm-up run first): our prefill is the 512-token prompt's, our decode the 16-token prompt's
(the nearest to tg128's empty context). `--prefill-tokens` changes 512 in both. Both run at --threads. The one-minute load average before
each run is recorded: on a shared machine say how loaded it was. Prints a markdown table of the
medians over rounds and the ratios edge / llama.cpp; --out is rewritten after every run (so a
run cut short keeps the runs it finished) and ends with the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: source_tree
from source_tree import import_edge_runtime  # noqa: E402

import_edge_runtime()
from edge_runtime.import_path import module_argv  # noqa: E402

DECODE_PROMPT, GEN = 16, 128


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def llama_bench(binary: str, gguf: Path, threads: int, prefill: int) -> dict:
    """{"prefill": pp<prefill> tok/s, "decode": tg128 tok/s} from one llama-bench run."""
    proc = subprocess.run([binary, "-m", str(gguf), "-t", str(threads), "-p", str(prefill),
                           "-n", str(GEN), "-r", "1", "-o", "json"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"llama-bench failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    tests = json.loads(proc.stdout)
    by = {(t["n_prompt"], t["n_gen"]): t["avg_ts"] for t in tests}
    return {"prefill": by[(prefill, 0)], "decode": by[(0, GEN)],
            "build": tests[0].get("build_commit"), "cpu": tests[0].get("cpu_info")}


def edge_bench(model: str, threads: int, workdir: Path, prefill: int) -> dict:
    """{"prefill": tok/s of the `prefill`-token prompt, "decode": tok/s after the 16-token prompt}."""
    out = workdir / "engine.json"
    argv = module_argv("edge_runtime", "bench", "engine", "--model", model, "--batch", "1",
                       "--prompt-tokens", f"{DECODE_PROMPT},{prefill}",
                       "--gen-tokens", str(GEN), "--repeat", "1", "--threads", str(threads),
                       "--bandwidth-mib", "128", "--device", "cpu", "--json", str(out))
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"edge-runtime bench engine failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report = json.loads(out.read_text())
    rows = {r["prompt_tokens"]: r for r in report["rows"]}
    return {"prefill": rows[prefill]["prefill_tok_s"]["mean"],
            "decode": rows[DECODE_PROMPT]["decode_tok_s"]["mean"],
            "weight_bytes": report["weight_bytes"], "quantization": report["quantization"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", required=True, help="the llama-bench binary")
    ap.add_argument("--model", required=True, help="a .gguf file, or a name `edge-runtime models` lists")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill-tokens", type=int, default=512,
                    help="the prefill prompt (llama-bench -p); fewer where the engine's context is "
                         "shorter than it + 128 (Gemma 3 up to its 512-token window: 384)")
    ap.add_argument("--out", help="write every run and the medians here (JSON)")
    args = ap.parse_args()
    from edge_runtime.model.loader import gguf_source  # after import_edge_runtime: imports torch

    gguf = gguf_source(args.model)
    if gguf is None:
        sys.exit(f"--model {args.model} is not a .gguf file nor the name of one")
    runs = []
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as tmp:
        for r in range(args.rounds):
            order = ("llama.cpp", "edge") if r % 2 == 0 else ("edge", "llama.cpp")
            for system in order:
                load = os.getloadavg()[0]
                log(f"round {r + 1}/{args.rounds}: {system} (load average {load:.2f}) ...")
                result = (llama_bench(args.llama_bench, gguf, args.threads, args.prefill_tokens)
                          if system == "llama.cpp"
                          else edge_bench(str(gguf), args.threads, Path(tmp), args.prefill_tokens))
                runs.append({"round": r, "system": system, "load_before": load, **result})
                log(f"  prefill {result['prefill']:.1f} tok/s, decode {result['decode']:.1f} tok/s")
                if args.out:  # every run as it ends: a long run cut short keeps what it measured
                    Path(args.out).write_text(json.dumps({"gguf": str(gguf), "runs": runs}, indent=2))
    medians = {s: {k: statistics.median(x[k] for x in runs if x["system"] == s)
                   for k in ("prefill", "decode", "load_before")} for s in ("edge", "llama.cpp")}
    edge, peer = medians["edge"], medians["llama.cpp"]
    print(f"{gguf.name} ({gguf.stat().st_size:,} bytes), {args.threads} threads, {args.rounds} "
          f"rounds alternated, {cpu_model()}")
    print(f"| system | prefill tok/s (pp{args.prefill_tokens}) "
          "| decode tok/s (tg128; edge: batch 1 after 16 tokens) | load average before (median) |")
    print("|---|---|---|---|")
    for name, m in (("edge-runtime", edge), ("llama.cpp llama-bench", peer)):
        print(f"| {name} | {m['prefill']:.1f} | {m['decode']:.1f} | {m['load_before']:.2f} |")
    print(f"| edge / llama.cpp | {edge['prefill'] / peer['prefill']:.2f}x "
          f"| {edge['decode'] / peer['decode']:.2f}x | |")
    if args.out:
        Path(args.out).write_text(json.dumps({"gguf": str(gguf), "threads": args.threads,
                                              "prefill_tokens": args.prefill_tokens,
                                              "cpu": cpu_model(), "runs": runs,
                                              "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
