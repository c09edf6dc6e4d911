"""The KV cache end to end (docs/pool.md, docs/engine.md).

- Bookkeeping, no torch: the page pool (page_pool.py), the prefix tree (prefix_cache.py), the
  inline arena (inline_arena.py), tails and copy-on-write (tail_allocator.py), the recent-key
  windows (recent_window.py), giving pages back (pool_shrink.py), behind the `KVManager` facade
  (manager.py) whose block tables are `SeqKV`s (seq_kv.py).
- Storage: the preallocated tensors (storage.py over store.py; chunk by chunk on CUDA,
  chunked_pool.py), pool chunks returned and regrown (pool_resize.py), the centred keys'
  means (key_means.py); setup.py builds storage and manager for an engine.
- The per-back-end step contexts the forward reads (model/kv_interface.py): flat_context.py
  (CPU) and paged_context.py (CUDA; decode_shape.py pads its decode steps for CUDA graphs).

Importing the package imports only the bookkeeping.
"""

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.seq_kv import CopyOp, Segments, SeqKV

__all__ = ["KVManager", "CopyOp", "Segments", "SeqKV"]
