"""`edge-runtime bench trace`: closed-loop replay of a multi-turn trace on several systems.

Systems: `edge` (ours: int8 pages, prefix cache, inline path), `edge-noshare` (prefix cache and
inline path off), `edge-fp16kv` (fp16 KV), `hf` (transformers generate, one request at a time,
fresh cache), or `--target unix:PATH|http://HOST:PORT` (any OpenAI-compatible server). Each system
runs in its own spawned process (bench/trace_worker.py) unless --no-isolate. Prints a markdown
table and the target ratios of docs/perf.md ("bench trace"); writes JSON rows (+ per-request
records) and a PNG.
"""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

from edge_runtime.bench.checks import check_context, check_fits_in_memory, check_min
from edge_runtime.bench.replay import ARRIVALS, HISTORIES
from edge_runtime.bench.report import Column, fmt_mib, fmt_ms, fmt_pct, markdown_table, write_json
from edge_runtime.bench.stats import ratio
from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.errors import InputError
from edge_runtime.bench.edge_systems import describe_backend
from edge_runtime.bench.http_client import parse_target
from edge_runtime.bench.plot import plot_trace
from edge_runtime.bench.trace import load_trace
from edge_runtime.bench.trace_worker import run_system
from edge_runtime.plan import kv_bytes_per_token

SYSTEMS = ("edge", "edge-noshare", "edge-fp16kv", "hf", "edge-fp32w")
DEFAULT_SYSTEMS = ("edge", "edge-noshare", "edge-fp16kv", "hf")

COLUMNS = [
    Column("system", "system"), Column("requests", "req"),
    Column("makespan_s", "makespan s", "{:.1f}"), Column("requests_per_s", "req/s", "{:.2f}"),
    Column("output_tokens_per_s", "out tok/s", "{:.1f}"),
    Column("ttft_p50_s", "TTFT p50 ms", fmt_ms), Column("ttft_p95_s", "TTFT p95 ms", fmt_ms),
    Column("tpot_p50_s", "TPOT p50 ms", fmt_ms), Column("tpot_p95_s", "TPOT p95 ms", fmt_ms),
    Column("peak_kv_bytes", "peak KV MiB", fmt_mib), Column("peak_rss_bytes", "peak RSS MiB", fmt_mib),
    Column("cached_prompt_tokens", "cached prompt tok"), Column("cached_frac", "cached %", fmt_pct),
    Column("page_utilization", "page util", fmt_pct),
]
JTOP_COLUMNS = [
    Column("jtop_peak_ram_bytes", "jtop peak RAM MiB", fmt_mib, "unavailable"),
    Column("jtop_peak_nvmap_bytes", "NvMap MiB", fmt_mib, "unavailable"),
    Column("jtop_avg_power_w", "avg W", "{:.1f}", "unavailable"),
    Column("jtop_tokens_per_j", "tok/J", "{:.2f}", "unavailable"),
    Column("jtop_max_temp_c", "max °C", "{:.0f}", "unavailable"),
]

# (name, numerator system, denominator system, row key, how to read, bound, streams it applies
# to: None for any replay, 1 for a batch-1 target, which holds only when one stream is replayed)
TARGETS = [
    ("edge/hf requests/s", "edge", "hf", "requests_per_s", ">=", 4.0, None),
    ("edge/hf TTFT p95", "edge", "hf", "ttft_p95_s", "<=", 1 / 8, None),
    ("edge/edge-noshare TTFT p95", "edge", "edge-noshare", "ttft_p95_s", "<=", 1 / 5, None),
    ("edge/edge-noshare peak KV", "edge", "edge-noshare", "peak_kv_bytes", "<=", 0.80, None),
    ("edge/edge-fp16kv peak KV", "edge", "edge-fp16kv", "peak_kv_bytes", "<=", 0.55, None),
    # served from a GGUF's 4-bit blocks vs its float32 conversion: batch-1 decode >= 2.5x tokens/s
    ("edge/edge-fp32w TPOT p50", "edge", "edge-fp32w", "tpot_p50_s", "<=", 1 / 2.5, 1),
    ("edge/edge-fp32w peak RSS", "edge", "edge-fp32w", "peak_rss_bytes", "<=", 1.0, None),
]


