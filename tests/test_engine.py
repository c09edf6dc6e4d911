"""Engine on a tiny random Llama (fp32 KV unless stated): greedy token-identical to transformers
across page sizes / prefix cache / inline, prefix reuse, preemption under a small pool, n > 1
forks, beam search vs transformers, cancel, request validation."""

import pytest
import torch

from engine_helpers import (TINY_VOCAB, engine_for, greedy, hf_beam, hf_greedy, tiny, tiny_folder, tiny_hf,
                            tiny_prompts)

from edge_runtime.engine.api import SamplingParams
from edge_runtime.errors import RequestError

LENGTHS = [5, 41, 17, 70, 3]  # mixed lengths: below, at and across 16-token pages
NEW = 14


@pytest.fixture(scope="module")
def refs():
    prompts = tiny_prompts(LENGTHS)
    return prompts, [hf_greedy(tiny_hf(), p, NEW) for p in prompts]


@pytest.mark.parametrize("page_tokens", [16, 512])
@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("inline", [True, False])
def test_greedy_batch_matches_transformers(refs, page_tokens, prefix_cache, inline):
    prompts, expected = refs
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=page_tokens,
                     num_pages=40 if page_tokens == 16 else 6, enable_prefix_cache=prefix_cache,
                     enable_inline=inline, inline_tokens=24, max_batch_tokens=64)
    results = eng.generate(prompts, greedy(NEW, ignore_eos=True))
    assert [r.token_ids for r in results] == expected
    assert all(r.finish_reason == "length" and r.prompt_tokens == len(p)
               for r, p in zip(results, prompts))
    for p, want in zip(prompts[:2], expected[:2]):  # and alone
        assert eng.generate([p], greedy(NEW, ignore_eos=True))[0].token_ids == want
    assert eng.kv.stats()["pages_live"] == 0


def test_shared_system_prompt_prefills_only_uncached():
    system = tiny_prompts([45], seed=100)[0]
    a, b = (system + s for s in tiny_prompts([6, 9], seed=200))
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=32, inline_tokens=32)
    eng.generate([a], greedy(8, ignore_eos=True))
    before = eng.counters["prefill_tokens"]
    warm = eng.generate([b], greedy(8, ignore_eos=True))[0]
    assert warm.cached_prompt_tokens >= 45  # the whole system prompt, partial page included
    assert eng.counters["prefill_tokens"] - before == len(b) - warm.cached_prompt_tokens
    cold = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=32,
                      enable_prefix_cache=False).generate([b], greedy(8, ignore_eos=True))[0]
    assert cold.cached_prompt_tokens == 0 and warm.token_ids == cold.token_ids
    t = warm.timings
    assert 0 <= t.queue_s <= t.first_token_s <= t.total_s and t.total_s > 0


def test_requests_arriving_together_share_one_system_prompt_copy():
    system = tiny_prompts([70], seed=110)[0]
    prompts = [system + s for s in tiny_prompts([5, 8, 6, 9], seed=210)]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=48, inline_tokens=32)
    results = eng.generate(prompts, greedy(6, ignore_eos=True))
    # the first computes the system prompt; the others match its pages (in the same step)
    assert results[0].cached_prompt_tokens == 0
    assert all(r.cached_prompt_tokens >= 64 for r in results[1:])  # 4 full 16-token pages + more
    cold = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=48,
                      enable_prefix_cache=False).generate(prompts, greedy(6, ignore_eos=True))
    assert [r.token_ids for r in results] == [r.token_ids for r in cold]


