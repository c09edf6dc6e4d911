"""Alternated A/B of the C kernels (kernels/csrc) at two or more git revisions, with `bench engine`.

This VM switches between two bandwidth modes every few seconds to minutes (docs/perf.md,
"Machines"), so two builds measured one after the other can see different machines.
This script runs `edge-runtime bench engine` once per variant per round, variants alternated, each
with kernels/csrc checked out from its revision (the native library rebuilds on a source change and
is cached per source hash, so each revision compiles once), then restores the working tree's
kernels/csrc. It reports, per variant and mode, the batch-B / batch-1 decode ratio and batch B's
decode tok/s over the steady run pairs only (the four bandwidth readings around the pair within
STEADY_SPREAD; high mode: both rooflines >= 50 GB/s, low mode: both < 42).

    python tools/ab_kernels.py --revs 96df210,5441dde --rounds 7 --out /tmp/ab

Only kernels/csrc changes between variants; the Python is the working tree's, so a revision whose
kernels/csrc lacks a file the working tree's kernels/cpu_native.py compiles does not build: the
engine would then run the slower torch paths, so a run whose log says the kernels did not build
stops the A/B. Run it with no other job on the machine, and do not edit kernels/csrc while it runs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "kernels" / "csrc"
HIGH_GBPS, LOW_GBPS = 50.0, 42.0


def checkout_csrc(rev: str, dest: Path) -> None:
    """kernels/csrc as of `rev` into dest (a revision that lacks a file leaves it out)."""
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:kernels/csrc"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    dest.mkdir(parents=True)
    for name in names:
        data = subprocess.run(["git", "show", f"{rev}:kernels/csrc/{name}"], cwd=ROOT, check=True,
                              capture_output=True).stdout
        (dest / name).write_bytes(data)


def use_sources(src: Path) -> None:
    for f in CSRC.iterdir():
        f.unlink()
    for f in src.iterdir():
        shutil.copy2(f, CSRC / f.name)


def native_failure(log: str) -> str | None:
    """The line of a run's log that says the C kernels were not used (kernels/cpu_native.py)."""
    for line in log.splitlines():
        if "edge-runtime:" in line and "torch paths" in line:
            return line.strip()
    return None


def pairs(result: dict, batch: int) -> list[dict]:
    """The run pairs of one `bench engine` JSON at batch B: ratio, batch B's tok/s, mode."""
    rows = {(r["prompt_tokens"], r["batch"]): r for r in result["rows"]}
    out = []
    for q in result["decode_ratios"]:
        if q["batch"] != batch or "steady" not in q:
            continue
        big = rows[(q["prompt_tokens"], batch)]
        for i, (ratio, g1, gb, steady) in enumerate(zip(q["per_run"], q["batch1_roofline_gbps"],
                                                        q["roofline_gbps"], q["steady"])):
            mode = ("high" if min(g1, gb) >= HIGH_GBPS else "low" if max(g1, gb) < LOW_GBPS
                    else "between")
            out.append({"prompt": q["prompt_tokens"], "ratio": ratio, "steady": steady,
                        "mode": mode if steady else "unsteady",
                        "tok_s": big["decode_samples"][i]})
    return out


def summarize(results: dict[str, list[dict]], batch: int) -> list[str]:
    lines = [f"| variant | mode | steady pairs | batch-{batch}/batch-1 median | >= 3.5x | "
             f"batch-{batch} decode tok/s median |", "|---|---|---:|---:|---:|---:|"]
    for rev, runs in results.items():
        every = [p for r in runs for p in pairs(r, batch)]
        for mode in ("high", "low", "between", "unsteady"):
            sel = [p for p in every if p["mode"] == mode]
            if sel:
                ratios = [p["ratio"] for p in sel]
                lines.append(f"| {rev} | {mode} | {len(sel)} | {statistics.median(ratios):.2f} | "
                             f"{sum(x >= 3.5 for x in ratios)} | "
                             f"{statistics.median(p['tok_s'] for p in sel):.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--revs", required=True, help="comma-separated git revisions (2 or more)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", required=True, help="folder for each run's JSON and log")
    ap.add_argument("--batch", type=int, default=5, help="batch size compared with batch 1")
    ap.add_argument("--bench-args", default="--prompt-tokens 512 --gen-tokens 128 --repeat 5",
                    help="further `bench engine` arguments")
    args = ap.parse_args(argv)
    revs = args.revs.split(",")
    if len(revs) < 2 or args.rounds < 1:
        ap.error("--revs needs two or more revisions and --rounds at least 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cli = Path(sys.executable).with_name("edge-runtime")
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "working-tree"
        shutil.copytree(CSRC, saved)
        sources = {}
        for rev in revs:
            sources[rev] = Path(tmp) / rev.replace("/", "_")
            try:
                checkout_csrc(rev, sources[rev])
            except subprocess.CalledProcessError as exc:
                ap.error(f"cannot read kernels/csrc at revision {rev!r}: {exc.stderr.strip()}")
        results: dict[str, list[dict]] = {rev: [] for rev in revs}
        try:
            for i in range(args.rounds):
                for rev in revs:
                    use_sources(sources[rev])
                    stem = out / f"{rev.replace('/', '_')}_{i + 1}"
                    cmd = [str(cli), "bench", "engine", "--batch", f"1,{args.batch}",
                           *args.bench_args.split(), "--json", f"{stem}.json"]
                    with open(f"{stem}.log", "w") as log:
                        subprocess.run(cmd, cwd=ROOT, check=True, stdout=log, stderr=log)
                    failure = native_failure(Path(f"{stem}.log").read_text())
                    if failure:
                        raise SystemExit(f"{rev}: the C kernels did not build, so this run measured "
                                         f"the torch paths; stopped ({failure})")
                    results[rev].append(json.loads(Path(f"{stem}.json").read_text()))
                    ratios = [f"{p['ratio']:.2f} ({p['mode']})" for p in pairs(results[rev][-1], args.batch)]
                    print(f"round {i + 1} {rev}: {', '.join(ratios)}", flush=True)
        finally:
            use_sources(saved)
    print("\n".join(summarize(results, args.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
