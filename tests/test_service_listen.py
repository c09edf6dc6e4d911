"""The TCP listener (listen_address.py, commands/serve.py, service/socket_activation.py): HOST:PORT
forms, the loopback rule, refusals before anything binds, and the sockets systemd passes.

Only 127.0.0.1 is ever bound or connected to. A non-loopback address is only checked and
refused: 192.0.2.1 (TEST-NET-1, RFC 5737) is not on this machine, so even a broken check could
not bind it."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
from pathlib import Path

import pytest

from service_helpers import write_keys

from edge_runtime.import_path import code_argv, module_argv

ROOT = Path(__file__).resolve().parent.parent
KEY = "0123456789abcdef" * 3


@pytest.mark.parametrize("text,host,port,loopback", [
    ("127.0.0.1:8080", "127.0.0.1", 8080, True),
    ("127.9.8.7:1", "127.9.8.7", 1, True),
    ("localhost:0", "127.0.0.1", 0, True),
    ("LocalHost:65535", "127.0.0.1", 65535, True),
    ("[::1]:8080", "::1", 8080, True),
    ("[::ffff:127.0.0.1]:80", "::ffff:7f00:1", 80, True),
    ("0.0.0.0:8080", "0.0.0.0", 8080, False),
    ("[::]:8080", "::", 8080, False),
    ("192.168.1.20:8080", "192.168.1.20", 8080, False),
    ("[::ffff:10.0.0.1]:80", "::ffff:a00:1", 80, False),
])
def test_listen_addresses_and_which_are_loopback(text, host, port, loopback):
    from edge_runtime.listen_address import parse_listen

    address = parse_listen(text)
    assert (address.host, address.port, address.is_loopback) == (host, port, loopback)
    assert parse_listen(str(address)) == address


@pytest.mark.parametrize("text,message", [
    ("8080", "no port"),
    (":8080", "no port"),
    ("127.0.0.1", "no port"),
    ("127.0.0.1:", "the port must be a number"),
    ("127.0.0.1:65536", "the port must be a number from 0 to 65535"),
    ("127.0.0.1:-1", "the port must be a number"),
    ("::1:8080", "an IPv6 address goes in brackets"),
    ("jetson.local:8080", "'jetson.local' is not an IP address (names are not resolved"),
    ("[fe80::1%eth0]:80", "scoped IPv6 addresses are not supported"),
])
def test_a_malformed_listen_address_is_refused_saying_what_to_give(text, message):
    from edge_runtime.errors import ConfigError
    from edge_runtime.listen_address import parse_listen

    with pytest.raises(ConfigError, match="e.g. 127.0.0.1:8080") as err:
        parse_listen(text, "service.listen")
    assert str(err.value).startswith(f"service.listen {text!r}: ") and message in str(err.value)


def test_the_budget_refuses_a_malformed_service_listen(tmp_path):
    from edge_runtime.errors import ConfigError
    from edge_runtime.service_limits import ServiceLimits
    from edge_runtime.service.sections import load_sections
    from service_helpers import write_config

    assert ServiceLimits().listen == "" and ServiceLimits().api_keys == ""  # off by default
    config = write_config(tmp_path / "b.yaml", {"listen": "127.0.0.1:8080", "api_keys": "/k"})
    limits, _ = load_sections(str(config))
    assert (limits.listen, limits.api_keys) == ("127.0.0.1:8080", "/k")
    with pytest.raises(ConfigError, match="service.listen 'example.org:80'"):
        load_sections(str(write_config(tmp_path / "c.yaml", {"listen": "example.org:80"})))
    with pytest.raises(ConfigError, match="service.listen"):
        load_sections(str(write_config(tmp_path / "d.yaml", {"listen": 8080})))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "::ffff:192.0.2.1", "10.1.2.3"])
def test_a_non_loopback_address_without_keys_is_refused(host):
    from edge_runtime.errors import ConfigError
    from edge_runtime.listen_address import check_exposure

    with pytest.raises(ConfigError, match=f"listens on {host}, which is not a loopback address.*"
                                          "--api-keys FILE or service.api_keys"):
        check_exposure(host, False, "--listen x")
    check_exposure(host, True, "--listen x")  # with keys it may


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"])
def test_loopback_needs_no_keys(host):
    from edge_runtime.listen_address import check_exposure

    check_exposure(host, False, "--listen x")


def _args(listen: str | None, sock: Path) -> argparse.Namespace:
    return argparse.Namespace(listen=listen, socket=str(sock))


def test_serve_binds_both_sockets_and_cleans_up_when_the_port_is_taken(tmp_path):
    from edge_runtime.commands.serve import _listening_sockets
    from edge_runtime.errors import ConfigError
    from edge_runtime.service_limits import ServiceLimits

    sock = tmp_path / "api.sock"
    socks, owns = _listening_sockets(_args("127.0.0.1:0", sock), ServiceLimits(), False)
    try:
        assert owns == str(sock) and [s.family for s in socks] == [socket.AF_UNIX, socket.AF_INET]
        port = socks[1].getsockname()[1]
        assert socks[1].getsockname()[0] == "127.0.0.1" and port > 0
        for s in socks:
            s.close()
        sock.unlink()
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ConfigError, match=rf"--listen 127.0.0.1:{taken.getsockname()[1]}: "
                                              "cannot listen .*choose another address or port"):
            _listening_sockets(_args(f"127.0.0.1:{taken.getsockname()[1]}", sock),
                               ServiceLimits(), False)
        assert not sock.exists()  # the Unix socket it bound first is gone again
        taken.close()
        # service.listen when --listen is not given
        socks, _ = _listening_sockets(_args(None, sock), ServiceLimits(listen="127.0.0.1:0"),
                                      False)
        assert [s.family for s in socks] == [socket.AF_UNIX, socket.AF_INET]
    finally:
        for s in socks:
            s.close()


def test_serve_refuses_a_non_loopback_address_without_keys_before_binding(tmp_path):
    from edge_runtime.commands.serve import _listening_sockets
    from edge_runtime.errors import ConfigError
    from edge_runtime.service_limits import ServiceLimits

    sock = tmp_path / "api.sock"
    for listen, flag, limits in [("192.0.2.1:8080", "--listen", ServiceLimits()),
                                 (None, "service.listen", ServiceLimits(listen="[::]:8080"))]:
        with pytest.raises(ConfigError, match=f"{flag} .* not a loopback address"):
            _listening_sockets(_args(listen, sock), limits, False)
        assert not sock.exists()


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(module_argv("edge_runtime", "serve", "--socket", str(tmp_path / "api.sock"), *args),
                          cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_the_cli_refuses_a_bad_keys_file_and_an_exposed_address_without_keys(tmp_path):
    """Each a one-line error, exit 2, before any socket exists."""
    keys = write_keys(tmp_path / "keys", KEY, mode=0o644)
    proc = _serve(tmp_path, "--listen", "127.0.0.1:0", "--api-keys", str(keys))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"edge-runtime serve: error: --api-keys {keys}: its group or other users may read or "
        f"write it (mode 0644); run `chmod 600 {keys}` so that only the service's user can read it")
    proc = _serve(tmp_path, "--listen", "192.0.2.1:8080")
    assert proc.returncode == 2, proc.stderr
    assert "error: --listen 192.0.2.1:8080 listens on 192.0.2.1, which is not a loopback " \
           "address" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "api.sock").exists()


_ACTIVATED = """
import argparse, json, os, socket, sys
from edge_runtime.errors import ConfigError
from edge_runtime.service_limits import ServiceLimits
kinds, listen = sys.argv[1].split(","), sys.argv[2] or None
made = []
for i, kind in enumerate(kinds):  # what a socket unit's ListenStream= lines make
    family = socket.AF_INET if kind.startswith("tcp") else socket.AF_UNIX
    kind_ = socket.SOCK_DGRAM if kind.endswith("dgram") else socket.SOCK_STREAM
    s = socket.socket(family, kind_)
    s.bind(("127.0.0.1", 0) if family == socket.AF_INET else f"{i}.sock")
    if kind_ == socket.SOCK_STREAM and not kind.endswith("unlistened"):
        s.listen(8)
    made.append(s)
