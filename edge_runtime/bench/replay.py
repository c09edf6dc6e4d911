"""Closed-loop replay of a multi-turn trace against one backend.

Every stream runs concurrently as its own task; a stream sends turn k+1 only when the answer to turn
k is complete, and turn k+1's messages carry the system prompt, every earlier user command and the
answers *actually generated* for them (never the trace's scripted answers). `arrivals` says what
`arrival_s` (earliest send time) does: "ignore" (default, pure closed loop: the next turn goes out as
soon as the previous answer is in, and every stream starts at 0), "first" (each stream starts at
its first turn's arrival_s, closed loop after that: staggered session starts) or "all".
`history="scripted"` carries the trace's scripted answers instead of the generated ones (every
system then sees identical prompts: a controlled comparison; the default stays "generated").

A backend implements `complete(stream, messages, max_tokens) -> Outcome` (async) and measures its own
first-token and end times with time.perf_counter(); the replay stamps the send time. Invariants of
the records returned: one per trace turn, `send_t <= first_token_t <= end_t`, and within a stream
each send happens after the previous turn's end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from edge_runtime.bench.trace import Trace, Turn


@dataclass
class Outcome:
    """What a backend reports for one request; times are absolute time.perf_counter() values."""

    text: str
    output_tokens: int
    first_token_t: float | None  # None when no token was produced
    end_t: float
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    finish_reason: str = "stop"
    token_ids: list[int] | None = None


@dataclass
class Record:
    """One replayed request; times relative to the replay start, in seconds."""

    stream: str
    turn: int
    send_s: float
    first_token_s: float | None
    end_s: float
    output_tokens: int
    prompt_tokens: int | None
    cached_prompt_tokens: int | None
    finish_reason: str
    text: str
    token_ids: list[int] | None = field(default=None, repr=False)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.send_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT); None for 0 or 1 token."""
        if self.first_token_s is None or self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("token_ids")
        d["ttft_s"] = self.ttft_s
        d["tpot_s"] = self.tpot_s
        return d


class Backend(Protocol):
    name: str

    async def complete(self, stream: str, messages: list[dict], max_tokens: int) -> Outcome: ...


@dataclass
class ReplayResult:
    records: list[Record]
    t0: float  # perf_counter at replay start
    makespan_s: float


ARRIVALS = ("ignore", "first", "all")
HISTORIES = ("generated", "scripted")


async def _run_stream(
    turns: list[Turn], backend: Backend, t0: float, arrivals: str,
    records: list[Record], on_record: Callable[[Record], None] | None, history: str,
) -> None:
    messages: list[dict] = [{"role": "system", "content": turns[0].system}]
    for k, turn in enumerate(turns):
        honor = arrivals == "all" or (arrivals == "first" and k == 0)
        if honor and turn.arrival_s is not None:
            delay = t0 + turn.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        messages.append({"role": "user", "content": turn.command})
        send_t = time.perf_counter()
        out = await backend.complete(turn.stream, list(messages), turn.max_tokens)
        assert out.end_t >= send_t, (out.end_t, send_t)
        if out.first_token_t is not None:
            assert send_t <= out.first_token_t <= out.end_t, (send_t, out.first_token_t, out.end_t)
        rec = Record(
            stream=turn.stream, turn=turn.turn, send_s=send_t - t0,
            first_token_s=None if out.first_token_t is None else out.first_token_t - t0,
            end_s=out.end_t - t0, output_tokens=out.output_tokens,
            prompt_tokens=out.prompt_tokens, cached_prompt_tokens=out.cached_prompt_tokens,
            finish_reason=out.finish_reason, text=out.text, token_ids=out.token_ids,
        )
        records.append(rec)
        if on_record is not None:
            on_record(rec)
        scripted = history == "scripted" and turn.answer is not None
        messages.append({"role": "assistant", "content": turn.answer if scripted else out.text})


async def prewarm(trace: Trace, backend: Backend) -> int:
    """Send each distinct system prompt once (1 token, untimed), as a voice appliance would at
    start-up so the prefix cache already holds it; returns how many prompts were sent."""
    systems = sorted({turns[0].system for turns in trace.streams.values()})
    for i, system in enumerate(systems):
        await backend.complete(f"prewarm-{i}", [{"role": "system", "content": system}], 1)
    return len(systems)


async def replay(
    trace: Trace, backend: Backend, arrivals: str = "ignore",
    on_record: Callable[[Record], None] | None = None, history: str = "generated",
    warm: bool = False,
) -> ReplayResult:
    """Replay every stream of `trace` concurrently against `backend` (closed loop); with `warm`,
    `prewarm` runs first, outside the timed replay."""
    assert arrivals in ARRIVALS and history in HISTORIES, (arrivals, history)
    if warm:
        await prewarm(trace, backend)
    records: list[Record] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(
        _run_stream(turns, backend, t0, arrivals, records, on_record, history)
        for turns in trace.streams.values()
    ))
    makespan = time.perf_counter() - t0
    assert len(records) == trace.num_requests, (len(records), trace.num_requests)
    records.sort(key=lambda r: (r.send_s, r.stream))
    return ReplayResult(records, t0, makespan)
