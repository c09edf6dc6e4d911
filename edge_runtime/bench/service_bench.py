"""`edge-runtime bench service`: tokens/s of the Unix-socket service vs the in-process engine.

The same workload runs twice: N concurrent streams (default 5, the voice reference), each sending
R chat requests one after another (shared system prompt, greedy, ignore_eos so every request
generates exactly --max-tokens tokens):
  in-process: AsyncEngine.stream() in this process (what the voice loop does);
  service:    `edge-runtime serve` in a child process on a temporary Unix socket, streamed over
              HTTP/SSE with aiohttp (what a local client does).
Each mode gets one warm-up round, then rounds alternate between the modes (never at the same
time: they would share the CPU). Overhead = 1 - median service tok/s / median in-process tok/s.
On a shared machine wall-clock tok/s drifts with other load, so each round also records CPU time
(the server's plus the client's, vs this process's) per generated token: a steadier view of what
the HTTP layer costs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

from edge_runtime.import_path import module_argv
from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.bench.checks import check_min
from edge_runtime.bench.report import Column, fmt_ms, fmt_num, machine_info, markdown_table, write_json
from edge_runtime.bench.stats import percentile
from edge_runtime.engine.api import SamplingParams
from edge_runtime.guard_config import GuardConfig
from edge_runtime.model.chat import encode_messages
from edge_runtime.service.sections import load_sections

SYSTEM = "You are the voice assistant of a car. Answer in one short sentence."
QUESTIONS = ["Turn on the lights.", "What is the weather like?", "Play some jazz.",
             "Navigate home.", "Call my sister.", "Open the window.", "Set a timer.",
             "How far is the next charger?"]


def _messages(stream: int, turn: int) -> list[dict]:
    q = QUESTIONS[(stream + turn) % len(QUESTIONS)]
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"(stream {stream}, turn {turn}) {q}"}]


async def _workload(one, streams: int, turns: int) -> dict:
    """Run `one(stream, turn) -> (tokens, ttft_s)` for every stream concurrently."""
    async def stream(s):
        return [await one(s, t) for t in range(turns)]

    t0 = time.perf_counter()
    per_stream = await asyncio.gather(*(stream(s) for s in range(streams)))
    wall = time.perf_counter() - t0
    done = [r for rs in per_stream for r in rs]
    tokens = sum(n for n, _ in done)
    return {"requests": len(done), "gen_tokens": tokens, "wall_s": wall,
            "tok_per_s": tokens / wall, "mean_ttft_s": sum(t for _, t in done) / len(done)}


class _InProcess:
    """AsyncEngine in this process, built exactly as the server builds it."""

    mode = "in-process"

    def __init__(self, args) -> None:
        from edge_runtime.service.engine_setup import load_all  # optional library: aiohttp

        limits, _ = load_sections(args.config)
        self.loaded = load_all(args.model, args.config, limits, GuardConfig(enabled=False),
                               args.device, args.backend)
        self.params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    async def one(self, s: int, t: int) -> tuple[int, float]:
        ids = encode_messages(self.loaded.model.tokenizer, _messages(s, t))
        t0, ttft, n = time.perf_counter(), None, 0
        async for ev in self.loaded.aengine.stream(ids, self.params):
            if ttft is None and ev.token_ids:
                ttft = time.perf_counter() - t0
            if ev.result is not None:
                n = ev.result.generated_tokens
        return n, ttft or 0.0

    def cpu_seconds(self) -> float:
        return time.process_time()  # this process: engine thread + the asyncio client

    def close(self) -> None:
        self.loaded.aengine.shutdown()


class _Service:
    """`edge-runtime serve` in a child process, streamed over its Unix socket."""

    mode = "service"

    def __init__(self, args) -> None:
        tmp = tempfile.mkdtemp(prefix="edge-bench-service-")
        self.sock = os.path.join(tmp, "api.sock")
        cmd = module_argv("edge_runtime", "serve", "--socket", self.sock,
                          "--model", args.model, "--device", args.device) + (["--config", args.config] if args.config else [])
        cmd += ["--backend", args.backend] if args.backend else []
        self.log = open(os.path.join(tmp, "serve.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.body = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
                     "stream": True, "stream_options": {"include_usage": True}}
        _wait_ready(self.proc, self.sock, self.log.name)

    async def one(self, s: int, t: int) -> tuple[int, float]:
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=self.sock)) as ses:
            t0, ttft, n = time.perf_counter(), None, 0
            async with ses.post("http://localhost/v1/chat/completions",
                                json=dict(self.body, messages=_messages(s, t))) as r:
                assert r.status == 200, await r.text()
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if ttft is None and chunk["choices"] and \
                            chunk["choices"][0]["delta"].get("content"):
                        ttft = time.perf_counter() - t0
                    if chunk.get("usage"):
                        n = chunk["usage"]["completion_tokens"]
        return n, ttft or 0.0

    def cpu_seconds(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return time.process_time() + t.user + t.system  # the client here + the server there

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def _measure(args) -> list[dict]:
    """Warm both, then alternate rounds (in-process, service, ...) so drifting load on a shared
    machine hits both modes alike; only one mode runs at a time."""
    _progress("starting the service (child process) and loading the in-process engine")
    modes = [_InProcess(args)]
    try:
        modes.append(_Service(args))
        for m in modes:
            _progress(f"{m.mode}: warm-up round")
            asyncio.run(_workload(m.one, args.streams, 1))
        rows = []
        for i in range(args.repeat):
            for m in modes:
                _progress(f"{m.mode}: round {i + 1}/{args.repeat} ({args.streams} streams x "
                          f"{args.turns} requests x {args.max_tokens} tokens)")
                cpu0 = m.cpu_seconds()
                row = asyncio.run(_workload(m.one, args.streams, args.turns))
                row["cpu_s"] = m.cpu_seconds() - cpu0
                row["cpu_ms_per_token"] = 1000 * row["cpu_s"] / max(row["gen_tokens"], 1)
                rows.append(dict(row, mode=m.mode, round=i + 1, streams=args.streams))
        return rows
    finally:
        for m in modes:
            m.close()


def _wait_ready(proc, sock: str, log_path: str, timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}: {open(log_path).read()}")
        if os.path.exists(sock):
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=2) as c:
                    if c.get("http://localhost/health").json().get("status") == "ready":
                        return
            except httpx.HTTPError:
                pass
        time.sleep(0.3)
    raise RuntimeError(f"serve not ready after {timeout} s")


def _progress(msg: str) -> None:
    print(f"bench service: {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    check_min(args, streams=1, turns=1, max_tokens=1, repeat=1)
    rows = _measure(args)

    median = {m: percentile([r["tok_per_s"] for r in rows if r["mode"] == m], 50)
              for m in ("in-process", "service")}
    overhead = 1.0 - median["service"] / median["in-process"]
    cpu = {m: percentile([r["cpu_ms_per_token"] for r in rows if r["mode"] == m], 50)
           for m in ("in-process", "service")}
    cpu_overhead = cpu["service"] / cpu["in-process"] - 1.0
    for r in rows:
        r["vs_in_process"] = r["tok_per_s"] / median["in-process"] - 1.0
    cols = [Column("mode", "mode"), Column("round", "round"), Column("streams", "streams"),
            Column("requests", "requests"), Column("gen_tokens", "gen tokens"),
            Column("wall_s", "wall s", fmt_num(2)), Column("tok_per_s", "tok/s", fmt_num(1)),
            Column("mean_ttft_s", "mean TTFT ms", fmt_ms),
            Column("cpu_ms_per_token", "CPU ms/token", fmt_num(1)),
            Column("vs_in_process", "vs median in-process", lambda v: f"{100 * v:+.1f}%")]
    print(markdown_table(rows, cols))
    print(f"\nservice overhead (median round vs median round): {100 * overhead:.1f}% of "
          f"tokens/s (target < 10%)")
    print(f"service CPU cost (median CPU ms per generated token, server + client vs engine + "
          f"client): {100 * cpu_overhead:+.1f}%")
    if args.json:
        write_json(args.json, {"bench": "service", "model": args.model, "config": args.config,
                               "max_tokens": args.max_tokens, "turns": args.turns,
                               "median_tok_per_s": median,
                               "median_cpu_ms_per_token": cpu, "cpu_overhead": cpu_overhead,
                               "overhead": overhead, "rows": rows,
                               "machine": machine_info()})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("service", help="tokens/s over the Unix-socket service vs in-process")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--config", default="cpu-dev", help="budget name or YAML (pool, limits)")
    p.add_argument("--streams", type=int, default=5)
    p.add_argument("--turns", type=int, default=3, help="requests per stream, one after another")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", help="write every round and the machine description here")
    add_placement_arguments(p)
    p.set_defaults(func=run)
