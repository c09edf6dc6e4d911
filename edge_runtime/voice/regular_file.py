"""Opening an input that must be a regular file (a WAV file, a text file of commands).

Invariants:
- the path is opened with O_NONBLOCK and checked with fstat on that very descriptor, so nothing
  blocks on a FIFO or a device given where a file is expected, and what was checked is what is
  read (no window between a stat and an open);
- only regular files are handed on: soundfile's open holds a lock shared by every stream, so a
  FIFO reaching it would stall the WAV files of all the other streams;
- every refusal is an `InputError` naming the file and saying what to do instead.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from edge_runtime.errors import InputError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ... for a non-regular st_mode."""
    return next((name for test, name in _KINDS if test(mode)), "not a plain file")


def open_regular(path: Path, what: str, dir_hint: str, other_hint: str) -> BinaryIO:
    """`path` opened for binary reading, or an InputError: `what` names the expected content
    ("a WAV file"), `dir_hint` / `other_hint` what to do for a directory / a pipe or device."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: file not found{_dangling(path)}") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path}: symlink loop (its links lead back to each other); point "
                             f"it at {what} or remove it") from exc
        raise InputError(f"{path}: cannot open ({exc.strerror})") from exc
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise InputError(f"{path}: is a directory, not {what} ({dir_hint})")
        raise InputError(f"{path}: not a regular file ({file_kind(mode)}); {other_hint}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _dangling(path: Path) -> str:
    try:
        return f" (a symlink to {os.readlink(path)}, which does not exist)"
    except OSError:
        return ""