@pytest.mark.parametrize("kv_dtype", ["fp32", "int8"])
def test_sharers_get_their_first_token_in_the_step_that_computes_the_prefix(kv_dtype, monkeypatch):
    """The followers read the prefix in the forward that writes it: every first token comes from
    the first step, and every answer equals the one of waiting a step for the prefix (the same
    K/V bytes are read: bit-identical, int8 included)."""
    from edge_runtime.engine.scheduler import Scheduler

    system = tiny_prompts([70], seed=140)[0]
    prompts = [system + s for s in tiny_prompts([5, 8, 6, 9], seed=240)]
    params = greedy(6, ignore_eos=True)
    eng = engine_for(tiny(), kv_dtype=kv_dtype, page_tokens=16, num_pages=48, inline_tokens=32)
    ids = [eng.add_request(p, params) for p in prompts]
    first = eng.step()
    assert {e.request_id for e in first if e.token_ids} == set(ids)
    cached = 70 if kv_dtype == "fp32" else 64  # int8: a hit is cut back to the 16-token window
    assert eng.counters["prefill_tokens"] == len(prompts[0]) + sum(len(p) - cached for p in prompts[1:])
    results = {e.request_id: e.result for e in first if e.result is not None}
    while eng.has_unfinished():
        results.update({e.request_id: e.result for e in eng.step() if e.result is not None})
    monkeypatch.setattr(Scheduler, "_commit_ahead", lambda self, out: None)  # the old schedule
    waited = engine_for(tiny(), kv_dtype=kv_dtype, page_tokens=16, num_pages=48, inline_tokens=32)
    expected = waited.generate(prompts, params)
    assert [results[i].token_ids for i in ids] == [r.token_ids for r in expected]
    assert [results[i].cached_prompt_tokens for i in ids] == [r.cached_prompt_tokens for r in expected]
    assert waited.counters["steps"] > eng.counters["steps"]
    eng.kv.check_leaks()


def test_a_step_that_fails_after_committing_ahead_stops_the_engine(monkeypatch):
    system = tiny_prompts([70], seed=150)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=48, inline_tokens=32)
    for p in (system + s for s in tiny_prompts([5, 8], seed=250)):
        eng.add_request(p, greedy(4))

    def fail(*args):
        raise MemoryError("injected")

    monkeypatch.setattr(eng.runner, "forward", fail)
    with pytest.raises(MemoryError):
        eng.step()  # the second request was admitted over the first one's pages, committed ahead
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="build a new Engine"):
        eng.step()


def test_multi_turn_history_ends_in_slots_match_transformers():
    """Turns whose history crosses page boundaries: a turn's end continues in inline slots
    after full pages (copied from the shared partial page, or after filling its own page), and
    finish writes it back; every turn's greedy answer equals transformers' on the whole prompt."""
    system = tiny_prompts([13], seed=120)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=32, inline_tokens=4,
                     num_inline_slots=8)
    histories = [list(system), list(system)]
    for turn, cmds in enumerate(zip(tiny_prompts([3, 5, 2, 6, 4, 3], seed=220),
                                    tiny_prompts([4, 2, 6, 3, 5, 2], seed=221))):
        prompts = [h + c for h, c in zip(histories, cmds)]
        results = eng.generate(prompts, greedy(5, ignore_eos=True))
        for p, r in zip(prompts, results):
            assert r.token_ids == hf_greedy(tiny_hf(), p, 5), turn
        histories = [p + r.token_ids for p, r in zip(prompts, results)]
    c = eng.kv.counters
    assert c.pages_to_slots > 0 and c.take_overs > 0 and c.inline_to_pages > 0, c
    eng.kv.check_leaks()


def test_multi_turn_slots_int8_match_the_engine_without_sharing():
    """The same with int8 KV (the one-call C decode step on the CPU reads slots after pages):
    answers equal those of an engine without prefix cache and inline slots."""
    system = tiny_prompts([13], seed=130)[0]
    engines = [engine_for(tiny(), kv_dtype="int8", page_tokens=16, num_pages=32, inline_tokens=4,
                          num_inline_slots=8, enable_prefix_cache=share, enable_inline=share)
               for share in (True, False)]
    histories = [list(system), list(system)]
    for cmds in zip(tiny_prompts([3, 5, 2, 6, 4], seed=230), tiny_prompts([4, 2, 6, 3, 5], seed=231)):
        prompts = [h + c for h, c in zip(histories, cmds)]
        ours, plain = (e.generate(prompts, greedy(5, ignore_eos=True)) for e in engines)
        assert [r.token_ids for r in ours] == [r.token_ids for r in plain]
        histories = [p + r.token_ids for p, r in zip(prompts, ours)]
    assert engines[0].kv.counters.pages_to_slots > 0
    engines[0].kv.check_leaks()


