"""Decode steps at fixed shapes, one per batch-size bucket, replayed from CUDA graphs (CUDA back end).

A decode step of n sequences (one new token each, no prefill in the step) runs as the smallest
bucket B >= n: rows n..B-1 are padding (token 0 at position 0, kv_len 0 in every attention call,
slot -1: nothing written, nothing read; their logits rows are ignored). Every bucket has ONE
layout: the attention calls of every kind a decode step can make, in engine/paged_kv.py's order
(window, prefix, tail_pages, tail_inline; a kind the step does not use gets an all-zero table
and kv_len 0, which merge_attention weighs 0), block tables at fixed widths (the most pages a
sequence can hold), slot mappings of length B. The step's host tensors are packed in that layout
and copied in ONE upload into the bucket's static buffer (engine/step_transfers.py), then the
bucket's graph replays: a few hundred kernel launches become one.

On a CUDA device the graphs are captured at start-up (`capture()`: time and memory reported in
`stats()`; a capture that fails is reported there and in the log, and the steps run eagerly); elsewhere (the CUDA back end on CPU tensors under the Triton interpreter, CI) the
same padded static step runs eagerly, which is how CI shows that padding leaves the real rows'
logits unchanged. A step that does not fit (a prefill token, more sequences than the largest
bucket, a block table wider than the layout) runs eagerly at its own shapes.

`decode_layout`, `padded_parts` and `bind_static` are the only code here that knows
engine/paged_kv.py's structure (its per-kind calls, slot mappings, window slots): a context built
another way needs its own three (tests/test_cuda_graphs.py checks them against the eager step).

Invariants:
- The static buffers and the captured graphs are only touched under the engine's lock, one step
  at a time; the logits returned are a view of the bucket's static output, valid until the next
  step (the engine samples them within the step).
- A padded step reads and writes exactly what the unpadded step does (tests/test_cuda_graphs.py).
"""

from __future__ import annotations

import logging
import math
import time

import torch

from edge_runtime.engine.paged_kv import _Call
from edge_runtime.engine.step_transfers import StepTransfers, device_region

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)


