"""Start, watch and stop the servers `bench peer` compares: `edge-runtime serve` on a Unix socket and
llama.cpp's `llama-server` on a local TCP port, both serving one GGUF file.

Invariants: a `ServerProcess` is the server process itself (no shell in between), so its
/proc/PID/status VmHWM is the server's peak resident memory; it is stopped (SIGTERM, then SIGKILL
after `stop_timeout_s`) when the block ends, also on an exception; its output goes to a log file
whose last lines are quoted when it fails to come up.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.import_path import module_argv
from edge_runtime.bench.http_client import TargetError


@dataclass(frozen=True)
class ServerSpec:
    name: str  # the system's name in the report
    command: list[str]
    target: str  # unix:PATH or http://HOST:PORT, for the trace client
    health_url: str  # GET answers 200 once the model is loaded
    socket_path: str | None = None  # the Unix socket the health check goes through


def edge_spec(gguf: Path, socket_path: str, config: str | None, extra: list[str]) -> ServerSpec:
    command = module_argv("edge_runtime", "serve", "--model", str(gguf),
                          "--socket", socket_path, "--device", "cpu", *(["--config", config] if config else []),
                          "--log-level", "WARNING", *extra)
    return ServerSpec("edge", command, f"unix:{socket_path}", "http://localhost/health", socket_path)


def llama_spec(binary: Path, gguf: Path, port: int, parallel: int, context: int,
               extra: list[str]) -> ServerSpec:
    """llama-server with `parallel` slots sharing `context` tokens (each slot gets context/parallel)."""
    command = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(parallel), "-c", str(context), *extra]
    url = f"http://127.0.0.1:{port}"
    return ServerSpec("llama.cpp", command, url, f"{url}/health")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health_status(spec: ServerSpec) -> int | None:
    """The HTTP status of the health URL, None while nothing answers."""
    if spec.socket_path is None:
        try:
            with urllib.request.urlopen(spec.health_url, timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return None
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(spec.socket_path)
            s.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            head = s.recv(64).decode("latin-1")
        return int(head.split()[1])
    except (OSError, ValueError, IndexError):
        return None


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM of a live process (its peak resident set), None when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ServerProcess:
    """`with ServerProcess(spec, log) as server:` runs the server until the block ends; entering
    waits until its health check answers 200 (or raises TargetError with the log's end)."""

    def __init__(self, spec: ServerSpec, log_path: Path, ready_timeout_s: float = 300.0,
                 stop_timeout_s: float = 30.0) -> None:
        self.spec, self.log_path = spec, log_path
        self.ready_timeout_s, self.stop_timeout_s = ready_timeout_s, stop_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        if self.spec.socket_path and os.path.exists(self.spec.socket_path):
            os.unlink(self.spec.socket_path)
        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(self.spec.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise TargetError(f"cannot start {self.spec.name} ({self.spec.command[0]}): {exc}") from exc
        finally:
            log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetError(f"{self.spec.name} exited with status {self.proc.returncode} "
                                  f"before it was ready; its log ends: {self.log_tail()}")
            if _health_status(self.spec) == 200:
                return
            time.sleep(0.5)
        raise TargetError(f"{self.spec.name} was not ready within {self.ready_timeout_s:.0f} s; "
                          f"its log ends: {self.log_tail()}")

    def log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def peak_rss_bytes(self) -> int | None:
        return None if self.proc is None else peak_rss_bytes(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __exit__(self, *exc) -> None:
        self.stop()
