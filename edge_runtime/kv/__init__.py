"""KV bookkeeping (no torch): page pool, prefix cache, inline arena, the KVManager facade."""

from edge_runtime.kv.manager import KVManager
from edge_runtime.kv.seq_kv import CopyOp, Segments, SeqKV

__all__ = ["KVManager", "CopyOp", "Segments", "SeqKV"]
