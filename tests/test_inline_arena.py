"""InlineArena: slot allocation order, ref counts, owner-only appends."""

from __future__ import annotations

import pytest

from edge_runtime.kv.inline_arena import InlineArena


def test_slots_allocate_in_order_and_return_to_the_back():
    arena = InlineArena(3, 8)
    assert [arena.allocate("a"), arena.allocate("b")] == [0, 1]
    arena.append(0, "a", 5)
    arena.decref(0, "a")
    assert list(arena.free_queue) == [2, 0] and arena.num_tokens[0] == 0
    assert arena.allocate("c") == 2 and arena.allocate("d") == 0
    assert arena.allocate("e") is None and arena.num_used == 3
    arena.check_invariants()


def test_shared_slot_is_freed_by_the_last_reference_and_only_the_owner_appends():
    arena = InlineArena(1, 4)
    slot = arena.allocate("p")
    arena.append(slot, "p", 2)
    arena.incref(slot)  # a fork
    with pytest.raises(AssertionError):
        arena.append(slot, "child", 1)
    with pytest.raises(AssertionError):
        arena.append(slot, "p", 3)  # past the slot
    arena.decref(slot, "p")
    assert arena.owner[slot] is None and arena.ref_count[slot] == 1 and arena.num_free == 0
    arena.decref(slot, "child")
    assert arena.num_free == 1
    arena.check_invariants()
