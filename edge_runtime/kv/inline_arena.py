"""Inline arena: small fixed slots for short private tails (no torch).

A request whose uncached prompt tokens plus max_new_tokens fit in one slot keeps its private tail
there, so a 20-token voice command does not pin a 512-token page. A tail that outgrows its slot is
moved to pages by KVManager.reserve (a CopyOp). Slots are never indexed by the prefix cache; on
finish KVManager moves a slot's content into a page so the next turn can find it.

Invariants:
- Every slot is free (ref 0, in the free queue) or used (ref > 0); used + free == num_slots.
- `num_tokens[slot]` is the number of committed tokens in the slot, <= slot_tokens; only the
  slot's owner appends (a forked child that wants to write copies the slot first).
"""

from __future__ import annotations

from collections import deque


class InlineArena:
    def __init__(self, num_slots: int, slot_tokens: int):
        assert num_slots >= 0 and slot_tokens >= 0, (num_slots, slot_tokens)
        self.num_slots = num_slots
        self.slot_tokens = slot_tokens
        self.ref_count = [0] * num_slots
        self.owner: list = [None] * num_slots
        self.num_tokens = [0] * num_slots
        self.free_queue: deque[int] = deque(range(num_slots))

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    @property
    def num_used(self) -> int:
        return self.num_slots - self.num_free

    def allocate(self, owner) -> int | None:
        """A free slot owned by `owner`, or None when all are in use (caller falls back to pages)."""
        if not self.free_queue:
            return None
        slot = self.free_queue.popleft()
        assert self.ref_count[slot] == 0, slot
        self.ref_count[slot], self.owner[slot], self.num_tokens[slot] = 1, owner, 0
        return slot

    def incref(self, slot: int) -> None:
        assert self.ref_count[slot] > 0, f"incref of free slot {slot}"
        self.ref_count[slot] += 1

    def decref(self, slot: int, seq_id) -> None:
        assert self.ref_count[slot] > 0, f"decref of free slot {slot}"
        self.ref_count[slot] -= 1
        if self.owner[slot] == seq_id:
            self.owner[slot] = None
        if self.ref_count[slot] == 0:
            self.owner[slot], self.num_tokens[slot] = None, 0
            self.free_queue.append(slot)

    def append(self, slot: int, seq_id, count: int) -> None:
        assert self.owner[slot] == seq_id, f"slot {slot} written by non-owner {seq_id}"
        assert self.num_tokens[slot] + count <= self.slot_tokens, (slot, count)
        self.num_tokens[slot] += count

    def check_invariants(self) -> None:
        free = set(self.free_queue)
        assert len(free) == len(self.free_queue), "slot twice in the free queue"
        for slot in range(self.num_slots):
            assert (self.ref_count[slot] == 0) == (slot in free), slot
            assert 0 <= self.num_tokens[slot] <= self.slot_tokens, slot
