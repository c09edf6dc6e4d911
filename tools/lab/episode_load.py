"""The load of a pressure episode (tools/pressure_episode.py): closed-loop clients on an Engine, and a
child process that holds anonymous memory in steps.

Invariants: every request a client sends is counted once in `sent` and once in `answered` when its
result arrives (completed, or ended with an error); `stop()` waits for every answer, so
`sent - answered` after it is the number of requests lost.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time

from edge_runtime.import_path import code_argv
from edge_runtime.engine.api import SamplingParams


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ClosedLoopClients:
    """`n` clients, each sending its next request when the previous one is answered. Prompts are
    longer than an inline slot, so every request holds pool pages; the first `shared_tokens` of
    every prompt are the same (a system prompt: its pages are shared, only the rest is computed)."""

    def __init__(self, engine, n: int, max_tokens: int, prompt_tokens: int = 600,
                 shared_tokens: int = 0) -> None:
        assert 0 <= shared_tokens < prompt_tokens, (shared_tokens, prompt_tokens)
        self.engine, self.n, self.prompt_tokens = engine, n, prompt_tokens
        self.params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        self.rng = random.Random(0)
        self.shared = self._tokens(shared_tokens)
        self.sent = self.completed = self.errors = 0
        self.owner: dict[str, int] = {}  # request id -> client
        self.stopping = False
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._drive, name="episode-clients", daemon=True)

    def _tokens(self, n: int) -> list[int]:
        vocab = self.engine.model_config.vocab_size
        return [self.rng.randrange(3, vocab) for _ in range(n)]

    def _prompt(self) -> list[int]:
        return self.shared + self._tokens(self.prompt_tokens - len(self.shared))

    def warm_up(self) -> None:
        self.engine.generate([self._prompt()], self.params)

    def start(self) -> None:
        for client in range(self.n):
            self._send(client)
        self._thread.start()

    def _send(self, client: int) -> None:
        rid = self.engine.add_request(self._prompt(), self.params)
        self.owner[rid] = client
        self.sent += 1

    def _drive(self) -> None:
        try:
            while not (self.stopping and not self.owner):
                if not self.engine.has_unfinished():
                    time.sleep(0.01)
                    continue
                for ev in self.engine.step():
                    if ev.result is not None:
                        self._answered(ev.request_id, ev.result)
        except BaseException as exc:  # reported by stop()
            self.failure = exc

    def _answered(self, rid: str, result) -> None:
        client = self.owner.pop(rid)
        if result.error is None:
            self.completed += 1
        else:
            self.errors += 1
        if not self.stopping:
            self._send(client)

    def counts(self) -> dict:
        """Read without the engine lock (a step may hold it for seconds): a sample, not a
        consistent snapshot, which is all a timeline row needs."""
        e = self.engine
        return {"sent": self.sent, "answered": self.completed + self.errors,
                "completed": self.completed, "errors": self.errors,
                "refused": e.counters["requests_refused"], "running": len(e.scheduler.running),
                "waiting": len(e.scheduler.waiting)}

    def stop(self, timeout_s: float = 120.0) -> None:
        self.stopping = True
        self._thread.join(timeout_s)
        if self.failure is not None:
            raise RuntimeError("the engine failed during the episode") from self.failure
        assert not self._thread.is_alive(), f"requests unanswered after {timeout_s} s: {self.owner}"


HOG = """
import sys
chunks = []
for line in sys.stdin:
    chunks.append(bytearray(int(line)))
    for i in range(0, len(chunks[-1]), 4096):
        chunks[-1][i] = 1  # written, so resident
    print(len(chunks), flush=True)
"""


class Hog:
    """A child process holding anonymous memory, grown `step_bytes` at a time; freed on exit."""

    def __init__(self, step_bytes: int) -> None:
        self.step_bytes, self.bytes = step_bytes, 0
        self.proc = subprocess.Popen(code_argv(HOG), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def grow(self) -> None:
        self.proc.stdin.write(f"{self.step_bytes}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline(), "the memory hog died (killed by the OOM killer?)"
        self.bytes += self.step_bytes

    def __enter__(self) -> "Hog":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)
        self.bytes = 0
