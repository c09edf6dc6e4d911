"""One measured memory-pressure episode in a memory cgroup: guard state, pool bytes, RSS, requests.

  sudo .venv/bin/python tools/pressure_episode.py --model M [--json OUT]

This process makes a child of its memory cgroup (tools/lab/cgroup_sandbox.py) and enters it before
the model loads, so the engine's memory is charged there; the limit is then set so that the idle
working set is `idle_fraction` of it. Closed-loop clients (one request after another) keep the
engine busy while, phase by phase:
  baseline       nothing added
  page_cache     a child process reads a file of `cache_fraction` x the limit once and keeps it
                 (written first with its cache dropped, so the read charges clean, inactive page
                 cache to our cgroup: the guard must stay ok and retire nothing)
  anon_high      a child allocates anonymous memory in steps of `step_fraction` x the limit
                 until the guard reads high, then holds it
  anon_critical  more, until critical, then holds it
  recovery       the child exits; until the guard is back to ok with the pool regrown
then the clients stop and every request they sent must have an answer. The guard polls every
`poll_s` (its own GuardConfig otherwise, with a pause bound longer than the episode: a refusal
would count as an answer, not as a loss). Every poll is a timeline row (`rows`); `summary`
holds per-phase peaks and totals. Exit status 0 when nothing was lost and each phase did what
it should, 1 otherwise, 3 when no memory cgroup can be made here (the reason is printed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.guard.engine_hooks import EngineGuardHooks
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import ProcMeminfoSource
from edge_runtime.guard_config import GuardConfig
from edge_runtime.import_path import code_argv
from lab.cgroup_sandbox import CgroupUnavailable, ChildCgroup  # tools/ is sys.path[0]
from lab.episode_load import ClosedLoopClients, Hog, rss_bytes

MIB = 1 << 20
STATE_RANK = {"ok": 0, "high": 1, "critical": 2}


@dataclass(frozen=True)
class EpisodeConfig:
    model: str
    num_pages: int = 1500
    clients: int = 4
    max_tokens: int = 16
    prompt_tokens: int = 600
    shared_tokens: int = 0  # a common prefix of every prompt (a system prompt); 0: all unique
    phase_s: float = 3.0  # how long each phase holds once reached
    poll_s: float = 0.2
    idle_fraction: float = 0.55  # idle working set / limit
    cache_fraction: float = 1.5  # page cache written and read, x the limit
    step_fraction: float = 0.02  # anonymous memory per step, x the limit
    timeout_s: float = 300.0


class Episode:
    def __init__(self, cfg: EpisodeConfig, cgroup: ChildCgroup) -> None:
        from edge_runtime.engine.config import EngineConfig  # start-up time: imports torch
        from edge_runtime.engine.engine import Engine  # start-up time: imports numpy, torch

        self.cfg, self.cgroup = cfg, cgroup
        placement = resolve("auto")
        self.engine = Engine(load_for(cfg.model, placement),
                             EngineConfig(num_pages=cfg.num_pages, max_num_seqs=cfg.clients,
                                          **placement.engine_settings()))
        self.clients = ClosedLoopClients(self.engine, cfg.clients, cfg.max_tokens,
                                         cfg.prompt_tokens, cfg.shared_tokens)
        self.rows: list[dict] = []
        self.t0 = time.monotonic()

    def start_guard(self) -> None:
        self.clients.warm_up()
        source = ProcMeminfoSource()
        idle = source.read().cgroup.working_set_bytes
        self.limit = int(idle / self.cfg.idle_fraction)
        self.cgroup.set_limit(self.limit)
        self.hooks = EngineGuardHooks(self.engine)
        self.guard = MemoryGuard(GuardConfig(poll_interval_s=self.cfg.poll_s,
                                             max_admission_pause_s=self.cfg.timeout_s),
                                 source, self.hooks)
        self.clients.start()

    def poll(self, phase: str, hog_bytes: int = 0) -> str:
        state = self.guard.poll()
        s = self.guard.last_sample
        e = self.engine
        in_service = sum(b - a for a, b in e.pool_chunks.ranges) - sum(
            b - a for a, b in e.pool_chunks.retired)
        self.rows.append({
            "t_s": round(time.monotonic() - self.t0, 2), "phase": phase, "state": state,
            "used_fraction": round(s.used_fraction, 4),
            "working_set_bytes": s.cgroup.working_set_bytes, "usage_bytes": s.cgroup.usage_bytes,
            "inactive_file_bytes": s.cgroup.inactive_file_bytes,
            "pool_bytes": e.storage.pool.nbytes() * in_service // e.num_pages,
            "rss_bytes": rss_bytes(), "hog_bytes": hog_bytes, **self.clients.counts(),
            **{k: self.guard.action_counts.get(k, 0) for k in (
                "chunks_released", "chunks_regrown", "preempted", "requests_refused")},
        })
        time.sleep(self.cfg.poll_s)
        return state

    def hold(self, phase: str, seconds: float, hog_bytes: int = 0) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll(phase, hog_bytes)

    def run(self) -> None:
        cfg = self.cfg
        self.start_guard()
        self.hold("baseline", cfg.phase_s)
        reader = subprocess.Popen(code_argv(CACHE_SCRIPT,
                                             str(int(self.limit * cfg.cache_fraction))),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        while not reader.stdout.readline():  # "read" once the file has been read
            assert reader.poll() is None, "the page-cache reader failed"
        self.hold("page_cache", cfg.phase_s)
        reader.communicate("", timeout=60)  # it deletes the file and exits
        with Hog(int(self.limit * cfg.step_fraction)) as hog:
            for phase, target in (("anon_high", "high"), ("anon_critical", "critical")):
                deadline = time.monotonic() + cfg.timeout_s
                while STATE_RANK[self.poll(phase, hog.bytes)] < STATE_RANK[target]:
                    assert time.monotonic() < deadline, f"{phase}: never reached {target}"
                    hog.grow()
                self.hold(phase, cfg.phase_s, hog.bytes)
        deadline = time.monotonic() + cfg.timeout_s
        while self.poll("recovery") != "ok" or self.engine.pool_chunks.retired:
            assert time.monotonic() < deadline, "recovery: the guard never returned to ok"
        self.hold("recovery", cfg.phase_s)
        self.clients.stop()

    def summary(self) -> dict:
        phases = {}
        for r in self.rows:
            p = phases.setdefault(r["phase"], {"first": r, "last": r, "max_state": "ok",
                                               "max_used_fraction": 0.0})
            p["last"] = r
            if STATE_RANK[r["state"]] > STATE_RANK[p["max_state"]]:
                p["max_state"] = r["state"]
            p["max_used_fraction"] = max(p["max_used_fraction"], r["used_fraction"])
        out = {name: {"max_state": p["max_state"], "max_used_fraction": p["max_used_fraction"],
                      "chunks_released": p["last"]["chunks_released"] - p["first"]["chunks_released"],
                      "seconds": round(p["last"]["t_s"] - p["first"]["t_s"], 2)}
               for name, p in phases.items()}
        rss = [r["rss_bytes"] for r in self.rows]
        totals = self.clients.counts()
        return {"limit_bytes": self.limit, "phases": out, "requests": totals,
                "lost": totals["sent"] - totals["answered"],
                "rss_start_bytes": rss[0], "rss_min_bytes": min(rss), "rss_end_bytes": rss[-1],
                "guard_actions": dict(self.guard.action_counts),
                "pool_bytes_released": self.hooks.released_bytes}


CACHE_SCRIPT = """
import os, sys
size, path = int(sys.argv[1]), f"/tmp/edge-pressure-cache-{os.getpid()}"
block = os.urandom(1 << 20)
try:
    with open(path, "wb") as f:
        for i in range(size >> 20):
            f.write(block)
            if i % 64 == 63:  # written, synced and dropped as it goes: only the read is charged
                f.flush(); os.fsync(f.fileno())
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        f.flush(); os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    with open(path, "rb") as f:  # read once: clean, inactive file pages
        while f.read(1 << 20):
            pass
    print("read", flush=True)
    sys.stdin.read()