def test_small_pool_preempts_and_completes_identically():
    prompts = tiny_prompts([30, 35, 28, 33, 31], seed=300)
    expected = [hf_greedy(tiny_hf(), p, 30) for p in prompts]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=9, enable_inline=False,
                     max_num_seqs=5, max_batch_tokens=200)
    results = eng.generate(prompts, greedy(30, ignore_eos=True))
    assert [r.token_ids for r in results] == expected
    assert eng.stats()["preemptions"] > 0
    eng.kv.check_leaks()


@pytest.mark.parametrize("k", [2, 3, 4])
def test_beam_search_matches_transformers(k):
    for i, prompt in enumerate(tiny_prompts([12, 30], seed=400 + k)):
        eos = hf_greedy(tiny_hf(), prompt, 4)[2 + i]  # a token the beams are likely to produce
        want = hf_beam(tiny_hf(), prompt, k, 12, eos)
        eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=40)
        res = eng.generate([prompt], SamplingParams(max_tokens=12, beam_width=k,
                                                    stop_token_ids=(eos,), ignore_eos=True))[0]
        assert res.token_ids == want, (k, i)
        assert len(res.completions) == k
        eng.kv.check_leaks()


def test_n_samples_fork_prompt_pages():
    prompt = tiny_prompts([40], seed=500)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=32, enable_inline=False)
    params = SamplingParams(max_tokens=6, n=3, temperature=0.9, seed=11, ignore_eos=True)
    res = eng.generate([prompt], params)[0]
    stats = eng.kv.stats()
    assert stats["admitted"] == 1  # one prefill for three completions
    assert stats["copies"] == 2 and stats["copied_tokens"] == 2 * (40 % 16)  # partial page only
    assert len(res.completions) == 3 and res.generated_tokens == 18
    for i, comp in enumerate(res.completions):  # child i samples like a request seeded seed+i
        single = SamplingParams(max_tokens=6, temperature=0.9, seed=11 + i, ignore_eos=True)
        assert eng.generate([prompt], single)[0].token_ids == comp.token_ids
    assert len({tuple(c.token_ids) for c in res.completions}) > 1


def test_cancel_mid_stream_releases_every_page():
    prompts = tiny_prompts([40, 20], seed=600)
    eng = engine_for(tiny(), kv_dtype="int8", page_tokens=16, num_pages=32, enable_inline=False)
    keep = eng.add_request(prompts[0], greedy(20, ignore_eos=True))
    drop = eng.add_request(prompts[1], greedy(20, ignore_eos=True))
    for _ in range(4):
        eng.step()
    live_before = eng.kv.stats()["pages_live"]
    eng.cancel(drop)
    assert eng.kv.stats()["pages_live"] == live_before - 2  # its two pages, nothing else
    results = {}
    while eng.has_unfinished():
        for ev in eng.step():
            if ev.result:
                results[ev.request_id] = ev.result
    assert results[drop].finish_reason == "cancelled" and results[keep].finish_reason == "length"
    assert 0 < len(results[drop].token_ids) < 20
    eng.kv.check_leaks()


def test_invalid_requests_raise_request_error():
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=4)
    with pytest.raises(RequestError, match="KV pool"):
        eng.add_request(list(range(3, 70)), greedy(20))
    with pytest.raises(RequestError, match="vocabulary"):
        eng.add_request([TINY_VOCAB + 5], greedy(2))
    with pytest.raises(RequestError, match="empty"):
        eng.add_request([], greedy(2))


def test_int8_kv_close_to_fp32():
    prompt = tiny_prompts([60], seed=700)[0]
    out = {}
    for dtype in ("fp32", "int8"):
        eng = engine_for(tiny(), kv_dtype=dtype, page_tokens=16, num_pages=16)
        out[dtype] = eng.generate([prompt], greedy(10, ignore_eos=True))[0].token_ids
    agree = sum(a == b for a, b in zip(out["fp32"], out["int8"]))
    assert agree >= 5, out  # random weights are fragile; the real-model figure is in docs/engine.md
    assert torch.tensor(out["int8"]).max() < TINY_VOCAB


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_on_int8_kv_generates_like_the_fp32_model(dtype):
    """A bf16/fp16 model on the default int8 KV (C decode attention, float32 only) generates;
    it used to fail an assert on q's dtype in the first decode step."""
    from edge_runtime.model.loader import load_model

    prompt = tiny_prompts([30], seed=702)[0]
    out = {name: engine_for(model, kv_dtype="int8", page_tokens=16, num_pages=16)
           .generate([prompt], greedy(8, ignore_eos=True))[0].token_ids
           for name, model in (("fp32", tiny()), ("half", load_model(str(tiny_folder()), dtype=dtype,
                                                                      progress=None)))}
    assert len(out["half"]) == 8 and sum(a == b for a, b in zip(out["fp32"], out["half"])) >= 4, out