def parse_systems(text: str) -> list[str]:
    systems = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not systems:
        raise InputError(f"--systems takes a comma-separated subset of {', '.join(SYSTEMS)}; "
                         f"unknown: {', '.join(unknown) or '(empty)'}")
    twice = sorted({s for s in systems if systems.count(s) > 1})
    if twice:
        raise InputError(f"--systems lists {', '.join(twice)} more than once (a system's row would "
                         "replace its first run's); give each once")
    return systems


def compare(rows: dict[str, dict], streams: int | None = None) -> list[dict]:
    """The target ratios (docs/perf.md, "bench trace") for the systems that ran; `pass` is None
    when a side is missing, or when the target is for another number of streams than the replay's
    (`streams`; the ratio is still given)."""
    out = []
    for name, num, den, key, op, bound, for_streams in TARGETS:
        if num not in rows or den not in rows:
            continue
        r = ratio(rows[num].get(key), rows[den].get(key))
        target = f"{op} {bound:.3g}"
        if for_streams is not None and streams != for_streams:
            out.append({"comparison": name, "ratio": r, "pass": None,
                        "target": f"{target} with --streams {for_streams} (batch {for_streams})"})
            continue
        ok = None if r is None else (r >= bound if op == ">=" else r <= bound)
        out.append({"comparison": name, "ratio": r, "target": target, "pass": ok})
    return out


def identical_answers(a: list[dict], b: list[dict]) -> dict:
    """How many (stream, turn) answers of run a have exactly the same text in run b; the first
    turns (each stream's lowest turn: same prompts on both runs) counted apart."""
    texts_b = {(r["stream"], r["turn"]): r["text"] for r in b}
    same = sum(1 for r in a if texts_b.get((r["stream"], r["turn"])) == r["text"])
    first = {}
    for r in a:
        first[r["stream"]] = min(first.get(r["stream"], r["turn"]), r["turn"])
    first_turn = [r for r in a if r["turn"] == first[r["stream"]]]
    same_first = sum(1 for r in first_turn if texts_b.get((r["stream"], r["turn"])) == r["text"])
    return {"identical": same, "total": len(a),
            "identical_first_turn": same_first, "first_turn_total": len(first_turn)}


def _run_all(systems: list[str], trace: str, opts: dict, isolate: bool, save=None) -> dict:
    """Run each system in turn; `save(results)` after each one, so a long run keeps what it has."""
    results = {}
    for system in systems:
        if isolate:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                results[system] = pool.submit(run_system, system, trace, opts).result()
        else:
            results[system] = run_system(system, trace, opts)
        if save is not None:
            save(results)
    return results


# What a run replayed, saved in its JSON; --from-json reports saved runs with their own values.
META_KEYS = ("trace", "model", "streams", "arrivals", "threads", "history", "prewarm",
             "recent_window")


def _meta(args, trace) -> dict:
    return {"trace": args.trace, "model": args.model, "streams": len(trace.streams),
            "arrivals": getattr(args, "arrivals", "ignore"), "threads": getattr(args, "threads", None),
            "history": getattr(args, "history", "generated"),
            "prewarm": getattr(args, "prewarm", False),
            "recent_window": getattr(args, "recent_window", None)}


def _payload(meta: dict, results: dict, cmp_rows=None, same=None) -> dict:
    return {
        "bench": "trace", **meta,
        "complete": cmp_rows is not None,
        "rows": [r["row"] for r in results.values()], "comparisons": cmp_rows,
        "edge_vs_fp16kv_identical": same,
        "records": {s: r["records"] for s, r in results.items()},
        "kv_timeline": {s: r["kv_timeline"] for s, r in results.items()},
    }


def print_report(results: dict[str, dict],
                 streams: int | None = None) -> tuple[list[dict], dict | None]:
    """streams: how many streams the trace replayed (the batch-1 targets hold only for one)."""
    rows = [res["row"] for res in results.values()]
    print(markdown_table(rows, COLUMNS))
    print()
    print(markdown_table(rows, [COLUMNS[0], *JTOP_COLUMNS]))
    if all(r.get("jtop", "").startswith("unavailable") for r in rows):
        print(f"(jtop columns {rows[0]['jtop']})")
    cmp_rows = compare({r["system"]: r for r in rows}, streams)
    if cmp_rows:
        print()
        print(markdown_table(cmp_rows, [
            Column("comparison", "comparison"), Column("ratio", "ratio", "{:.3f}"),
            Column("target", "target"),
            Column("pass", "met", lambda v: "yes" if v else "NO", "n/a"),
        ]))
    _print_later_turns({r["system"]: r for r in rows})
    same = None
    if "edge" in results and "edge-fp16kv" in results:
        same = identical_answers(results["edge"]["records"], results["edge-fp16kv"]["records"])
        print(f"\nedge (int8 KV) answers identical to edge-fp16kv: {same['identical']}/{same['total']}"
              f" (first turns, same prompts: {same['identical_first_turn']}/"
              f"{same['first_turn_total']})")
    if "hf" in results:
        parts = []
        for system in results:
            if system != "hf":
                m = identical_answers(results[system]["records"], results["hf"]["records"])
                parts.append(f"{system} {m['identical']}/{m['total']}")
        if parts:
            print("answers identical to hf (fp32 transformers, greedy): " + ", ".join(parts))
    return cmp_rows, same


