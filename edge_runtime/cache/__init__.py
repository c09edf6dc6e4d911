"""KV bookkeeping (no torch): page pool, prefix cache, inline arena, the KVManager facade."""

from edge_runtime.cache.kv_manager import KVManager
from edge_runtime.cache.kv_types import CopyOp, Segments, SeqKV

__all__ = ["KVManager", "CopyOp", "Segments", "SeqKV"]
