"""Decode and prefill speed of the CPU back end per OpenMP wait policy and thread count, quiet and
with busy processes taking cores: the measurement behind kernels/cpu_threads.py's policy.

Each cell is one `edge-runtime bench engine` run in a fresh process (OMP_WAIT_POLICY is read once,
when the OpenMP runtime loads); cells are interleaved round by round so a drifting machine hits
them alike, and the table shows medians over rounds. `--busy N` spawns N processes that spin on a
core each for the busy cells. `threads auto` is the policy's own choice (kernels/cpu_threads.py).

    .venv/bin/python tools/cpu_wait_probe.py [--rounds 3 --policies default,passive,spin=10000
        --threads 1,2,auto --busy 0,1 --batch 1,5 --prompt-tokens 128 --gen-tokens 32] [--json F]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from itertools import product

from edge_runtime.import_path import module_argv
from edge_runtime.bench.busy import BusyLoad


def policy_env(policy: str) -> dict:
    """The environment of a cell: `default` (libgomp's: spin a while, then sleep), `active` (spin
    only), `passive` (sleep at once) or `spin=N` (GOMP_SPINCOUNT=N spins, then sleep)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = policy[len("spin="):]
    elif policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    return env


def run_cell(policy: str, threads: str, args) -> list[dict]:
    """One bench engine run; its rows (per batch)."""
    env = policy_env(policy)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [*module_argv("edge_runtime", "bench", "engine"), "--weights", args.weights,
               "--batch", args.batch, "--prompt-tokens", str(args.prompt_tokens),
               "--gen-tokens", str(args.gen_tokens), "--repeat", "1", "--bandwidth-mib", "64",
               "--json", out.name]
        if threads != "auto":
            cmd += ["--threads", threads]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.load(open(out.name))["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--policies", default="default,passive,spin=10000",
                    help="comma-separated: default, active, passive, spin=N")
    ap.add_argument("--threads", default="1,2,auto")
    ap.add_argument("--busy", default="0,1")
    ap.add_argument("--weights", default="gguf")
    ap.add_argument("--batch", default="1,5")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cells = list(product([int(b) for b in args.busy.split(",")], args.policies.split(","),
                         args.threads.split(",")))
    samples: dict = {}
    for r in range(args.rounds):
        for busy, policy, threads in cells:
            with BusyLoad(busy):
                rows = run_cell(policy, threads, args)
            for row in rows:
                key = (busy, policy, threads, row["batch"])
                s = samples.setdefault(key, {"decode": [], "prefill": []})
                s["decode"] += row["decode_samples"]
                s["prefill"] += row["prefill_samples"]
            print(f"round {r + 1}/{args.rounds}: busy {busy} {policy} threads {threads} done",
                  file=sys.stderr, flush=True)
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}; medians of {args.rounds} rounds, "
          f"prompt {args.prompt_tokens}, {args.gen_tokens} generated, weights {args.weights}\n")
    print("| busy | wait policy | threads | batch | decode tok/s | prefill tok/s |\n"
          "|---:|---|---|---:|---:|---:|")
    table = []
    for (busy, policy, threads, batch), s in samples.items():
        row = {"busy": busy, "policy": policy, "threads": threads, "batch": batch,
               "decode_tok_s": statistics.median(s["decode"]),
               "prefill_tok_s": statistics.median(s["prefill"]), "samples": s}
        table.append(row)
        print(f"| {busy} | {policy} | {threads} | {batch} | {row['decode_tok_s']:.1f} | "
              f"{row['prefill_tok_s']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": table}, f, indent=2)


if __name__ == "__main__":
    main()