def bucket_for(num_seqs: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding num_seqs rows, or None (too many: eager)."""
    return next((b for b in sorted(buckets) if b >= num_seqs), None)


def decode_layout(storage, max_positions: int, num_inline_slots: int) -> dict[str, int]:
    """kind -> fixed block-table width, for every call kind a decode step on `storage` can make."""
    pages = math.ceil(max_positions / storage.store("pages").block_tokens)
    layout = {}
    if storage.window is not None:
        layout["window"] = 1
    layout.update(prefix=pages, tail_pages=pages)
    if storage.inline is not None:
        layout["tail_inline"] = max(1, num_inline_slots)
    return layout


class NotFit(Exception):
    """The step cannot take the bucket's layout; it runs eagerly."""


def padded_parts(ctx, inputs: dict[str, torch.Tensor], bucket: int, layout: dict[str, int]
                 ) -> dict[str, torch.Tensor]:
    """The host tensors of a decode step in the bucket's fixed layout (names and shapes the same
    for every step of the bucket). ctx: the step's PagedKVContext, built on the host."""
    n = inputs["ids"].shape[0]
    if n > bucket or ctx.fresh is not None or any(c.kind not in layout for c in ctx.calls):
        raise NotFit
    calls = {c.kind: c for c in ctx.calls}
    parts = {"ids": _pad(inputs["ids"], bucket, 0), "positions": _pad(inputs["positions"], bucket, 0),
             "last_rows": torch.arange(bucket)}
    for kind, width in layout.items():
        table = torch.zeros(bucket, width, dtype=torch.int32)
        kv_lens = torch.zeros(bucket, dtype=torch.int32)
        if kind in calls:
            c = calls[kind]
            if c.block_table.shape[1] > width or c.block_table.shape[0] > bucket:
                raise NotFit
            table[:c.block_table.shape[0], :c.block_table.shape[1]] = c.block_table
            kv_lens[:n] = c.kv_lens
        parts.update({f"{kind}.block_table": table, f"{kind}.kv_lens": kv_lens,
                      f"{kind}.seq_idx": torch.arange(bucket, dtype=torch.int32)})
    for store in ("pages", "inline"):
        if store == "pages" or "tail_inline" in layout:
            parts[f"slots.{store}"] = _pad(ctx.slot_mapping.get(store), bucket, -1)
    if "window" in layout:
        parts["window_slots"] = _pad(ctx.window_slots, bucket, -1)
    return parts


def _pad(t: torch.Tensor | None, bucket: int, fill: int) -> torch.Tensor:
    out = torch.full((bucket,), fill, dtype=torch.long if t is None else t.dtype)
    if t is not None:
        out[:t.shape[0]] = t
    return out


def bind_static(ctx, views: dict[str, torch.Tensor], layout: dict[str, int], bucket: int):
    """Point `ctx` (the bucket's static context) at the static buffer's views."""
    stores = {"window": "window", "prefix": "pages", "tail_pages": "pages", "tail_inline": "inline"}
    ctx.calls = [_Call(stores[k], views[f"{k}.block_table"], views[f"{k}.seq_idx"],
                       views[f"{k}.kv_lens"], k) for k in layout]
    ctx.slot_mapping = {s: views[f"slots.{s}"] for s in ("pages", "inline") if f"slots.{s}" in views}
    ctx.window_slots = views.get("window_slots")
    ctx.fresh = None
    ctx.num_tokens = bucket
    return ctx


def decode_graphs_for(engine, num_inline_slots: int) -> "DecodeGraphs | None":
    """The engine's decode buckets (EngineConfig.decode_buckets; None: DEFAULT_BUCKETS on a CUDA
    device), captured now on a GPU; None where there are none (the CPU back end, buckets off)."""
    buckets = engine.config.decode_buckets
    if buckets is None:
        buckets = DEFAULT_BUCKETS if torch.device(engine.config.device).type == "cuda" else ()
    if not buckets or not engine.backend.decode_graphs:
        return None
    max_positions = engine.model_config.max_position_embeddings
    layout = decode_layout(engine.storage, max_positions, num_inline_slots)
    graphs = DecodeGraphs(engine.backend, engine.model, engine.storage, engine.sm_scale,
                          engine.transfers, buckets, layout, max_positions)
    graphs.capture(log=logging.getLogger(__name__).info)
    return graphs


class DecodeGraphs:
    """The buckets of one engine: static buffers, static contexts and (on CUDA) their graphs."""

    def __init__(self, backend, model, storage, sm_scale: float, transfers: StepTransfers,
                 buckets: tuple[int, ...], layout: dict[str, int], max_positions: int):
        from edge_runtime.engine.paged_kv import PagedKVContext

        self.backend, self.model, self.max_positions = backend, model, max_positions
        self.buckets, self.layout = tuple(sorted(buckets)), layout
        self.transfers = transfers
        self.static: dict[int, tuple] = {}  # bucket -> (packed buffer, views, context)
        self.graphs: dict[int, tuple] = {}  # bucket -> (CUDAGraph, static logits)
        self.counters = dict(graph_steps=0, padded_eager_steps=0, eager_steps=0,
                             capture_s=0.0, capture_bytes=0)
        for b in self.buckets:
            ctx = PagedKVContext.__new__(PagedKVContext)
            ctx.storage, ctx.sm_scale = storage, sm_scale
            template = self._template(b)
            buf, views = self.transfers.allocate(template)
            self.static[b] = (buf, views, bind_static(ctx, views, layout, b))

    def _template(self, bucket: int) -> dict[str, torch.Tensor]:
        """An all-padding step: the bucket's layout (used to size the buffer and to capture)."""
        parts = {"ids": torch.zeros(bucket, dtype=torch.long),
                 "positions": torch.zeros(bucket, dtype=torch.long), "last_rows": torch.arange(bucket)}
        for kind, width in self.layout.items():
            parts.update({f"{kind}.block_table": torch.zeros(bucket, width, dtype=torch.int32),
                          f"{kind}.kv_lens": torch.zeros(bucket, dtype=torch.int32),
                          f"{kind}.seq_idx": torch.arange(bucket, dtype=torch.int32)})
        parts["slots.pages"] = torch.full((bucket,), -1, dtype=torch.long)
        if "tail_inline" in self.layout:
            parts["slots.inline"] = torch.full((bucket,), -1, dtype=torch.long)
        if "window" in self.layout:
            parts["window_slots"] = torch.full((bucket,), -1, dtype=torch.long)
        return parts

    def _forward(self, bucket: int) -> torch.Tensor:
        _, views, ctx = self.static[bucket]
        return self.backend.forward(self.model, views["ids"], views["positions"], ctx,
                                    views["last_rows"], self.max_positions)

    def capture(self, log=print) -> None:
        """Capture every bucket's graph (CUDA only), largest first so the smaller ones share its
        memory pool; the time and the memory it took go to `counters` and `log`."""
        if self.backend.device.type != "cuda":
            return
        try:
            self._capture_all(log)
        except Exception as exc:  # noqa: BLE001 - reported (log + stats); the steps run eagerly
            self.graphs.clear()
            self.counters["capture_error"] = f"{type(exc).__name__}: {exc}"
            logging.getLogger(__name__).warning(f"CUDA graphs: capture failed ({self.counters['capture_error']}); decode steps run "
                f"eagerly (set decode_buckets: [] to skip the capture)")

    def _capture_all(self, log) -> None:
        t0, before = time.perf_counter(), torch.cuda.memory_reserved(self.backend.device)
        pool = None
        with torch.inference_mode():
            for b in reversed(self.buckets):
                side = torch.cuda.Stream(self.backend.device)
                side.wait_stream(torch.cuda.current_stream(self.backend.device))
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up: Triton compiles, the rope table is built
                        self._forward(b)
                torch.cuda.current_stream(self.backend.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits = self._forward(b)
                pool = graph.pool()
                self.graphs[b] = (graph, logits)
        torch.cuda.synchronize(self.backend.device)
        self.counters["capture_s"] = time.perf_counter() - t0
        self.counters["capture_bytes"] = torch.cuda.memory_reserved(self.backend.device) - before
        log(f"CUDA graphs: decode buckets {list(self.buckets)} captured in "
            f"{self.counters['capture_s']:.1f} s, {self.counters['capture_bytes'] / 2**20:.0f} MiB")

    def stats(self) -> dict:
        return dict(self.counters, buckets=list(self.buckets), captured=sorted(self.graphs))

    def run(self, ctx, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The step's logits [n, vocab] from its bucket (a view, valid until the next step), or
        None when it does not fit (the caller runs it eagerly)."""
        n = inputs["ids"].shape[0]
        bucket = bucket_for(n, self.buckets)
        if bucket is None or (self.backend.device.type == "cuda" and not self.graphs):
            # too many rows, or on a GPU whose capture failed: the padded step would only add work
            self.counters["eager_steps"] += 1
            return None
        try:
            parts = padded_parts(ctx, inputs, bucket, self.layout)
        except NotFit:
            self.counters["eager_steps"] += 1
            return None
        buf, _, _ = self.static[bucket]
        self.transfers.upload_into(buf, parts)
        with device_region():
            if bucket in self.graphs:
                graph, logits = self.graphs[bucket]
                graph.replay()
                self.counters["graph_steps"] += 1
            else:
                logits = self._forward(bucket)
                self.counters["padded_eager_steps"] += 1
            return logits[:n]
