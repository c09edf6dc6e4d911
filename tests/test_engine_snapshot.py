"""Engine.snapshot() (engine/snapshot.py): what the service and the guard read of an engine, at one
moment: the requests in the batch and every unfinished one, the pool's bytes and pages, what a
regrow brings back; frozen."""

import dataclasses

import pytest

from engine_helpers import engine_for, greedy, tiny, tiny_prompts

from edge_runtime.engine.snapshot import EngineSnapshot


def test_snapshot_follows_requests_from_waiting_to_running_to_done():
    engine = engine_for(tiny(), kv_dtype="fp32", page_tokens=16, num_pages=16, max_num_seqs=1)
    first, second = (engine.add_request(p, greedy(3)) for p in tiny_prompts([9, 7], seed=4))
    before = engine.snapshot()
    assert before.running_request_ids == frozenset()  # nothing scheduled yet
    assert before.held_request_ids == {first, second}
    engine.step()
    during = engine.snapshot()
    assert during.running_request_ids == {first}  # one sequence slot: the second waits
    assert during.held_request_ids == {first, second}
    while engine.has_unfinished():
        engine.step()
    after = engine.snapshot()
    assert after.running_request_ids == after.held_request_ids == frozenset()
    assert after.pool_bytes == engine.storage.pool.nbytes() and after.num_pages == 16
    assert after.next_regrow_pages == 0 and after.pool_bytes_released == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        after.num_pages = 1


def test_a_snapshot_with_a_running_request_that_is_not_held_is_refused():
    with pytest.raises(AssertionError, match="r2"):
        EngineSnapshot(frozenset({"r1", "r2"}), frozenset({"r1"}), 0, 1, 0, 0)
