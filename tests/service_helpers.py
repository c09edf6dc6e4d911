"""Helpers for the service tests: start a real `edge-runtime serve` process on a Unix socket, or
the app alone (a stand-in engine, no model) in a thread, and talk raw HTTP to either.

An address is a Unix socket path (str) or a TCP (host, port) on 127.0.0.1: the tests never bind
or connect to any other address."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from edge_runtime.import_path import module_argv

ROOT = Path(__file__).resolve().parent.parent
EXE = module_argv("edge_runtime")


def write_config(path: Path, service: dict | None = None, guard: dict | None = None) -> Path:
    """The cpu-dev budget with `service:` and `guard:` replaced (guard off unless given)."""
    import yaml

    data = yaml.safe_load((ROOT / "configs/orin/cpu-dev.yaml").read_text())
    data["service"] = service or {}
    data["guard"] = guard or {"enabled": False}
    path.write_text(yaml.safe_dump(data))
    return path


def client(address, timeout: float = 60.0, headers: dict | None = None) -> httpx.Client:
    if isinstance(address, tuple):
        host, port = address
        return httpx.Client(base_url=f"http://{host}:{port}", timeout=timeout, headers=headers,
                            trust_env=False)
    return httpx.Client(transport=httpx.HTTPTransport(uds=address), base_url="http://localhost",
                        timeout=timeout, headers=headers)


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


def tcp_address(proc: subprocess.Popen) -> tuple[str, int]:
    """The 127.0.0.1 port a `serve --listen 127.0.0.1:0` process listens on, from its start line."""
    import re

    found = re.search(r"listening on .*http://127\.0\.0\.1:(\d+)", _output(proc))
    assert found, _output(proc)
    return "127.0.0.1", int(found.group(1))


def start_server(sock: str, config: Path | None, model: str, extra_env: dict | None = None,
                 pass_fds=(), argv_prefix=None, socket_arg: bool = True,
                 max_open_files: int | None = None, extra_args=()) -> subprocess.Popen:
    """`edge-runtime serve` (without --config when `config` is None: default limits and pool),
    with RLIMIT_NOFILE set to `max_open_files` (soft and hard) when given."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra_env or {}))
    if "NOTIFY_SOCKET" not in (extra_env or {}):
        env.pop("NOTIFY_SOCKET", None)
    argv = list(argv_prefix or EXE) + ["serve", "--model", model]
    if config is not None:
        argv += ["--config", str(config)]
    argv += list(extra_args)
    if socket_arg:
        argv += ["--socket", sock]
    log = open(sock + ".log", "w")  # a file, not a pipe: a full pipe would block the server
    def limit_files():
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True, pass_fds=pass_fds,
                            preexec_fn=limit_files if max_open_files else None)
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


class StubEngine:
    """Stand-in AsyncEngine: every request generates the tokens [5, 6] ("ab")."""

    failure = None

    async def stream(self, prompt_ids, params, request_id):
        from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent

        result = GenerationResult(request_id, len(prompt_ids), 0,
                                  [Completion("ab", [5, 6], "length")])
        yield TokenEvent(request_id, 0, [5, 6], "ab")
        yield TokenEvent(request_id, 0, [], "", result=result)

    async def cancel(self, request_id):
        return None


def stub_state(**limits):
    """A ready ServiceState on StubEngine: model "m", vocabulary 10, context 64, a 64-page pool."""
    from types import SimpleNamespace

    from edge_runtime.service.app import ServiceState
    from edge_runtime.service_limits import ServiceLimits

    state = ServiceState(ServiceLimits(**limits), "m")
    config = SimpleNamespace(page_tokens=16, enable_inline=False, num_inline_slots=0,
                             inline_tokens=0)
    engine = SimpleNamespace(config=config, num_pages=64, stats=lambda: {"steps": 0})
    model = SimpleNamespace(tokenizer=None, config=SimpleNamespace(max_position_embeddings=64,
                                                                    vocab_size=10))
    state.set_ready(model, engine, StubEngine(), None)
    return state


@contextlib.contextmanager
def app_on_unix_socket(state, path: str):
    """Serve build_app(state) on `path` from an event loop in a thread, as server.py runs it."""
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1024)
    with _app_on(state, [listener]):
        yield path


