"""Decode steps at fixed shapes, one per batch-size bucket, replayed from CUDA graphs (CUDA back end).

A decode step of n sequences (one new token each, no prefill in the step) runs as the smallest
bucket B >= n: rows n..B-1 are padding (token 0 at position 0, an empty read, slot -1: nothing
written, nothing read; their logits rows are ignored). Every bucket has ONE shape: the step's
PagedKVContext built with the bucket's `DecodeShape` (kv/decode_shape.py: table widths that
hold any sequence up to max_position_embeddings, the span count of the longest read, one exact
block per row), so every step of the bucket has the same index tensors (names, shapes, dtypes)
and host values. The step's ids, positions, last rows and the context's `metadata()` are copied
in ONE upload into the bucket's static buffer (engine/step_transfers.py), which the bucket's
static context is bound to, then the bucket's graph replays: a few hundred launches become one.

On a CUDA device the graphs are captured at start-up (`capture()`: time and memory reported in
`stats()`; a capture that fails is reported there and in the log, and the steps run eagerly);
elsewhere (the CUDA back end on CPU tensors under the Triton interpreter, CI) the same padded
static step runs eagerly, which is how CI shows that padding leaves the real rows' logits the
same bits. A step that does not fit (a prefill token, more sequences than the largest bucket, a
table wider or a read longer than the shape) runs eagerly at its own shapes.

This module knows no context's structure: the padded context and the static one are the same
class built at the same shape, and their tensors travel by `metadata()` / `bind()` paths.

Invariants:
- The static buffers and the captured graphs are only touched under the engine's lock, one step
  at a time; the logits returned are a view of the bucket's static output, valid until the next
  step (the engine samples them within the step).
- A padded step reads and writes exactly what the unpadded step does (tests/test_cuda_graphs.py).
"""

from __future__ import annotations

import logging
import time

import torch

from edge_runtime.kv.decode_shape import DecodeShape, DoesNotFit
from edge_runtime.kv.paged_context import PagedKVContext
from edge_runtime.engine.step_transfers import StepTransfers, device_region

DEFAULT_BUCKETS = (1, 2, 4, 8, 16)


def bucket_for(num_seqs: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding num_seqs rows, or None (too many: eager)."""
    return next((b for b in sorted(buckets) if b >= num_seqs), None)


def padded_inputs(inputs: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """ids and positions padded with 0 to `rows`; every row's logits (the caller keeps the first n)."""
    n = inputs["ids"].shape[0]
    if n > rows:
        raise DoesNotFit(f"{n} rows in a bucket of {rows}")
    out = {"last_rows": torch.arange(rows)}
    for name in ("ids", "positions"):
        out[name] = torch.zeros(rows, dtype=inputs[name].dtype)
        out[name][:n] = inputs[name]
    return out


def decode_graphs_for(backend, model, storage, sm_scale: float, transfers: StepTransfers, config,
                      max_positions: int) -> "DecodeGraphs | None":
    """The decode buckets of an engine's step runner (EngineConfig.decode_buckets; None:
    DEFAULT_BUCKETS on a CUDA device), captured now on a GPU; None where there are none (the CPU
    back end, buckets off)."""
    buckets = config.decode_buckets
    if buckets is None:
        buckets = DEFAULT_BUCKETS if torch.device(config.device).type == "cuda" else ()
    if not buckets or not backend.decode_graphs:
        return None
    shapes = {b: DecodeShape.for_storage(storage, b, max_positions) for b in buckets}
    graphs = DecodeGraphs(backend, model, storage, sm_scale, transfers, shapes, max_positions)
    graphs.capture(log=logging.getLogger(__name__).info)
    return graphs


class DecodeGraphs:
    """The buckets of one engine: static buffers, static contexts and (on CUDA) their graphs."""

    def __init__(self, backend, model, storage, sm_scale: float, transfers: StepTransfers,
                 shapes: dict[int, DecodeShape], max_positions: int):
        self.backend, self.model, self.max_positions = backend, model, max_positions
        self.storage, self.sm_scale = storage, sm_scale
        self.buckets, self.shapes = tuple(sorted(shapes)), shapes
        self.transfers = transfers
        self.static: dict[int, tuple] = {}  # bucket -> (packed buffer, views, context)
        self.graphs: dict[int, tuple] = {}  # bucket -> (CUDAGraph, static logits)
        self.counters = dict(graph_steps=0, padded_eager_steps=0, eager_steps=0,
                             capture_s=0.0, capture_bytes=0)
        no_rows = {name: torch.zeros(0, dtype=torch.long) for name in ("ids", "positions")}
        for b in self.buckets:
            # an all-padding step: the bucket's names and shapes (sizes the buffer; captured)
            ctx = PagedKVContext(storage, [], sm_scale, shapes[b])
            buf, views = self.transfers.allocate(self._parts(ctx, no_rows, b))
            self.static[b] = (buf, views, ctx.bind(views))

    @staticmethod
    def _parts(ctx, inputs: dict[str, torch.Tensor], bucket: int) -> dict[str, torch.Tensor]:
        return {**padded_inputs(inputs, bucket), **ctx.metadata()}

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

    def run(self, steps, inputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The logits [n, vocab] of a decode step (steps: its SeqSteps, inputs: its host ids and
        positions) from its bucket (a view, valid until the next step), or None when it does not
        fit (the caller runs it eagerly)."""
        n = inputs["ids"].shape[0]
        bucket = bucket_for(n, self.buckets)
        if bucket is None or (self.backend.device.type == "cuda" and not self.graphs):
            # too many rows, or on a GPU whose capture failed: the padded step would only add work
            self.counters["eager_steps"] += 1
            return None
        try:
            ctx = PagedKVContext(self.storage, steps, self.sm_scale, self.shapes[bucket])
            parts = self._parts(ctx, inputs, bucket)
        except DoesNotFit:
            self.counters["eager_steps"] += 1
            return None
        buf, views, _ = self.static[bucket]
        assert parts.keys() == views.keys(), sorted(parts.keys() ^ views.keys())
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
