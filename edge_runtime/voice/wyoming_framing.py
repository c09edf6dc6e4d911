"""Reading Wyoming events with the `wyoming` package's framing, with limits and named faults.

`wyoming.event.async_read_event` reads a JSON header line, then `data_length` bytes of JSON and
`payload_length` bytes of payload. It returns None both at the end of the stream and for a line
that is not JSON, and it trusts the lengths a client sends (a header claiming a 10 GB payload
would be read into memory). `read_event` tells the cases apart and bounds every read:

- None: the client closed the connection between events;
- `MalformedEvent(problem)`: a header over `MAX_HEADER_BYTES`, data or payload over its limit, a
  line that is not a JSON object with a text `type`, data that is not a JSON object, or a
  connection closed in the middle of an event. After one of these the stream is out of step (the
  next bytes' meaning is unknown), so the caller says so in an `error` event and closes it.
"""

from __future__ import annotations

import asyncio
import json

from wyoming.event import Event, async_read_event

MAX_HEADER_BYTES = 64 * 1024  # the header line (asyncio's StreamReader limit)
MAX_DATA_BYTES = 64 * 1024  # an event's JSON data: a transcript, a sentence to speak
MAX_PAYLOAD_BYTES = 1024 * 1024  # one audio chunk: 16 s of 16 kHz 16-bit stereo


class MalformedEvent(Exception):
    """The stream is not Wyoming events any more; the message says what was wrong."""


class _LimitedReader:
    """What async_read_event calls on its reader (readline, readexactly), with the lengths checked
    before anything is read; the first refusal is kept in `problem`."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.problem: str | None = None
        self.line = b""
        self._expected: list[tuple[str, int]] = []  # the reads the header announces, in order

    async def readline(self) -> bytes:
        try:
            self.line = await self.reader.readline()
        except ValueError:  # asyncio: the line is longer than the stream's limit
            self.problem = (f"an event header line is longer than {MAX_HEADER_BYTES:,} bytes "
                            "(is this a Wyoming client?)")
            raise
        self._expected = _announced_reads(self.line)
        return self.line

    async def readexactly(self, n: int) -> bytes:
        what, limit = self._expected.pop(0) if self._expected else ("length", 0)
        if not isinstance(n, int) or n > limit:
            self.problem = f"{what} {n!r} is over the limit of {limit:,} bytes"
            raise ValueError(self.problem)
        return await self.reader.readexactly(n)


def _announced_reads(line: bytes) -> list[tuple[str, int]]:
    """The data and payload reads a header line asks for, in async_read_event's order."""
    try:
        header = json.loads(line)
    except ValueError:
        return []
    if not isinstance(header, dict):
        return []
    return [(key, limit) for key, limit in (("data_length", MAX_DATA_BYTES),
                                            ("payload_length", MAX_PAYLOAD_BYTES))
            if _positive(header.get(key))]


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event, None at the end of the stream, or MalformedEvent (see the module doc)."""
    limited = _LimitedReader(reader)
    try:
        event = await async_read_event(limited)
    except asyncio.IncompleteReadError as exc:
        raise MalformedEvent(f"the connection closed in the middle of an event ({len(exc.partial)}"
                             f" of {exc.expected} bytes)") from exc
    except (AttributeError, KeyError, TypeError) as exc:  # JSON, but not an event object
        raise MalformedEvent(_not_an_event(limited.line)) from exc
    if limited.problem is not None:
        raise MalformedEvent(limited.problem)
    if event is None:
        if not limited.line:  # readline() at the end of the stream
            return None
        raise MalformedEvent(_not_an_event(limited.line))
    if not isinstance(event.type, str) or not isinstance(event.data, dict):
        raise MalformedEvent(_not_an_event(limited.line))
    return event


def _not_an_event(line: bytes) -> str:
    shown = line[:80].decode("utf-8", errors="replace").strip()
    return ("not a Wyoming event: each event is a JSON object with a text \"type\" on one line "
            f"(got {shown!r})")
