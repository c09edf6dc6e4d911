"""The bounded admission pause, through the HTTP app on a tiny real engine with a scripted guard:
requests that arrive while the guard holds admission wait at most `max_admission_pause_s`, then
get 503 with Retry-After (streamed ones too: nothing was sent yet); requests already admitted run
to the end; once memory is back to ok, requests are served again."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bench_helpers import make_tiny_llama
from edge_runtime.guard_config import GuardConfig
from edge_runtime.guard.engine_hooks import EngineGuardHooks
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import ScriptedSource
from edge_runtime.service_limits import ServiceLimits

PAUSE_S = 0.3
STEP_S = 0.02


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from edge_runtime.model.loader import load_model

    return load_model(str(make_tiny_llama(tmp_path_factory.mktemp("tiny"))))


def _service(loaded):
    from edge_runtime.engine.async_engine import AsyncEngine
    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.backend import prepare_model, select_backend
    from edge_runtime.engine.engine import Engine
    from edge_runtime.service.app import ServiceState

    prepare_model(loaded.model, select_backend("cpu", "cpu"))
    engine = Engine(loaded, EngineConfig(num_pages=64, max_num_seqs=4))
    step = engine.step

    def slow_step():  # >= 1.2 s for 60 tokens on any machine: still running at the refusal
        time.sleep(STEP_S)
        return step()

    engine.step = slow_step
    source = ScriptedSource([0.5])
    guard = MemoryGuard(GuardConfig(max_admission_pause_s=PAUSE_S), source,
                        EngineGuardHooks(engine))
    state = ServiceState(ServiceLimits(retry_after_s=7, max_tokens=1500), "tiny", guard)
    state.set_ready(loaded, engine, AsyncEngine(engine), None)
    return state, source, guard, engine


async def _stream_lines(resp) -> list[str]:
    return [line[len("data: "):] for line in (await resp.text()).split("\n\n") if line]


def test_paused_admission_answers_503_after_the_bound_and_admitted_requests_complete(loaded):
    from aiohttp.test_utils import TestClient, TestServer

    from edge_runtime.service.app import build_app

    state, source, guard, engine = _service(loaded)
    long = {"prompt": [1, 2, 3], "max_tokens": 60, "ignore_eos": True, "stream": True}
    short = {"prompt": [4, 5, 6], "max_tokens": 4}

    async def main():
        async with TestClient(TestServer(build_app(state))) as c:
            assert guard.poll() == "ok"
            admitted = [await c.post("/v1/completions", json=dict(long, prompt=[1, 2, i]))
                        for i in (3, 4)]
            for resp in admitted:  # headers come with the first token: both are running
                assert resp.status == 200
            source.push(0.90)
            assert guard.poll() == "high" and not engine.admission_gate()
            waiting = [asyncio.ensure_future(c.post("/v1/completions", json=short)),
                       asyncio.ensure_future(c.post("/v1/completions", json=dict(short, stream=True)))]
            await asyncio.sleep(PAUSE_S / 3)
            assert not any(t.done() for t in waiting)  # they wait while the pause is short
            await asyncio.sleep(PAUSE_S)
            running_at_refusal = engine.stats()["running"]
            guard.poll()  # the pause ran out: the waiting requests are ended
            refused = [await t for t in waiting]
            at_once = await c.post("/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "hi"}]})
            refused.append(at_once)
            bodies = [await r.json() for r in refused]
            streams = [await _stream_lines(r) for r in admitted]
            source.push(0.5)
            assert guard.poll() == "ok"
            after = await c.post("/v1/completions", json=short)
            return running_at_refusal, refused, bodies, streams, after.status

    running_at_refusal, refused, bodies, streams, after_status = asyncio.run(main())
    assert running_at_refusal == 2  # the admitted ones were still generating during the refusal
    for resp, body in zip(refused, bodies):
        assert resp.status == 503 and resp.headers["Retry-After"] == "7"
        assert body["error"]["code"] == "memory_pressure"
        assert "paused admission" in body["error"]["message"]
    assert guard.action_counts["requests_refused"] == 2 and engine.counters["requests_refused"] == 2
    for lines in streams:  # every admitted request ran to its full length
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(x) for x in lines[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert not any("error" in ch for ch in chunks)
    assert after_status == 200
    engine.kv.check_invariants()


def test_refuse_waiting_ends_only_requests_never_admitted(loaded):
    """A preempted request waits too, but it was admitted: it is not refused and completes."""
    from edge_runtime.engine.api import SamplingParams
    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.backend import prepare_model, select_backend
    from edge_runtime.engine.engine import Engine

    prepare_model(loaded.model, select_backend("cpu", "cpu"))
    engine = Engine(loaded, EngineConfig(num_pages=64, max_num_seqs=4))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    admitted = [engine.add_request([1, 2, i], params) for i in (3, 4)]
    results = {}

    def step():
        for ev in engine.step():
            if ev.result is not None:
                results[ev.request_id] = ev.result

    step()
    assert engine.preempt_newest(1) == 1  # back in the queue, already admitted once
    engine.set_admission_paused(True)
    late = engine.add_request([5, 6, 7], params)
    step()
    assert engine.refuse_waiting("paused too long") == 1
    step()
    assert results[late].error == "paused too long" and results[late].generated_tokens == 0
    assert results[late].finish_reason == "error"
    engine.set_admission_paused(False)
    while engine.has_unfinished():
        step()
    for rid in admitted:
        assert results[rid].error is None and len(results[rid].token_ids) == 8
    assert engine.counters["requests_refused"] == 1
