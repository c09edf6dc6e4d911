"""Usage checks of `edge-runtime voice` made before the model loads, so a typo costs no load:
each is a `ConfigError` (exit status 2) with one line naming the argument and the fix.

Invariants: nothing here opens an input (a FIFO would block) or writes an output before every
check has passed; only stdlib, and torch for `--device cuda`.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from edge_runtime.errors import ConfigError
from edge_runtime.paths import same_file

MAX_STAGGER_S = 3600.0
_ANSWER_WAV = re.compile(r"stream\d+_utt\d+\.wav")  # loop.py's names for spoken answers


def check_stagger(stagger_s: float | None) -> None:
    if stagger_s is not None and not 0 <= stagger_s <= MAX_STAGGER_S:  # NaN fails it too
        raise ConfigError(f"--stagger must be a number of seconds from 0 to {MAX_STAGGER_S:g}, "
                          f"got {stagger_s}")


def check_device(device: str, server: str | None) -> None:
    """`auto`, `cpu`, `cuda` or `cuda:N`; a GPU device must exist here (checked before the model
    load, which would otherwise fail inside the weights loader with a misleading message)."""
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d+))?", device)
    if match is None:
        raise ConfigError(f"--device {device!r}: unknown device; use auto, cpu, cuda or cuda:N")
    if device in ("auto", "cpu") or server:  # with --server the model runs in the service
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: no CUDA GPU is usable on this machine "
                          "(torch.cuda.is_available() is False); use --device cpu")
    index, count = int(match.group(1) or 0), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"--device {device}: this machine has {count} GPU(s) (cuda:0-"
                          f"cuda:{count - 1})")


def check_pipes_unshared(sources) -> None:
    """A pipe (FIFO, `-`) has one reader's worth of data: shared, each stream would get a
    random part of one speaker's audio and act on garbled commands. Pipes are compared by
    (st_dev, st_ino), so `-`, /dev/stdin, /dev/fd/0 and hard links to one FIFO are one pipe."""
    users: dict[object, list[int]] = {}
    for i, source in enumerate(sources):
        if source.spec.kind == "pcm":
            for key in _pipe_keys(source.spec.path):
                users.setdefault(key, []).append(i)
    for streams in users.values():
        if len(streams) > 1:
            given = list(dict.fromkeys(str(sources[i].spec.path) for i in streams))
            name = "stdin (-)" if "-" in given else f"pipe {given[0]}"
            also = f" (given as {', '.join(given)})" if len(given) > 1 else ""
            raise ConfigError(f"{name} would feed streams {', '.join(map(str, streams))}{also}: a "
                              "pipe can feed only one stream (give each stream its own pipe, or "
                              "lower --streams)")


def _pipe_keys(path: Path) -> list[object]:
    keys: list[object] = []
    try:
        if str(path) == "-":
            keys.append("stdin")  # each `-` reader dups fd 0: one file offset, even for a file
            st = os.fstat(0)
        else:
            st = os.stat(path)
    except OSError:
        return keys  # missing or closed: reported by its stream
    if not stat.S_ISREG(st.st_mode):  # a regular file can be read by several streams
        keys.append((st.st_dev, st.st_ino))
    return keys


def check_outputs(sources, events: Path | None, tts_dir: Path | None,
                  settings: dict[str, Path] | None = None) -> None:
    """No output may overwrite an input (a stream's, or a settings file: {flag: path}), then the
    outputs must be writable. `tts_dir` is None without --tts. The answer folder is created
    here, after every check."""
    _check_not_inputs(sources, events, tts_dir)
    for flag, path in (settings or {}).items():
        if events is not None and same_file(events, path):
            raise ConfigError(f"--events {events} is the {flag} file ({path}): the events would "
                              "overwrite it; give another file")
    if tts_dir is not None:
        try:
            tts_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--tts-dir {tts_dir}: cannot create the folder "
                              f"({exc.strerror}); give a writable folder") from exc
        if not os.access(tts_dir, os.W_OK | os.X_OK):
            raise ConfigError(f"--tts-dir {tts_dir}: folder is not writable")
    if events is not None:
        parent = events.parent
        if events.is_dir():
            raise ConfigError(f"--events {events}: is a directory; give a file name")
        if not parent.is_dir():
            raise ConfigError(f"--events {events}: folder {parent} does not exist")
        if not os.access(events if events.exists() else parent, os.W_OK):
            raise ConfigError(f"--events {events}: not writable")


def _check_not_inputs(sources, events: Path | None, tts_dir: Path | None) -> None:
    for i, source in enumerate(sources):
        path, kind = source.spec.path, source.spec.kind
        if str(path) == "-":
            continue
        if kind == "folder":
            if events is not None and events.suffix.lower() == ".wav" and \
                    same_file(events.parent, path):
                raise _clash("--events", events, "is inside", i, path,
                             "it would be read as one of its WAVs")
            if tts_dir is not None and same_file(tts_dir, path):
                raise _clash("--tts-dir", tts_dir, "is", i, path,
                             "the answers would be written among its WAVs")
            continue
        if events is not None and same_file(events, path):
            raise _clash("--events", events, "is", i, path, "the events would overwrite it")
        if tts_dir is not None and _ANSWER_WAV.fullmatch(path.name) and \
                same_file(path.parent, tts_dir):
            raise _clash("--tts-dir", tts_dir, "holds", i, path,
                         "a spoken answer would overwrite it")


def _clash(flag: str, output: Path, relation: str, index: int, path: Path, why: str
           ) -> ConfigError:
    return ConfigError(f"{flag} {output} {relation} input {index} ({path}): {why}; give another "
                       f"{'folder' if flag == '--tts-dir' else 'file'}")
