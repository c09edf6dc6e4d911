"""Paged attention over int8 (or float) pages read through a block table; decode and prefill.

The torch reference and the segment merge live in paged_attention_ref.py (re-exported here).
"""
from edge_runtime.kernels.paged_attention_ref import merge_attention_ref, paged_attention_ref

merge_attention = merge_attention_ref

__all__ = ["paged_attention_ref", "merge_attention", "merge_attention_ref"]
