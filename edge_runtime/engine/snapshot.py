"""What the service and the memory guard read of an Engine: a frozen copy taken under its lock
(`Engine.snapshot()`), so neither reaches into the scheduler, the request table or the storage.

Invariants: every field is read at one moment, between steps; running_request_ids <=
held_request_ids.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSnapshot:
    running_request_ids: frozenset[str]  # requests with a sequence in the batch
    held_request_ids: frozenset[str]  # every request the engine has unfinished
    pool_bytes: int  # bytes of the page pool's storage in service
    num_pages: int  # page ids of the budgeted pool (slices with layer groups: kv/layer_groups.py)
    next_regrow_pages: int  # pages the next regrown chunk brings back (0: nothing to regrow)
    pool_bytes_released: int  # pool bytes given back to the OS so far

    def __post_init__(self):
        assert self.running_request_ids <= self.held_request_ids, \
            sorted(self.running_request_ids - self.held_request_ids)
