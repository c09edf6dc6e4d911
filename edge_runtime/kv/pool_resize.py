"""Whole chunks of the page pool handed back to the OS and regrown (memory-guard actions).

The pool's page ids are split here into `num_chunks` ranges of `chunk_pages(num_pages)` pages (the
last may be smaller). Shrinking takes the highest chunk still in service: the KVManager retires its
page range (cached pages evicted, live pages relocated below it through CopyOps and block-table
edits, kv/pool_shrink.py), the engine runs the copies, then KVStorage releases the range's
memory: on the CPU back end's flat pool with madvise(MADV_DONTNEED), so RSS falls; on the CUDA
back end, whose pool is one allocation per chunk of these ranges (kv/chunked_pool.py), by
dropping the chunk's tensors and emptying the caching allocator's cache. Growing puts chunks back,
the last retired first (the guard grows one at a time while there is room for it), and makes them
resident (on CUDA: allocates them again).

Invariants: the first chunk is never retired (the engine always has pages); chunks are retired in
descending order and restored in ascending-retirement (LIFO) order; a chunk whose live pages find
no room elsewhere (OutOfPages) is left in service and stops the shrink, with nothing changed.
Callers hold the engine lock, so no step runs between the copies and the release.
"""

from __future__ import annotations

from edge_runtime.errors import OutOfPages

DEFAULT_NUM_CHUNKS = 4


def chunk_pages(num_pages: int, num_chunks: int = DEFAULT_NUM_CHUNKS) -> int:
    """Pages per chunk (the last chunk may hold fewer)."""
    num_chunks = max(1, min(num_chunks, num_pages))
    return -(-num_pages // num_chunks)


class PoolChunks:
    def __init__(self, num_pages: int, num_chunks: int = DEFAULT_NUM_CHUNKS):
        size = chunk_pages(num_pages, num_chunks)
        self.ranges = [(s, min(s + size, num_pages)) for s in range(0, num_pages, size)]
        self.retired: list[tuple[int, int]] = []  # a stack: the last retired is restored first

    @property
    def num_in_service(self) -> int:
        return len(self.ranges) - len(self.retired)

    def shrink(self, kv, storage, n_chunks: int) -> tuple[int, int]:
        """Retire up to n_chunks chunks; returns (chunks retired, bytes handed to the OS)."""
        done, released = 0, 0
        for start, end in reversed(self.ranges[1:]):
            if done == n_chunks:
                break
            if (start, end) in self.retired:
                continue
            try:
                copies = kv.retire_pages(start, end)
            except OutOfPages:
                break
            for op in copies:
                storage.copy(op)
            released += storage.release_pages(start, end)
            self.retired.append((start, end))
            done += 1
        return done, released

    def next_regrow_pages(self) -> int:
        """Pages the next grow(n_chunks=1) puts back (0: none retired)."""
        return self.retired[-1][1] - self.retired[-1][0] if self.retired else 0

    def grow(self, kv, storage, n_chunks: int | None = None) -> int:
        """Put up to n_chunks (None: every) retired chunks back in service; returns how many."""
        n = 0
        while self.retired and (n_chunks is None or n < n_chunks):
            start, end = self.retired.pop()
            storage.regrow_pages(start, end)
            kv.restore_pages(start, end)
            n += 1
        return n
