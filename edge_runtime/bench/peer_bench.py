"""`edge-runtime bench peer`: edge-runtime's service against llama.cpp's `llama-server` on the same GGUF
file and traces, interleaved in one run, on a quiet machine and with busy processes taking cores.

Method: for each round, each load condition (`--busy 0,1`: that many spinning processes, bench/busy.py,
run during the replay only) and each trace, both servers run in turn (the order alternates per
round), each started fresh (no prefix cached from an earlier replay) and stopped after its replay.
The replay is `bench trace`'s closed loop (bench/replay.py) through the OpenAI streaming client
(bench/http_client.py). Per run: requests/s, TTFT p50/p95, TPOT p50 and the server's peak RSS (its
VmHWM, start-up included). The report takes medians over rounds and the ratios the issue sets:
edge/llama.cpp requests/s >= 1.5 and TTFT p95 <= 0.5 per trace and condition, and edge's busy/quiet
requests/s >= 0.45 (llama.cpp's shown beside it).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from edge_runtime.bench.report import Column, fmt_mib, fmt_ms, markdown_table, write_json
from edge_runtime.bench.stats import ratio
from edge_runtime.errors import InputError
from edge_runtime.bench.busy import BusyLoad
from edge_runtime.bench.peer_servers import ServerProcess, edge_spec, free_port, llama_spec
from edge_runtime.bench.trace_worker import run_system

DEFAULT_TRACES = "tools/traces/voice-home-5x12.jsonl,tools/traces/voice-car-5x12.jsonl"
SYSTEMS = ("edge", "llama.cpp")
METRICS = ("requests_per_s", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "peak_rss_bytes")
# (name, row key, how to read, bound): edge / llama.cpp in the same trace and condition
PEER_TARGETS = [("requests/s", "requests_per_s", ">=", 1.5), ("TTFT p95", "ttft_p95_s", "<=", 0.5)]
BUSY_KEEPS = 0.45  # edge's busy requests/s over its quiet requests/s

COLUMNS = [
    Column("trace", "trace"), Column("busy", "busy"), Column("system", "system"),
    Column("runs", "runs"), Column("requests_per_s", "req/s", "{:.3f}"),
    Column("ttft_p50_s", "TTFT p50 ms", fmt_ms), Column("ttft_p95_s", "TTFT p95 ms", fmt_ms),
    Column("tpot_p50_s", "TPOT p50 ms", fmt_ms), Column("peak_rss_bytes", "peak RSS MiB", fmt_mib),
]


def parse_busy(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 0 for c in counts):
        raise InputError(f"--busy takes comma-separated counts of spinning processes (e.g. 0,1), "
                         f"got {text!r}")
    return counts


def check_paths(args) -> tuple[Path, Path, list[str]]:
    """(llama-server binary, GGUF file, trace paths), each checked to exist."""
    if not args.llama_server:
        raise InputError("--llama-server PATH is required: the llama.cpp server binary to compare "
                         "with (tools/build_llama_server.sh builds one outside the repository)")
    binary = Path(args.llama_server)
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise InputError(f"--llama-server {binary} is not an executable file; build it with "
                         "tools/build_llama_server.sh")
    gguf = _gguf_file(args.gguf)
    if gguf is None:
        raise InputError(f"--gguf {args.gguf} is not a .gguf file nor the name of one "
                         "(`edge-runtime models` lists the names)")
    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    missing = [t for t in traces if not Path(t).is_file()]
    if not traces or missing:
        raise InputError(f"--traces: {', '.join(missing) or '(none given)'} not found; give "
                         "JSON-lines traces (tools/traces/*.jsonl)")
    return binary, gguf, traces


def _gguf_file(name_or_path: str | None) -> Path | None:
    """The .gguf file of a path or a model name (model/model_names.py), the built-in by default."""
    from edge_runtime.model.loader import DEFAULT_MODEL, gguf_source  # start-up time: imports torch

    return gguf_source(name_or_path or DEFAULT_MODEL)


def _specs(args, binary: Path, gguf: Path, workdir: Path) -> dict:
    return {"edge": edge_spec(gguf, str(workdir / "edge.sock"), args.edge_config, args.edge_arg),
            "llama.cpp": llama_spec(binary, gguf, free_port(), args.np, args.np * args.slot_context,
                                    args.llama_arg)}


def run_one(spec, trace: str, busy: int, opts: dict, log: Path) -> dict:
    """Start `spec`'s server, replay `trace` with `busy` spinning processes, stop it: its row."""
    with ServerProcess(spec, log, ready_timeout_s=opts["ready_timeout_s"]) as server:
        load_before = os.getloadavg()[0]
        with BusyLoad(busy):
            result = run_system(spec.target, trace, opts)
        row = result["row"]
        row.update(system=spec.name, trace=Path(trace).stem, busy=busy,
                   peak_rss_bytes=server.peak_rss_bytes, load_before=load_before,
                   load_after=os.getloadavg()[0])
    return row


def _progress(msg: str) -> None:
    print(f"[bench peer] {msg}", file=sys.stderr, flush=True)


