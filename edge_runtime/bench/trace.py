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
        raise InputError(f"{where}: not valid JSON ({exc.msg})") from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object per line")
    missing = [k for k in REQUIRED if k not in obj]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
    max_tokens = obj["max_tokens"]
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise InputError(f"{where}: max_tokens must be a positive integer, got {max_tokens!r}")
    if not isinstance(obj["turn"], int):
        raise InputError(f"{where}: turn must be an integer, got {obj['turn']!r}")
    arrival = obj.get("arrival_s")
    return Turn(
        stream=str(obj["stream"]),
        turn=obj["turn"],
        system=str(obj["system"]),
        command=str(obj["command"]),
        max_tokens=max_tokens,
        arrival_s=float(arrival) if arrival is not None else None,
        answer=obj.get("answer"),
    )


def load_trace(path: str | Path) -> Trace:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"trace file {p} does not exist (generate one with tools/gen_trace.py)")
    streams: dict[str, list[Turn]] = {}
    for lineno, line in enumerate(p.read_text().splitlines(), start=1):
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
