"""Reading a multi-turn trace (docs/trace-format.md, written by tools/gen_trace.py).

One JSON object per line: `stream` (id), `turn` (0- or 1-based, consecutive per stream), `system`
(system prompt text), `command` (the user's text for this turn), `max_tokens`, optional `arrival_s`
(earliest send time, seconds from replay start) and optional `answer` (a scripted reference answer:
the replay never uses it, it sends the answers actually generated).

Invariants after loading: streams are sorted by id, each stream's turns are sorted and consecutive,
every turn of a stream has the same system prompt. Bad input raises `InputError` naming the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import InputError

REQUIRED = ("stream", "turn", "system", "command", "max_tokens")


@dataclass(frozen=True)
class Turn:
    stream: str
    turn: int
    system: str
    command: str
    max_tokens: int
    arrival_s: float | None = None
    answer: str | None = None


@dataclass(frozen=True)
class Trace:
    name: str
    streams: dict[str, list[Turn]]  # stream id -> its turns in order

    @property
    def num_requests(self) -> int:
        return sum(len(turns) for turns in self.streams.values())

    def limit_streams(self, n: int | None) -> "Trace":
        """The first `n` streams (all when n is None or larger than the trace)."""
        if n is None:
            return self
        if n < 1:
            raise InputError(f"--streams must be at least 1, got {n}")
        keep = list(self.streams)[:n]
        return Trace(self.name, {k: self.streams[k] for k in keep})


def _parse_line(line: str, where: str) -> Turn:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    except RecursionError as exc:
        raise InputError(f"{where}: not valid JSON for a trace (nested too deeply)") from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object per line")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
    _check_types(obj, where)
    arrival = obj.get("arrival_s")
    return Turn(
        stream=str(obj["stream"]),
        turn=obj["turn"],
        system=obj["system"],
        command=obj["command"],
        max_tokens=obj["max_tokens"],
        arrival_s=float(arrival) if arrival is not None else None,
        answer=obj.get("answer"),
    )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_types(obj: dict, where: str) -> None:
    """Each field's type, so a bad value is refused here and not deep in the replay."""
    def bad(field: str, expected: str) -> InputError:
        return InputError(f"{where}: {field} must be {expected}, got {obj[field]!r}")

    if not _is_int(obj["max_tokens"]) or obj["max_tokens"] < 1:
        raise bad("max_tokens", "a positive integer")
    if not _is_int(obj["turn"]):
        raise bad("turn", "an integer")
    if not (isinstance(obj["stream"], str) or _is_int(obj["stream"])):
        raise bad("stream", "a string or an integer id")
    if isinstance(obj["stream"], str):
        _check_encodable(obj["stream"], "stream", where)
    for field in ("system", "command"):
        if not isinstance(obj[field], str):
            raise bad(field, "a string")
        _check_encodable(obj[field], field, where)
    arrival = obj.get("arrival_s")
    if arrival is not None and (isinstance(arrival, bool) or not isinstance(arrival, (int, float))
                                or not 0 <= arrival < float("inf")):
        raise bad("arrival_s", "a number of seconds >= 0 (or absent)")
    if obj.get("answer") is not None:
        if not isinstance(obj["answer"], str):
            raise bad("answer", "a string (or absent)")
        _check_encodable(obj["answer"], "answer", where)


def _check_encodable(text: str, field: str, where: str) -> None:
    """A JSON escape like \\ud800 decodes to a lone UTF-16 surrogate, which no tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: {field} holds a lone UTF-16 surrogate "
                         f"({text[exc.start]!r} at character {exc.start}); write the character "
                         "itself or its full surrogate pair") from None


def load_trace(path: str | Path) -> Trace:
    p = Path(path)
    if p.is_dir():
        raise InputError(f"trace {p} is a folder: give a trace file (JSON lines, see "
                         "docs/trace-format.md)")
    if not p.is_file():
        raise InputError(f"trace file {p} does not exist (generate one with tools/gen_trace.py)")
    try:
        text = p.read_bytes().decode("utf-8-sig")  # a leading byte-order mark is allowed
    except UnicodeDecodeError as exc:
        raise InputError(f"trace file {p} is not UTF-8 text (byte {exc.start}): give JSON lines, "
                         "see docs/trace-format.md") from exc
    except OSError as exc:
        raise InputError(f"cannot read trace file {p}: {exc.strerror}") from exc
    streams: dict[str, list[Turn]] = {}
    # JSON lines end at "\n" only: str.splitlines() would also split inside a string at U+2028,
    # U+0085 and the like, which JSON allows raw
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        turn = _parse_line(line, f"{p}:{lineno}")
        streams.setdefault(turn.stream, []).append(turn)
    if not streams:
        raise InputError(f"trace file {p} holds no turns")
    for sid, turns in streams.items():
        turns.sort(key=lambda t: t.turn)
        numbers = [t.turn for t in turns]
        if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
            raise InputError(f"{p}: stream {sid} has non-consecutive turns {numbers}")
        if len({t.system for t in turns}) != 1:
            raise InputError(f"{p}: stream {sid} changes its system prompt between turns")
    ordered = {k: streams[k] for k in sorted(streams, key=_stream_key)}
    return Trace(p.stem, ordered)


def _stream_key(sid: str) -> tuple:
    """Natural order: "s2" before "s10", "2" before "10"."""
    head = sid.rstrip("0123456789")
    tail = sid[len(head):]
    return (head, int(tail) if tail else -1, sid)