finally:
    os.unlink(path)
"""


def verdict(summary: dict) -> list[str]:
    """What went wrong ([] when the episode shows what the guard must do)."""
    p = summary["phases"]
    problems = []
    if p["page_cache"]["max_state"] != "ok" or p["page_cache"]["chunks_released"]:
        problems.append(f"page cache moved the guard: {p['page_cache']}")
    if p["anon_high"]["max_state"] == "ok" or p["anon_critical"]["max_state"] != "critical":
        problems.append("anonymous memory did not reach high and critical")
    if not summary["guard_actions"].get("chunks_released"):
        problems.append("no pool chunk was returned")
    if summary["lost"] or summary["requests"]["errors"]:
        problems.append(f"requests lost or failed: {summary['requests']}")
    return problems


def format_rows(rows: list[dict]) -> str:
    head = ("t_s", "phase", "state", "used", "ws MiB", "cache MiB", "pool MiB", "RSS MiB",
            "hog MiB", "done", "run", "wait")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    last = None
    for r in rows:
        key = (r["phase"], r["state"], r["chunks_released"], r["chunks_regrown"])
        if key == last and r is not rows[-1]:
            continue
        last = key
        lines.append(" | ".join(str(x) for x in (
            r["t_s"], r["phase"], r["state"], f"{r['used_fraction']:.3f}",
            r["working_set_bytes"] // MIB, r["inactive_file_bytes"] // MIB,
            r["pool_bytes"] // MIB, r["rss_bytes"] // MIB, r["hog_bytes"] // MIB,
            r["answered"], r["running"], r["waiting"])))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/pressure_episode.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model name or folder (a small one)")
    p.add_argument("--num-pages", type=int, default=EpisodeConfig.num_pages)
    p.add_argument("--clients", type=int, default=EpisodeConfig.clients)
    p.add_argument("--phase-s", type=float, default=EpisodeConfig.phase_s)
    p.add_argument("--shared-tokens", type=int, default=0,
                   help="tokens every prompt shares (a system prompt), of its 600")
    p.add_argument("--json", help="write the rows and the summary here")
    args = p.parse_args(argv)
    cfg = EpisodeConfig(args.model, args.num_pages, args.clients, phase_s=args.phase_s,
                        shared_tokens=args.shared_tokens)
    try:
        cgroup = ChildCgroup.create(f"edge-pressure-{int(time.time())}")
    except CgroupUnavailable as exc:
        print(f"pressure_episode: no memory cgroup: {exc}", file=sys.stderr)
        return 3
    try:
        cgroup.enter()
        episode = Episode(cfg, cgroup)
        print(f"running the episode (about {6 * cfg.phase_s + 20:.0f} s) ...", file=sys.stderr)
        episode.run()
    finally:
        cgroup.leave()
        cgroup.remove()
    summary = episode.summary()
    print(format_rows(episode.rows))
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": asdict(cfg), "summary": summary, "rows": episode.rows}, f)
    problems = verdict(summary)
    for line in problems:
        print(f"pressure_episode: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