for i, s in enumerate(made):
    os.dup2(s.fileno(), 50 + i)
for s in made:
    s.close()
for i in range(len(made)):
    os.dup2(50 + i, 3 + i)
    os.close(50 + i)
os.environ.update(LISTEN_FDS=str(len(made)), LISTEN_PID=str(os.getpid()))
from edge_runtime.commands.serve import _listening_sockets
try:
    socks, owns = _listening_sockets(argparse.Namespace(listen=listen, socket="x.sock"),
                                     ServiceLimits(), has_keys=False)
    print(json.dumps([s.family.name for s in socks] + [owns]))
except ConfigError as exc:
    print(json.dumps(str(exc)))
"""


@pytest.mark.parametrize("kinds,listen,expected", [
    ("unix", "", ["AF_UNIX", None]),
    ("unix,tcp", "", ["AF_UNIX", "AF_INET", None]),
    ("tcp,unix", "127.0.0.1:8080", ["AF_UNIX", "AF_INET", None]),
    ("unix", "127.0.0.1:8080", "--listen 127.0.0.1:8080 is set, but systemd passed no TCP "
                               "socket: add ListenStream=127.0.0.1:8080 to edge-runtime.socket"),
    ("tcp", "", "must have one ListenStream= with a path and at most one with HOST:PORT"),
    ("unix,tcp,tcp", "", "2 TCP"),
    ("unix,unix", "", "2 Unix"),
    ("unix,tcp-dgram", "", "not a stream socket"),
    ("unix,tcp-unlistened", "", "not listening; set Accept=no"),
])
def test_socket_activation_takes_a_unix_and_an_optional_tcp_socket(tmp_path, kinds, listen,
                                                                   expected):
    proc = subprocess.run(code_argv(_ACTIVATED, kinds, listen), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == expected if isinstance(expected, list) else expected in out, out
