"""Engine.shrink_pool / grow_pool (engine/pool_resize.py): whole chunks leave service while
requests run, live pages are relocated, outputs stay identical, memory goes back to the OS on CPU,
and growing restores the budgeted pool."""

from engine_helpers import engine_for, greedy, hf_greedy, tiny, tiny_hf, tiny_prompts


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