def _print_later_turns(rows: dict[str, dict]) -> None:
    """Where the TTFT tail comes from: p95 without each stream's first turn (not a target)."""
    edge, noshare = rows.get("edge", {}), rows.get("edge-noshare", {})
    a, b = edge.get("ttft_p95_later_turns_s"), noshare.get("ttft_p95_later_turns_s")
    if a is None or b is None:
        return
    print(f"\nTTFT p95 of later turns (each stream's first turn, its cold start, left out; "
          f"informational, not a target): edge {a * 1e3:.1f} ms, edge-noshare {b * 1e3:.1f} ms, "
          f"ratio {ratio(a, b):.3f}")


def load_results(paths: str) -> tuple[dict[str, dict], dict]:
    """(results, what was replayed) of earlier runs (their --json files), later files overriding
    earlier systems; the replay settings are the first file's (a note names any that differ)."""
    import json
    from pathlib import Path

    names = [p.strip() for p in paths.split(",") if p.strip()]
    if not names:
        raise InputError("--from-json needs the --json file(s) of earlier runs, comma-separated")
    results: dict[str, dict] = {}
    meta: dict | None = None
    for name in names:
        path = Path(name)
        if path.is_dir():
            raise InputError(f"--from-json: {path} is a folder; give the --json file of an "
                             "earlier bench trace run")
        if not path.is_file():
            raise InputError(f"--from-json: {path} does not exist")
        try:
            data = json.loads(path.read_text())
            if data.get("bench", "trace") != "trace":
                raise InputError(f"--from-json: {path} holds a bench {data['bench']} run, not a "
                                 "bench trace run")
            saved = {k: data.get(k) for k in META_KEYS}
            if meta is None:
                meta = saved
            elif saved != meta:
                differ = ", ".join(k for k in META_KEYS if saved[k] != meta[k])
                print(f"note: {path} was replayed with other settings than {names[0]} ({differ}); "
                      f"the report names {names[0]}'s", file=sys.stderr)
            for row in data["rows"]:
                system = row["system"]
                results[system] = {"row": row, "records": data["records"][system],
                                   "kv_timeline": data["kv_timeline"][system]}
                results[system]["ttft_s"] = [r["ttft_s"] for r in results[system]["records"]
                                             if r["ttft_s"] is not None]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
            raise InputError(f"--from-json: {path} is not a bench trace JSON file ({exc!r})") from exc
    if not results:
        raise InputError(f"--from-json: {', '.join(names)} hold(s) no runs (no rows)")
    return results, meta


def run(args) -> int:
    if args.target:
        parse_target(args.target)  # a bad scheme is refused here, not as a KeyError after loading
    if args.from_json is not None:
        results, meta = load_results(args.from_json)
        return _report(args, meta, results)
    if not args.trace:
        raise InputError("--trace is required (the JSON-lines trace to replay; "
                         "tools/gen_trace.py writes one)")
    systems = [args.target] if args.target else parse_systems(args.systems)
    check_min(args, num_pages=1, page_tokens=1, recent_window=0)

    trace = load_trace(args.trace).limit_streams(args.streams)
    if not args.target:
        _check_engine_sizes(args, systems)
    print(f"[bench trace] {trace.name}: {len(trace.streams)} streams, {trace.num_requests} requests;"
          f" systems {', '.join(systems)}", file=sys.stderr, flush=True)
    opts = {"model": args.model, "streams": args.streams, "arrivals": args.arrivals,
            "history": args.history, "prewarm": args.prewarm,
            "target_model": args.target_model, "page_tokens": args.page_tokens,
            "num_pages": args.num_pages, "threads": args.threads,
            "recent_window": args.recent_window, "device": args.device, "backend": args.backend}
    meta = _meta(args, trace)
    if any(s != "hf" for s in systems) and not args.target:
        meta["edge_backend"] = describe_backend(args.device, args.backend)
    save = (lambda res: write_json(args.json, _payload(meta, res))) if args.json else None
    results = _run_all(systems, args.trace, opts, isolate=not args.no_isolate, save=save)
    return _report(args, meta, results)


