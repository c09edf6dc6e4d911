"""Up-front checks of paths a command will write, so a bad path fails before any work is done,
where the runtime keeps its caches, and the models folder.

Each check raises an `EdgeError` subclass naming the flag and what to change; none imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from edge_runtime import env
from edge_runtime.errors import ConfigError, InputError

# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_UNIX_SOCKET_PATH_BYTES = 107


def cache_dir(name: str) -> Path:
    """$XDG_CACHE_HOME/edge-runtime/<name> (default ~/.cache): converted models, compiled kernels,
    key means, the voice demo's audio. Not created here."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edge-runtime" / name


def models_dir() -> Path:
    """The models folder: $EDGE_RUNTIME_MODELS, else $XDG_DATA_HOME/edge-runtime/models (default
    ~/.local/share). Its .gguf files and Hugging Face folders are the models `--model NAME` finds
    by name (edge_runtime/model/model_names.py). Not created here."""
    chosen = env.models_dir()
    if chosen:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "edge-runtime" / "models"


def same_file(a: str | Path, b: str | Path) -> bool:
    """One file under two names: the same real path, or the same (st_dev, st_ino) (hard links,
    /dev/stdin and /dev/fd/0). A path that does not exist yet is only its real path."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output_file(path: str | Path, flag: str) -> None:
    """`path` can be created or overwritten: its folder exists and is writable, it is no folder."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(f"{flag} {p} is a folder: give a file name")
    if not parent.is_dir():
        raise InputError(f"{flag} {p}: the folder {parent} does not exist; create it or "
                         "choose another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(f"{flag} {p} is not writable; choose another path")


def check_unix_socket_path(path: str, flag: str = "--socket") -> None:
    """`path` fits in sockaddr_un and its folder exists (created here, as bind would) and is writable."""
    size = len(os.fsencode(path))
    if size > MAX_UNIX_SOCKET_PATH_BYTES:
        raise ConfigError(f"{flag} {path} is {size} bytes long; a Unix socket path can have at most "
                          f"{MAX_UNIX_SOCKET_PATH_BYTES}: choose a shorter path (e.g. under /run)")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot create the folder {parent} ({exc.strerror}); "
                          "choose a path in a writable folder") from exc
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the folder {parent} is not writable; choose a path in a "
                          "writable folder")