@contextlib.contextmanager
def app_on_tcp(state):
    """Serve build_app(state) on 127.0.0.1 at a port the kernel picks; yields (host, port)."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    with _app_on(state, [listener]):
        yield listener.getsockname()


@contextlib.contextmanager
def app_on(state, transport: str, tmp_path: Path):
    """app_on_unix_socket or app_on_tcp by name ("unix" or "tcp")."""
    if transport == "tcp":
        with app_on_tcp(state) as address:
            yield address
    else:
        assert transport == "unix", transport
        with app_on_unix_socket(state, str(tmp_path / "api.sock")) as address:
            yield address


@contextlib.contextmanager
def _app_on(state, listeners: list):
    import asyncio
    import threading

    from aiohttp import web

    from edge_runtime.service.app import build_app

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start():
        from edge_runtime.service.connections import start_listening

        await runner.setup()
        await start_listening(runner, listeners, state)

    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        for listener in listeners:
            listener.close()


def raw_connect(address, timeout: float = 60.0):
    import socket

    if isinstance(address, tuple):
        assert address[0] == "127.0.0.1", address  # no traffic leaves the machine
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    else:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)  # a safety net against a hang, not a measurement
    conn.connect(address)
    return conn


def write_keys(path: Path, *keys: str, mode: int = 0o600) -> Path:
    """A keys file, one key a line, created with `mode` (never readable by others meanwhile)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# API keys of the tests\n" + "".join(k + "\n" for k in keys))
    os.chmod(path, mode)
    return path


def post_bytes(url: str, body: bytes, headers: str = "") -> bytes:
    """A POST request as bytes; `headers` are extra header lines, each ending in CRLF."""
    return (f"POST {url} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"{headers}Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_response(conn) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 response from a raw socket: status, headers (lower-case names), body (by
    Content-Length, or up to the close); skips interim 1xx responses."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            assert chunk, f"connection closed before a full response: {data[:200]!r}"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        if status >= 200:
            break
    headers = dict((k.strip().lower(), v.strip()) for k, v in
                   (line.split(":", 1) for line in lines[1:]))
    if "content-length" in headers:
        while len(data) < int(headers["content-length"]):
            chunk = conn.recv(65536)
            assert chunk, "connection closed inside the body"
            data += chunk
    else:
        while chunk := conn.recv(65536):
            data += chunk
    return status, headers, data


@contextlib.contextmanager
def tiny_engine_state(limits: dict | None = None, **engine_cfg):
    """A ready ServiceState on a real Engine + AsyncEngine over the tiny random Llama of
    tests/engine_helpers.py (SmolLM2's tokenizer, random weights): the engine's own paths, fast."""
    from engine_helpers import engine_for, tiny

    from edge_runtime.engine.async_engine import AsyncEngine
    from edge_runtime.service.app import ServiceState
    from edge_runtime.service_limits import ServiceLimits

    loaded = tiny()
    engine = engine_for(loaded, **engine_cfg)
    aengine = AsyncEngine(engine)
    state = ServiceState(ServiceLimits(**(limits or {})), "tiny")
    state.set_ready(loaded, engine, aengine, None)
    try:
        yield state
    finally:
        aengine.shutdown()


def fake_install_root(tmp_path: Path, python_prelude: str = "") -> tuple[dict, Path]:
    """PATH stubs for every command tools/install-service.sh would use to change the system
    (useradd, usermod, install, systemctl, and pip through a fake venv's python); each logs its
    arguments to the returned log. The fake python runs `python_prelude` (shell) and then this
    interpreter, so the installer's own planner and checks really run."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for cmd in ("useradd", "usermod", "install", "systemctl"):
        (bin_dir / cmd).write_text(f'#!/bin/sh\necho "{cmd} $*" >>"{log}"\n')
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "-m pip" ]; then echo "pip $*" >>"{log}"; exit 0; fi\n'
        f'{python_prelude}exec "{sys.executable}" "$@"\n')
    for f in [*bin_dir.iterdir(), venv / "bin/python"]:
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(tmp_path)}
    return env, log