def _check_engine_sizes(args, systems: list[str]) -> None:
    """The edge systems' KV pool and recent-key windows fit in memory and the model's context,
    checked from the model's config before any system loads."""
    from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch
    # start-up time: imports torch
    from edge_runtime.model.loader import read_model_config, resolve_model_folder

    edge = [s for s in systems if s != "hf"]
    if not edge:
        return
    if args.recent_window:
        check_context(args.model, args.recent_window, "--recent-window")
    config = read_model_config(resolve_model_folder(args.model, progress=None))
    page_tokens = args.page_tokens or EngineConfig.page_tokens
    dtype = "fp16" if "edge-fp16kv" in edge else "int8"
    check_fits_in_memory(args.num_pages * page_tokens * kv_bytes_per_token(config, dtype),
                         f"--num-pages {args.num_pages} of {page_tokens} tokens ({dtype} KV)")


def _shape(results: dict[str, dict]) -> str:
    """"5 streams x 12 turns", or the spread when the streams' turn counts differ."""
    from collections import Counter

    per_stream = Counter(r["stream"] for r in next(iter(results.values()))["records"])
    counts = sorted(set(per_stream.values())) or [0]
    if len(counts) == 1:
        return f"{len(per_stream)} streams x {counts[0]} turns"
    return (f"{len(per_stream)} streams, {sum(per_stream.values())} requests "
            f"({counts[0]}-{counts[-1]} turns per stream)")


def _report(args, meta: dict, results: dict[str, dict]) -> int:
    print(f"trace {meta['trace']}: {_shape(results)}, model {meta['model']}, greedy")
    cmp_rows, same = print_report(results, meta.get("streams"))
    if args.json:
        write_json(args.json, _payload(meta, results, cmp_rows, same))
    if args.plot:
        from pathlib import Path

        plot_trace(args.plot, results,
                   title=f"{Path(str(meta['trace'])).stem}: {meta['streams']} streams")
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("trace", help="closed-loop multi-stream trace replay vs baselines")
    p.add_argument("--trace", help="JSONL trace (tools/gen_trace.py); required unless --from-json")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                   help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    p.add_argument("--streams", type=int, default=None, help="replay only the first N streams")
    p.add_argument("--target", help="unix:PATH or http://HOST:PORT of an OpenAI-compatible server "
                                    "(replaces --systems)")
    p.add_argument("--target-model", default=None,
                   help="model name sent to --target (default: the first of its GET /v1/models)")
    p.add_argument("--arrivals", choices=ARRIVALS, default="ignore",
                   help="ignore arrival_s (pure closed loop, all streams start at 0), honour it for "
                        "each stream's first turn only (staggered starts), or for all turns")
    p.add_argument("--history", choices=HISTORIES, default="generated",
                   help="what later turns carry: the answers generated (default) or the trace's "
                        "scripted answers (identical prompts on every system)")
    p.add_argument("--prewarm", action="store_true",
                   help="before the timed replay, send each system prompt once (1 token), as a "
                        "voice appliance would at start-up")
    p.add_argument("--page-tokens", type=int, default=None,
                   help="override the engine's page size (default: the engine's)")
    p.add_argument("--num-pages", type=int, default=32, help="KV pool size of the edge systems")
    p.add_argument("--recent-window", type=int, default=None, metavar="W",
                   help="int8 systems: positions per sequence read exact (default: the engine's; "
                        "0: off; kv/recent_window.py)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads in every edge system, fixed (default: the cores other "
                        "programs leave free, re-checked every second)")
    p.add_argument("--no-isolate", action="store_true",
                   help="run every system in this process (faster; peak RSS then accumulates)")
    p.add_argument("--from-json", help="comma-separated --json files of earlier runs: report them "
                                       "together (no replay)")
    p.add_argument("--json", help="write rows, comparisons and per-request records here")
    p.add_argument("--plot", help="write a PNG of TTFT distributions and KV bytes over time")
    add_placement_arguments(p)
    p.set_defaults(func=run)
