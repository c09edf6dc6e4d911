"""Up-front checks of output files and Unix socket paths (edge_runtime/paths.py)."""

from __future__ import annotations

import pytest

from edge_runtime.cli import main
from edge_runtime.errors import ConfigError, InputError
from edge_runtime.paths import check_output_file, check_unix_socket_path


def test_output_file_checks(tmp_path):
    check_output_file(tmp_path / "r.json", "--out")  # a new file in an existing folder
    with pytest.raises(InputError, match="--out .*: the folder .*/missing does not exist"):
        check_output_file(tmp_path / "missing" / "r.json", "--out")
    with pytest.raises(InputError, match="is a folder"):
        check_output_file(tmp_path, "--out")


def test_socket_path_too_long_or_in_an_uncreatable_folder(tmp_path):
    short = tmp_path / "sub" / "s.sock"
    check_unix_socket_path(str(short))
    assert short.parent.is_dir()  # created, as bind_unix_socket would
    long = "/tmp/" + "x" * 103 + ".sock"  # 113 bytes: bind() raised OSError "AF_UNIX path too long"
    with pytest.raises(ConfigError, match="is 113 bytes long; a Unix socket path can have at most 107"):
        check_unix_socket_path(long)
    with pytest.raises(ConfigError, match="cannot create the folder /proc/nope"):
        check_unix_socket_path("/proc/nope/x.sock")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create the folder"):
        check_unix_socket_path(str(blocker / "x.sock"))


def test_serve_refuses_a_bad_socket_before_loading(capsys):
    assert main(["serve", "--socket", "/tmp/" + "y" * 120 + ".sock", "--model", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert "a Unix socket path can have at most 107" in err and "Traceback" not in err
