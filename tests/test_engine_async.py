"""AsyncEngine: streamed deltas add up to the result, concurrent streams, cancel frees pages,
abandoning a stream cancels it, bad requests raise in the caller."""

import asyncio

import pytest

from engine_helpers import engine_for, greedy, hf_greedy, tiny, tiny_hf, tiny_prompts

from edge_runtime.engine.async_engine import AsyncEngine
from edge_runtime.errors import RequestError


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


def test_concurrent_streams_and_cancel():
    prompts = tiny_prompts([20, 33, 9], seed=800)
    expected = [hf_greedy(tiny_hf(), p, 12) for p in prompts]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=32)
    aeng = AsyncEngine(eng)

    async def consume(prompt):
        ids, text, last = [], "", None
        async for ev in aeng.stream(prompt, greedy(12, ignore_eos=True)):
            ids += ev.token_ids
            text += ev.text
            last = ev
        return ids, text, last.result

    async def cancelled(prompt):
        n = 0
        async for ev in aeng.stream(prompt, greedy(200, ignore_eos=True), request_id="victim"):
            n += len(ev.token_ids)
            if n == 3:
                await aeng.cancel("victim")
            if ev.result is not None:
                return ev.result

    async def main():
        outs = await asyncio.gather(*(consume(p) for p in prompts), cancelled(prompts[0]))
        return outs

    try:
        *outs, victim = _run(main())
        for (ids, text, result), want in zip(outs, expected):
            assert ids == want == result.token_ids and text == result.text
        assert victim.finish_reason == "cancelled" and 3 <= len(victim.token_ids) < 200
        assert _run(aeng.call(lambda e: e.kv.stats()["pages_live"])) == 0
        _run(aeng.call(lambda e: e.kv.check_leaks()))
    finally:
        aeng.shutdown()


def test_abandoned_stream_is_cancelled_and_errors_reach_caller():
    eng = engine_for(tiny(), kv_dtype="int8", page_tokens=16, num_pages=16)
    aeng = AsyncEngine(eng)

    async def main():
        agen = aeng.stream(tiny_prompts([25], seed=900)[0], greedy(300, ignore_eos=True))
        async for _ in agen:
            break
        await agen.aclose()
        for _ in range(200):
            if not await aeng.call(lambda e: e.has_unfinished()):
                break
            await asyncio.sleep(0.01)
        return await aeng.call(lambda e: e.kv.stats()["pages_live"])

    try:
        assert _run(main()) == 0
        with pytest.raises(RequestError):
            _run(aeng.generate([], greedy(3)))
    finally:
        aeng.shutdown()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_loop_is_reported_and_fails_every_stream():
    """An exception escaping Engine.step ends the loop thread: the stream that was running and
    every later one get EngineLoopStopped naming the cause, and `failure` says the loop is dead."""
    from edge_runtime.engine.async_engine import EngineLoopStopped

    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16)

    def broken_step():
        raise ValueError("Overflow when unpacking long long")

    eng.step = broken_step
    aeng = AsyncEngine(eng)
    prompt = tiny_prompts([8], seed=910)[0]
    try:
        assert aeng.failure is None
        with pytest.raises(EngineLoopStopped, match="ValueError: Overflow") as e:
            _run(aeng.generate(prompt, greedy(3)))
        assert isinstance(e.value.__cause__, ValueError)
        assert isinstance(aeng.failure, ValueError)
        with pytest.raises(EngineLoopStopped, match="restarted"):
            _run(aeng.generate(prompt, greedy(3)))
    finally:
        aeng.shutdown()


def test_a_request_refused_on_the_loop_thread_gets_its_own_error():
    """add_request raising on the loop thread (here: the id is taken by a synchronous caller)
    fails that stream with the engine's error, not "the engine loop stopped"; the loop runs on."""
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16)
    prompt = tiny_prompts([8], seed=920)[0]
    eng.add_request(prompt, greedy(200, ignore_eos=True), request_id="taken")
    aeng = AsyncEngine(eng)
    try:
        with pytest.raises(RequestError, match="already in use"):
            _run(aeng.generate(prompt, greedy(3), request_id="taken"))
        assert aeng.failure is None
        assert _run(aeng.generate(prompt, greedy(3, ignore_eos=True))).finish_reason == "length"
    finally:
        aeng.shutdown()