def test_stop_string_ends_generation_and_is_not_in_text():
    prompt = tiny_prompts([12], seed=1100)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16)
    full = eng.generate([prompt], greedy(24, ignore_eos=True))[0]
    stop = full.text[len(full.text) // 2:][:3]
    assert stop.strip(), full.text
    res = eng.generate([prompt], greedy(24, ignore_eos=True, stop=(stop,)))[0]
    assert res.finish_reason == "stop" and res.text == full.text[:full.text.index(stop)]
    assert res.token_ids == full.token_ids[:len(res.token_ids)] and len(res.token_ids) < 24


def test_admission_pause_holds_requests_until_resumed():
    prompt = tiny_prompts([10], seed=1200)[0]
    eng = engine_for(tiny(), kv_dtype="int8", page_tokens=16, num_pages=16)
    eng.set_admission_paused(True)
    rid = eng.add_request(prompt, greedy(3, ignore_eos=True))
    assert eng.step() == [] and eng.last_step_tokens == 0 and eng.has_unfinished()
    eng.set_admission_paused(False)
    done = [ev.result for _ in range(10) for ev in eng.step() if ev.result]
    assert done and done[0].request_id == rid and len(done[0].token_ids) == 3


def test_beam_group_survives_preemption():
    prompts = tiny_prompts([30, 28, 33], seed=1300)
    eos = hf_greedy(tiny_hf(), prompts[0], 4)[2]
    want_beam = hf_beam(tiny_hf(), prompts[0], 3, 20, eos)
    want = [hf_greedy(tiny_hf(), p, 20) for p in prompts[1:]]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=10, enable_inline=False,
                     max_num_seqs=6, max_batch_tokens=100)
    beam = SamplingParams(max_tokens=20, beam_width=3, stop_token_ids=(eos,), ignore_eos=True)
    res = eng.generate([prompts[1], prompts[2], prompts[0]],  # the beam group is the newest
                       [greedy(20, ignore_eos=True)] * 2 + [beam])
    assert [r.token_ids for r in res] == want + [want_beam]
    assert eng.stats()["preemptions"] > 0
    eng.kv.check_leaks()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_UNCONSTRAINED = {}


@settings(max_examples=4, deadline=None, derandomize=True)
@given(lengths=st.lists(st.integers(1, 40), min_size=2, max_size=5),
       page_tokens=st.sampled_from([4, 8, 16]), spare=st.integers(0, 6),
       inline=st.booleans(), max_batch=st.integers(8, 64))
def test_any_small_pool_gives_unconstrained_outputs(lengths, page_tokens, spare, inline, max_batch):
    prompts = tiny_prompts(lengths, seed=1400)
    key = tuple(lengths)
    if key not in _UNCONSTRAINED:
        big = engine_for(tiny(), kv_dtype="fp32", page_tokens=64, num_pages=32)
        _UNCONSTRAINED[key] = [r.token_ids for r in big.generate(prompts, greedy(12, ignore_eos=True))]
    need = -(-(max(lengths) + 12) // page_tokens) + 1  # the largest request alone, plus a CoW page
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=page_tokens, num_pages=need + spare,
                     enable_inline=inline, inline_tokens=page_tokens, max_num_seqs=4,
                     max_batch_tokens=max_batch)
    results = eng.generate(prompts, greedy(12, ignore_eos=True))
    assert [r.token_ids for r in results] == _UNCONSTRAINED[key]
    assert all(r.finish_reason == "length" for r in results)
    eng.kv.check_leaks()


@settings(max_examples=5, deadline=None, derandomize=True)
@given(shared=st.integers(32, 60), tails=st.lists(st.integers(1, 12), min_size=2, max_size=4),
       page_tokens=st.sampled_from([4, 8, 16]), spare=st.integers(0, 6), inline=st.booleans(),
       max_batch=st.integers(40, 128))
