"""server.bind_unix_socket: every way bind() and its pre-checks can fail is a one-line start-up
error naming the flag and the path (exit 2), never a traceback; a stale socket is replaced."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from edge_runtime.cli import main
from edge_runtime.errors import ConfigError
from edge_runtime.service import server
from edge_runtime.service.server import bind_unix_socket


def _serve(capsys, monkeypatch, path: str) -> str:
    monkeypatch.delenv("LISTEN_FDS", raising=False)  # not socket-activated: --socket is used
    assert main(["serve", "--socket", path, "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"edge-runtime serve: error: --socket {path}"), err
    return err


def test_a_dangling_symlink_is_refused_as_such(tmp_path, capsys, monkeypatch):
    """os.path.exists() is False for a dangling link, and bind() then failed with EADDRINUSE."""
    link = tmp_path / "api.sock"
    link.symlink_to(tmp_path / "gone" / "x.sock")
    err = _serve(capsys, monkeypatch, str(link))
    assert f"is a symbolic link (to {tmp_path}/gone/x.sock, which does not exist)" in err
    assert link.is_symlink()  # left as it was


def test_a_path_bind_refuses_is_a_one_line_error(capsys, monkeypatch):
    """/proc passes the folder checks (as root) but bind() fails: it was a traceback."""
    err = _serve(capsys, monkeypatch, "/proc/edge-runtime-test.sock")
    assert "cannot bind (" in err or "not writable" in err, err
    with pytest.raises(ConfigError, match=r"^--socket /proc/x.sock: cannot bind \(.+\); choose"):
        bind_unix_socket("/proc/x.sock")


def test_a_socket_the_probe_cannot_connect_to_is_a_one_line_error(tmp_path, monkeypatch):
    path = str(tmp_path / "api.sock")
    bind_unix_socket(path).close()  # a socket file nobody listens on

    class NoPermission(socket.socket):
        def connect(self, address):
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(server.socket, "socket", NoPermission)
    with pytest.raises(ConfigError, match=r"--socket .*: cannot check whether a server "
                                          r"listens on it \(Permission denied\)"):
        bind_unix_socket(path)
    assert stat.S_ISSOCK(os.stat(path).st_mode)  # not removed


def test_chmod_or_listen_failure_is_an_error_and_leaves_no_socket_file(tmp_path, monkeypatch):
    path = str(tmp_path / "api.sock")

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(server.os, "chmod", refuse)
    with pytest.raises(ConfigError, match=r"cannot chmod 0660 and listen \(Operation not "
                                          r"permitted\)"):
        bind_unix_socket(path)
    assert not os.path.lexists(path)


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = str(tmp_path / "api.sock")
    bind_unix_socket(path).close()  # a crashed run leaves its socket file
    live = bind_unix_socket(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    with pytest.raises(ConfigError, match="another server is already listening on it"):
        bind_unix_socket(path)
    live.close()
    regular = tmp_path / "file"
    regular.write_text("")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        bind_unix_socket(str(regular))
