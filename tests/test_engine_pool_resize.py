"""Engine.shrink_pool / grow_pool (kv/pool_resize.py): whole chunks leave service while
requests run, live pages are relocated, outputs stay identical, memory goes back to the OS on CPU,
and growing restores the budgeted pool."""

import gc

import pytest
from torch.multiprocessing.reductions import StorageWeakRef

from backend_helpers import engine_on
from engine_helpers import engine_for, greedy, hf_greedy, tiny, tiny_hf, tiny_prompts
from model_helpers import random_ids

from edge_runtime.guard.engine_hooks import EngineGuardHooks
from edge_runtime.kernels import dispatch


def test_shrink_mid_generation_keeps_outputs_and_returns_memory():
    prompts = tiny_prompts([40, 37, 45], seed=700)
    expected = [hf_greedy(tiny_hf(), p, 20) for p in prompts]
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=24, enable_inline=False)
    rids = [eng.add_request(p, greedy(20, ignore_eos=True)) for p in prompts]
    for _ in range(6):  # prompts computed, a few tokens decoded: pages are live all over the pool
        eng.step()
    live_before = eng.kv.stats()["pages_live"]
    assert live_before > 0
    assert eng.shrink_pool(2) == 2  # the two highest chunks: 12 of 24 pages
    stats = eng.kv.stats()
    assert stats["pages_retired"] == 12 and stats["pages_live"] == live_before
    assert eng.counters["pool_bytes_released"] > 0  # madvise on CPU
    assert all(p < 12 for s in eng.kv.seqs.values() for p in s.all_pages())
    eng.kv.check_invariants()
    results = {}
    while eng.has_unfinished():
        for ev in eng.step():
            if ev.result is not None:
                results[ev.request_id] = ev.result
    assert [results[r].token_ids for r in rids] == expected
    assert eng.grow_pool() == 2
    stats = eng.kv.stats()
    assert stats["pages_retired"] == 0 and stats["pages_free"] + stats["pages_cached"] == 24
    assert eng.generate([prompts[0]], greedy(20, ignore_eos=True))[0].token_ids == expected[0]


def test_shrink_never_retires_the_first_chunk_nor_live_pages_without_room():
    eng = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=8, enable_inline=False)
    eng.add_request(tiny_prompts([100], seed=710)[0], greedy(4, ignore_eos=True))
    eng.step()  # 7 pages live out of 8: no room to relocate any chunk's live pages
    assert eng.shrink_pool(4) == 0 and eng.kv.stats()["pages_retired"] == 0
    eng.kv.check_invariants()
    while eng.has_unfinished():
        eng.step()
    assert eng.shrink_pool(10) == 3  # 4 chunks of 2 pages, the first stays
    assert eng.kv.stats()["pages_retired"] == 6


def _chunk_storages(engine, c):
    """Weak references to the storages of the CUDA back end's pool chunk c."""
    return [StorageWeakRef(t.untyped_storage()) for t in engine.storage.pool.chunks[c].tensors()]


def _shrink_regrow_scenario(engine):
    """A 2-page pool (2 chunks of one page; few tokens: the CUDA back end runs interpreted): a
    finished prompt's page cached, a live sequence in the top chunk when it is retired mid-
    generation, generation finished, the chunk regrown and written again -> (token ids of every
    completion, states of the top chunk's pages before the shrink, bytes released, weak references
    to the retired chunk's storages or None)."""
    params = greedy(3, ignore_eos=True)
    out = [r.token_ids for r in engine.generate([random_ids(30, 500, seed=60)], params)]  # page 0
    rid = engine.add_request(random_ids(20, 500, seed=61), params)  # the free page 1
    for _ in range(2):  # the prompt in, a token decoded
        engine.step()
    top = engine.pool_chunks.ranges[-1]
    states = [engine.kv.pool.pages[p].state for p in range(*top)]
    storages = _chunk_storages(engine, len(engine.pool_chunks.ranges) - 1) \
        if engine.backend.pool_in_chunks else None
    hooks = EngineGuardHooks(engine)  # as the memory guard acts
    assert hooks.shrink_pool(1) == 1  # the live page moves to page 0, the cached one evicted
    released = engine.stats()["pool_bytes_released"]  # what /metrics shows
    assert hooks.released_bytes == released and hooks.next_regrow_bytes() == engine.storage.pool.nbytes() // 2
    results = {}
    while engine.has_unfinished():
        results.update({ev.request_id: ev.result for ev in engine.step() if ev.result is not None})
    out.append(results[rid].token_ids)
    assert hooks.grow_pool(1) == 1
    out += [r.token_ids for r in engine.generate([random_ids(20, 500, seed=63)], params)]
    assert any(engine.kv.pool.pages[p].state != "free" for p in range(*top))  # regrown, written
    engine.kv.check_leaks()
    return out, states, released, storages


def test_cuda_back_end_hands_back_a_retired_chunk_and_regrows_it():
    """The CUDA back end (on CPU tensors, Triton interpreter) with its pool in chunks: the top
    chunk, holding live pages, is retired mid-generation through the guard's hooks, its tensors
    freed (no reference left anywhere in the engine) and its bytes reported as on the CPU back end
    (stats, hence /metrics); generation goes on, the chunk is regrown and used; greedy tokens
    equal the CPU back end's through the same steps."""
    if not dispatch.triton_importable():
        pytest.skip("needs triton (interpreter)")
    want, cpu_states, _, _ = _shrink_regrow_scenario(engine_on("cpu", num_pages=2, enable_inline=False))
    cuda = engine_on("cuda", num_pages=2, enable_inline=False)
    chunk = cuda.storage.pool.chunks[-1]
    chunk_bytes = sum(t.numel() * t.element_size() for t in chunk.tensors())
    del chunk
    got, states, released, storages = _shrink_regrow_scenario(cuda)
    assert "live" in states and states == cpu_states  # the retired chunk held live K/V
    assert released == chunk_bytes > 0
    gc.collect()
    assert all(s.expired() for s in storages)  # freed, not merely unused
    assert got == want
