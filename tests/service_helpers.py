"""Helpers for the service tests: start a real `edge-runtime serve` process on a Unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
EXE = [sys.executable, "-m", "edge_runtime"]


def write_config(path: Path, service: dict | None = None, guard: dict | None = None) -> Path:
    """The cpu-dev budget with `service:` and `guard:` replaced (guard off unless given)."""
    import yaml

    data = yaml.safe_load((ROOT / "configs/orin/cpu-dev.yaml").read_text())
    data["service"] = service or {}
    data["guard"] = guard or {"enabled": False}
    path.write_text(yaml.safe_dump(data))
    return path


def client(sock: str, timeout: float = 60.0) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://localhost",
                        timeout=timeout)


def wait_ready(proc: subprocess.Popen, sock: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}:\n{_output(proc)}")
        if os.path.exists(sock):
            try:
                with client(sock, timeout=2) as c:
                    if c.get("/health").json().get("status") == "ready":
                        return
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"server not ready after {timeout} s:\n{_output(proc)}")


def start_server(sock: str, config: Path, model: str, extra_env: dict | None = None,
                 pass_fds=(), argv_prefix=None, socket_arg: bool = True) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    if "NOTIFY_SOCKET" not in (extra_env or {}):
        env.pop("NOTIFY_SOCKET", None)
    argv = list(argv_prefix or EXE) + ["serve", "--config", str(config), "--model", model]
    if socket_arg:
        argv += ["--socket", sock]
    log = open(sock + ".log", "w")  # a file, not a pipe: a full pipe would block the server
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True, pass_fds=pass_fds)
    proc.log_path = sock + ".log"
    log.close()
    return proc


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> tuple[int, str]:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode, _output(proc)


def _output(proc: subprocess.Popen) -> str:
    return Path(proc.log_path).read_text()
