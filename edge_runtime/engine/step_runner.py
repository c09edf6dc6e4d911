"""One step on the device, in the shape of nano-vllm's ModelRunner.run: the step's inputs, the
forward (its CUDA graph when a decode batch fits a bucket, else eagerly through the back end's KV
context), and the choice of the next tokens.

The Engine schedules, commits to the KV bookkeeping and emits; the runner holds what a step
touches on the device: the back end, the model, the KV storage, the host<->device transfers
(engine/step_transfers.py), the sampler and the decode graphs (engine/cuda_graphs.py). It reads
no request's lifecycle: it gets token ids and `SeqStep`s (kv/paged_context.py) and gives logits
and token ids back.

Invariants: a step's inputs and its KV context's index tensors go up in one upload, nothing inside
the device region waits for the device, and the chosen ids come down in one download.
"""

from __future__ import annotations

import torch

from edge_runtime.engine.cuda_graphs import decode_graphs_for
from edge_runtime.engine.sampler import SampleRows
from edge_runtime.engine.step_transfers import device_region
from edge_runtime.kv.paged_context import SeqStep


class StepRunner:
    def __init__(self, loaded_model, backend, storage, config):
        self.backend = backend
        self.model = loaded_model.model
        self.storage = storage
        self.transfers = backend.transfers()  # every host<->device copy of a step
        self.sampler = backend.sampler(self.transfers)
        self.sm_scale = loaded_model.config.attention_scale  # Gemma's is query_pre_attn_scalar ** -0.5
        self.graphs = decode_graphs_for(backend, self.model, storage, self.sm_scale, self.transfers,
                                        config, loaded_model.config.max_position_embeddings)

    def forward(self, ids: list[int], steps: list[SeqStep], last_rows: list[int]) -> torch.Tensor:
        """-> float32 [B, vocab] logits of rows `last_rows`, on the back end's device. The step's
        inputs and the KV context's index tensors go up in one upload; nothing inside waits for it."""
        positions = [p for s in steps for p in range(s.start, s.start + s.num_new)]
        inputs = {"ids": torch.tensor(ids, dtype=torch.long),
                  "positions": torch.tensor(positions, dtype=torch.long)}
        if len(last_rows) < len(ids):  # rows increase: as many as ids are every row, none to pick
            inputs["last_rows"] = torch.tensor(last_rows, dtype=torch.long)
        if self.graphs is not None and len(ids) == len(steps) == len(last_rows):  # a decode step
            logits = self.graphs.run(steps, inputs)
            if logits is not None:
                return logits
        ctx = self.backend.context(self.storage, steps, self.sm_scale)
        dev = self.transfers.upload({**inputs, **ctx.metadata()})
        ctx.bind(dev)
        num_positions = max(s.start + s.num_new for s in steps)
        with torch.inference_mode(), device_region():
            return self.backend.forward(self.model, dev["ids"], dev["positions"], ctx,
                                        dev.get("last_rows"), num_positions)

    def every_position_logits(self, ids: list[int], step: SeqStep) -> torch.Tensor:
        """float32 [n, vocab] on the host: the logits of every position of one sequence's chunk
        (scoring, engine/scoring.py)."""
        device = self.storage.device
        ctx = self.backend.context(self.storage, [step], self.sm_scale)
        ctx.bind(self.transfers.upload(ctx.metadata()))
        positions = torch.arange(step.start, step.start + step.num_new, device=device)
        with torch.inference_mode():
            logits = self.backend.forward(self.model, torch.tensor(ids, dtype=torch.long, device=device),
                                          positions, ctx, None)
        return logits.float().cpu()

    def sample(self, logits: torch.Tensor, rows: SampleRows, constraints, masks=None):
        """(token ids, logprobs) of `rows` (engine/sampler.py), chosen where the logits are."""
        with torch.inference_mode(), device_region():
            return self.sampler.choose(logits, rows, constraints, masks)

    def top_candidates(self, logits_rows: list, scores: list[float], keep: int):
        """Beam search's `keep` best (beam, token) candidates, computed where the logits are; only
        those cross to the host (one upload of the scores, one download) -> (float32 values, long
        flat indices into [num_beams * vocab])."""
        dev = self.transfers.upload({"scores": torch.tensor(scores, dtype=torch.float32)})
        with device_region():
            logits = torch.stack(logits_rows).float()  # [nb, V]
            acc = (torch.log_softmax(logits, dim=-1) + dev["scores"][:, None]).reshape(-1)  # [nb * V]
            top_vals, top_idx = torch.topk(acc, keep)
            flat = self.transfers.download(torch.cat([top_vals.double(), top_idx.double()]))
        return (torch.tensor(flat[:keep], dtype=torch.float32),
                torch.tensor([int(i) for i in flat[keep:]], dtype=torch.long))