def test_arriving_together_with_one_prefix_under_any_small_pool(shared, tails, page_tokens, spare,
                                                                inline, max_batch):
    """Same-step sharing (scheduler policy 5) under chunking, small pools and preemption: the
    answers of an engine without a prefix cache."""
    system = tiny_prompts([shared], seed=1500)[0]
    prompts = [system + t for t in tiny_prompts(tails, seed=1501)]
    params = greedy(8, ignore_eos=True)
    alone = engine_for(tiny(), kv_dtype="fp32", page_tokens=64, num_pages=32,
                       enable_prefix_cache=False).generate(prompts, params)
    need = -(-(max(map(len, prompts)) + 8) // page_tokens) + 1  # the largest alone + a CoW page
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=page_tokens, num_pages=need + spare,
                     enable_inline=inline, inline_tokens=page_tokens, max_num_seqs=4,
                     max_batch_tokens=max_batch)
    results = eng.generate(prompts, params)
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]
    assert all(r.finish_reason == "length" for r in results)
    eng.kv.check_leaks()


def test_n_samples_with_the_largest_seed_wrap_instead_of_failing():
    """seed 2**64 - 1 with n = 3: children are seeded seed + i modulo 2**64 (0 and 1), where the
    unwrapped seed used to raise inside step() and stop the engine for good."""
    prompt = tiny_prompts([12], seed=510)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16)
    top = (1 << 64) - 1
    res = eng.generate([prompt], SamplingParams(max_tokens=4, n=3, temperature=0.9, seed=top,
                                                ignore_eos=True))[0]
    assert [c.finish_reason for c in res.completions] == ["length"] * 3
    for i, comp in enumerate(res.completions[1:], start=1):
        single = SamplingParams(max_tokens=4, temperature=0.9, seed=i - 1, ignore_eos=True)
        assert eng.generate([prompt], single)[0].token_ids == comp.token_ids
    eng.kv.check_leaks()


def test_add_request_that_raises_leaves_nothing_behind(monkeypatch):
    """add_request is all or nothing: a failure while building the request stores no entry, so
    the id stays free and the engine has no orphan request."""
    import edge_runtime.engine.seq_lifecycle as lifecycle_module  # where sequences are made

    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=8)
    real = lifecycle_module.make_generator

    def broken(seed):
        raise ValueError("no generator")

    monkeypatch.setattr(lifecycle_module, "make_generator", broken)
    with pytest.raises(ValueError, match="no generator"):
        eng.add_request([5, 6, 7], greedy(2), request_id="r1")
    assert eng.requests == {} and not eng.has_unfinished()
    monkeypatch.setattr(lifecycle_module, "make_generator", real)
    assert eng.add_request([5, 6, 7], greedy(2), request_id="r1") == "r1"
    while eng.has_unfinished():
        eng.step()
    eng.kv.check_leaks()


def test_a_request_that_outgrows_the_pool_says_why():
    """Alone and still out of pages: finish_reason "error" and the reason on the result (a client
    used to get "error" with no message)."""
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=4, enable_inline=False)
    res = eng.generate([tiny_prompts([40], seed=520)[0]], greedy(40, ignore_eos=True))[0]
    assert res.finish_reason == "error" and "KV pool cannot hold this request" in res.error
    ok = eng.generate([tiny_prompts([10], seed=521)[0]], greedy(4, ignore_eos=True))[0]
    assert ok.finish_reason == "length" and ok.error is None
    eng.kv.check_leaks()


def test_cancelled_beam_search_reports_its_live_beams():
    """Cancel a beam search after its first sequence was dropped (no beam chose it): the result
    holds the k running beams, each "cancelled", where it used to hold the dropped beam's stale
    tokens with finish_reason None."""
    prompt = tiny_prompts([12], seed=0)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16)
    rid = eng.add_request(prompt, SamplingParams(max_tokens=12, beam_width=3, ignore_eos=True))
    first = eng.requests[rid].seqs[0]
    steps = 0
    while first.status.name != "FINISHED":
        eng.step()
        steps += 1
        assert steps < 12, "beam 0 was never dropped; pick another prompt"
    eng.cancel(rid)
    res = [ev.result for ev in eng.step() if ev.result][0]
    assert [c.finish_reason for c in res.completions] == ["cancelled"] * 3
    assert all(len(c.token_ids) == steps for c in res.completions)  # the prefill step + decodes
    eng.kv.check_leaks()


