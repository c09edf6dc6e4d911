"""Closed-loop scheduling of bench.replay with a deterministic fake backend."""

import asyncio
import json
import time

from edge_runtime.bench.replay import Outcome, replay
from edge_runtime.bench.trace import load_trace


class EchoBackend:
    """Answers after a short await with text derived from the prompt, logging every call."""

    name = "echo"

    def __init__(self, delay_s=0.002):
        self.delay_s = delay_s
        self.calls = []  # (stream, messages, start, end)
        self.in_flight = 0
        self.max_in_flight = 0

    async def complete(self, stream, messages, max_tokens):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        start = time.perf_counter()
        await asyncio.sleep(self.delay_s)
        first = time.perf_counter()
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        text = f"ans[{stream}:{len(messages)}:{messages[-1]['content']}]"
        end = time.perf_counter()
        self.calls.append((stream, messages, start, end))
        return Outcome(text=text, output_tokens=min(max_tokens, 3), first_token_t=first, end_t=end,
                       prompt_tokens=len(messages), cached_prompt_tokens=0)


def _trace(tmp_path, streams=3, turns=4):
    p = tmp_path / "t.jsonl"
    lines = [json.dumps({"stream": s, "turn": t, "system": f"sys{s % 2}",
                         "command": f"cmd{s}-{t}", "max_tokens": 5})
             for t in range(turns) for s in range(streams)]
    p.write_text("\n".join(lines))
    return load_trace(p)


def test_closed_loop_history_and_ordering(tmp_path):
    trace = _trace(tmp_path)
    backend = EchoBackend()
    result = asyncio.run(replay(trace, backend))
    assert len(result.records) == 12
    assert backend.max_in_flight == 3  # streams really run concurrently
    for sid in ("0", "1", "2"):
        calls = [c for c in backend.calls if c[0] == sid]
        assert len(calls) == 4
        for k, (_, msgs, start, _) in enumerate(calls):
            # system + k (user, assistant) pairs + this user turn
            assert [m["role"] for m in msgs] == ["system"] + ["user", "assistant"] * k + ["user"]
            assert msgs[0]["content"] == f"sys{int(sid) % 2}"
            for j in range(k):  # the answers actually generated are carried forward
                assert msgs[2 + 2 * j]["content"] == f"ans[{sid}:{2 + 2 * j}:cmd{sid}-{j}]"
            if k:
                assert start >= calls[k - 1][3]  # next turn only after the previous answer
        recs = [r for r in result.records if r.stream == sid]
        assert [r.turn for r in recs] == [0, 1, 2, 3]
        assert all(r.ttft_s > 0 and r.tpot_s > 0 for r in recs)
    assert result.makespan_s >= max(r.end_s for r in result.records)


def test_arrival_modes(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text("\n".join(json.dumps({"stream": 0, "turn": t, "system": "s", "command": "c",
                                       "max_tokens": 2, "arrival_s": a})
                           for t, a in ((0, 0.2), (1, 1.2))))
    trace = load_trace(p)
    first, second = asyncio.run(replay(trace, EchoBackend(), arrivals="all")).records
    assert first.send_s >= 0.2 and second.send_s >= 1.2
    first, second = asyncio.run(replay(trace, EchoBackend(), arrivals="first")).records
    assert 0.2 <= first.send_s and second.send_s < 1.2  # closed loop after the staggered start
    first, _ = asyncio.run(replay(trace, EchoBackend(), arrivals="ignore")).records
    assert first.send_s < 0.2


def test_scripted_history_carries_trace_answers(tmp_path):
    p = tmp_path / "s.jsonl"
    p.write_text("\n".join(json.dumps({"stream": 0, "turn": t, "system": "s", "command": f"c{t}",
                                       "max_tokens": 2, "answer": f"scripted{t}"})
                           for t in range(3)))
    backend = EchoBackend()
    asyncio.run(replay(load_trace(p), backend, history="scripted"))
    last = backend.calls[-1][1]
    assert [m["content"] for m in last if m["role"] == "assistant"] == ["scripted0", "scripted1"]


def test_prewarm_sends_each_system_prompt_once_untimed(tmp_path):
    trace = _trace(tmp_path, streams=3, turns=2)  # system prompts sys0, sys1, sys0
    backend = EchoBackend()
    result = asyncio.run(replay(trace, backend, warm=True))
    warm_calls = [c for c in backend.calls if c[0].startswith("prewarm")]
    assert sorted(c[1][0]["content"] for c in warm_calls) == ["sys0", "sys1"]
    assert all(len(c[1]) == 1 for c in warm_calls)
    assert len(result.records) == 6 and all(r.send_s >= 0 for r in result.records)