def run_rounds(args, specs: dict, traces: list[str], busy: list[int], workdir: Path, save) -> list:
    opts = {"streams": args.streams, "ready_timeout_s": args.ready_timeout, "target_model": None}
    rows = []
    for r in range(args.rounds):
        order = list(SYSTEMS) if r % 2 == 0 else list(reversed(SYSTEMS))
        for b in busy:
            for trace in traces:
                for name in order:
                    _progress(f"round {r + 1}/{args.rounds}, busy {b}, {Path(trace).stem}: {name}")
                    row = run_one(specs[name], trace, b, opts, workdir / f"{name}.log")
                    rows.append({**row, "round": r})
                    save(rows)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Medians over rounds per (trace, busy, system)."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["trace"], row["busy"], row["system"]), []).append(row)
    out = []
    for (trace, busy, system), runs in groups.items():
        med = {}
        for key in METRICS:
            values = [r[key] for r in runs if r.get(key) is not None]
            med[key] = statistics.median(values) if values else None
        out.append({"trace": trace, "busy": busy, "system": system, "runs": len(runs), **med})
    return out


def compare(summary: list[dict]) -> list[dict]:
    """The issue's ratios: edge over llama.cpp per trace and condition, busy over quiet per system."""
    by = {(s["trace"], s["busy"], s["system"]): s for s in summary}
    out = []
    for trace, busy in sorted({(s["trace"], s["busy"]) for s in summary}):
        edge, peer = by.get((trace, busy, "edge")), by.get((trace, busy, "llama.cpp"))
        if edge is None or peer is None:
            continue
        for name, key, op, bound in PEER_TARGETS:
            r = ratio(edge[key], peer[key])
            out.append(_target(f"{trace} busy {busy}: edge/llama.cpp {name}", r, op, bound))
    for trace, busy, system in sorted(by):
        quiet = by.get((trace, 0, system))
        if busy == 0 or quiet is None:
            continue
        r = ratio(by[(trace, busy, system)]["requests_per_s"], quiet["requests_per_s"])
        bound = BUSY_KEEPS if system == "edge" else None
        out.append(_target(f"{trace}: {system} busy {busy}/quiet requests/s", r, ">=", bound))
    return out


def _target(name: str, r, op: str, bound) -> dict:
    ok = None if r is None or bound is None else (r >= bound if op == ">=" else r <= bound)
    return {"comparison": name, "ratio": r, "target": f"{op} {bound:.3g}" if bound else "(shown)",
            "pass": ok}


def report(summary: list[dict], cmp_rows: list[dict]) -> None:
    print(markdown_table(summary, COLUMNS))
    print()
    print(markdown_table(cmp_rows, [
        Column("comparison", "comparison"), Column("ratio", "ratio", "{:.3f}"),
        Column("target", "target"), Column("pass", "met", lambda v: "yes" if v else "NO", "n/a")]))


def run(args) -> int:
    busy = parse_busy(args.busy)
    if args.rounds < 1 or args.np < 1 or args.slot_context < 64:
        raise InputError("--rounds and --np must be at least 1, --slot-context at least 64")
    binary, gguf, traces = check_paths(args)
    workdir = Path(tempfile.mkdtemp(prefix="edge-bench-peer-"))
    specs = _specs(args, binary, gguf, workdir)
    meta = {"bench": "peer", "gguf": str(gguf), "gguf_bytes": gguf.stat().st_size,
            "traces": traces, "busy": busy, "rounds": args.rounds, "streams": args.streams,
            "commands": {n: s.command for n, s in specs.items()}, "logs": str(workdir)}
    _progress(f"{len(traces)} trace(s) x busy {busy} x {args.rounds} round(s) x 2 servers; "
              f"server logs in {workdir}")
    save = (lambda rows: write_json(args.json, {**meta, "complete": False, "runs": rows})) \
        if args.json else (lambda rows: None)
    rows = run_rounds(args, specs, traces, busy, workdir, save)
    summary = summarize(rows)
    cmp_rows = compare(summary)
    print(f"GGUF {gguf} ({gguf.stat().st_size / 2**20:.1f} MiB); medians of {args.rounds} "
          f"round(s); load average now {os.getloadavg()[0]:.2f}")
    report(summary, cmp_rows)
    if args.json:
        write_json(args.json, {**meta, "complete": True, "runs": rows, "summary": summary,
                               "comparisons": cmp_rows})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("peer", help="edge-runtime serve vs llama.cpp's llama-server on one GGUF "
                                           "and trace, interleaved, quiet and busy")
    p.add_argument("--llama-server", help="path of the llama-server binary "
                                          "(tools/build_llama_server.sh builds it)")
    p.add_argument("--gguf", help="the GGUF both servers serve: a path or a model name "
                   "(`edge-runtime models`; default: the built-in SmolLM2 Q4_1)")
    p.add_argument("--traces", default=DEFAULT_TRACES, help="comma-separated JSON-lines traces")
    p.add_argument("--busy", default="0,1",
                   help="comma-separated load conditions: spinning processes during the replay")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    p.add_argument("--streams", type=int, default=None, help="replay only the first N streams")
    p.add_argument("--np", type=int, default=5, help="llama-server parallel slots (-np)")
    p.add_argument("--slot-context", type=int, default=2048,
                   help="llama-server context tokens per slot (-c is np x this)")
    p.add_argument("--edge-config", default="cpu-dev", help="budget for edge-runtime serve --config")
    p.add_argument("--edge-arg", action="append", default=[],
                   help="extra argument for edge-runtime serve (repeat for several)")
    p.add_argument("--llama-arg", action="append", default=[],
                   help="extra argument for llama-server, e.g. --llama-arg=-t --llama-arg=2")
    p.add_argument("--ready-timeout", type=float, default=300.0,
                   help="seconds a server may take to load")
    p.add_argument("--json", help="write every run, the medians and the ratios here")
    p.set_defaults(func=run)