@pytest.mark.parametrize("inline", [True, False])
def test_cancels_preempts_and_evictions_at_random_keep_the_rest_identical(inline):
    """A mixed batch (shared system prompt, greedy n=2, beams, seeded sampling) on a pool that
    preempts, with cancels (waiting, mid-prefill, mid-decode, after finish), guard preemptions and
    evictions at random steps: invariants hold every step, the requests not cancelled give what
    each gives alone on a large pool, and every page comes back."""
    import random

    rng = random.Random(7)
    system = tiny_prompts([40], seed=1500)[0]
    prompts = [system + p if i % 2 else p
               for i, p in enumerate(tiny_prompts([6, 9, 30, 4, 20, 12, 25, 3], seed=1501))]
    plist = [greedy(10, ignore_eos=True), SamplingParams(max_tokens=8, n=2, ignore_eos=True),
             SamplingParams(max_tokens=8, beam_width=2, ignore_eos=True),
             SamplingParams(max_tokens=9, temperature=0.9, seed=3, ignore_eos=True)] * 2
    alone = [engine_for(tiny(), kv_dtype="fp32", page_tokens=64, num_pages=8).generate([p], sp)[0]
             for p, sp in zip(prompts, plist)]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=10, enable_inline=inline,
                     inline_tokens=16, max_num_seqs=4, max_batch_tokens=24)
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, plist)]
    eng.cancel(ids[4])  # before its prefill
    results = {ev.request_id: ev.result for ev in eng.step() if ev.result}
    first = eng.requests[ids[1]].seqs[0]
    assert 0 < first.num_computed < len(prompts[1])  # n=2 with 49 prompt tokens, 24 a step
    eng.cancel(ids[1])  # mid-prefill
    cancelled = {ids[1], ids[4]}
    while eng.has_unfinished():
        roll = rng.random()
        if roll < 0.08:
            rid = rng.choice(ids)
            cancelled |= {rid} - set(results)  # a finished request: cancel is a no-op
            eng.cancel(rid)
        elif roll < 0.16:
            eng.preempt_newest(1)
        elif roll < 0.24:
            eng.evict_cached(rng.choice([None, 2]))
        results.update((ev.request_id, ev.result) for ev in eng.step() if ev.result)
    assert eng.stats()["preemptions"] > 0 and len(cancelled) > 3  # 2 above, 2+ at random
    for rid, want in zip(ids, alone):
        got = results[rid]
        if rid in cancelled:
            assert {c.finish_reason for c in got.completions} == {"cancelled"}, got
        else:
            assert [c.token_ids for c in got.completions] == [c.token_ids for c in want.completions]
    eng.kv.check_leaks()
    eng.evict_cached()
    assert eng.kv.stats()["pages_free"] == 10


def test_request_that_fits_a_cold_pool_is_not_failed_by_a_prefix_hit():
    """2 pages of 64: B (48 prompt tokens, n=2) needs 2 pages cold, but after A left a cached page
    holding the shared system prompt, B's plan pins that page, puts its tail in the other, and its
    fork has nowhere to copy the partial page. B used to fail with "error" while alone; it is now
    restarted once on an emptied cache and gives the cold engine's completions."""
    system = tiny_prompts([40], seed=1600)[0]
    a, b = (system + p for p in tiny_prompts([10, 8], seed=1601))
    params = SamplingParams(max_tokens=8, n=2, ignore_eos=True)
    cold = engine_for(tiny(), kv_dtype="fp32", page_tokens=64, num_pages=2, enable_inline=False)
    want = cold.generate([b], params)[0]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=64, num_pages=2, enable_inline=False)
    assert eng.generate([a], greedy(4, ignore_eos=True))[0].finish_reason == "length"
    got = eng.generate([b], params)[0]
    assert got.error is None and want.error is None
    assert [c.token_ids for c in got.completions] == [c.token_ids for c in want.completions]
    eng.kv.check_leaks()
