"""Sampling where the logits are (the CUDA back end): only token ids and asked-for log-probs cross.

The same transforms, in the same order and dtypes, as engine/sampler.py (grammar mask ->
repetition penalty -> presence/frequency penalties -> greedy argmax, or temperature -> top-k ->
top-p -> inverse-CDF draw), run on
the device over the [B, vocab] logits the forward left there. The host builds the per-row inputs
(temperatures, k, p, penalties, the seen ids of penalised rows, the counted generated ids,
grammar bitmasks, one uniform per row) and uploads them in ONE packed copy (engine/step_transfers.py); the chosen ids, and the
log-probs where asked, come back in ONE download.

Random numbers, the contract: each row's uniform is drawn on the HOST from the row's own
`torch.Generator`, exactly as engine/sampler.py draws it (one per row per step, every row of a
batch that samples), and uploaded. So a seeded request's random stream does not depend on the
device or the batch, and on CPU tensors `DeviceSampler` returns the same ids as `sample()`, bit
for bit (tests/test_device_sampler.py). On a GPU the draw `cdf[i-1] <= u * total < cdf[i]` sums
the probabilities in another order, so a uniform within rounding (~1e-7) of a boundary can pick
the neighbouring token: equal ids in all but such draws; greedy rows are always equal.

Invariants:
- Nothing here reads a device value on the host except `StepTransfers.download` (once per call).
- A greedy-only batch without penalties or masks uploads nothing (argmax on the device).
- Beam groups are not sampled here (engine/beam.py takes their logits rows on the device).
"""

from __future__ import annotations

import torch

from edge_runtime.engine.api import TokenLogprob
from edge_runtime.engine.sampler import (SampleRows, count_penalty_terms, subtract_at, top_k_mask,
                                         top_p_mask)


class DeviceSampler:
    def __init__(self, transfers):
        self.transfers = transfers

    def choose(self, logits: torch.Tensor, batch: SampleRows, constraints, masks
               ) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits: [B, vocab] float32 on the device -> (token id per row, log-probs or None)."""
        host = self._host_inputs(logits.shape[0], batch, masks)
        dev = self.transfers.upload(host)
        raw = logits if "source_rows" not in dev else logits.index_select(0, dev["source_rows"])
        tops = batch.tops
        masked = raw
        if "mask_bits" in dev:
            masked = raw.clone() if any(t is not None for t in tops) else raw
            apply_bitmask_rows(masked, dev["mask_bits"], dev["mask_targets"])
        tokens = sample_rows(masked, dev)
        lp_rows = [k for k, t in enumerate(tops) if t is not None]
        if not lp_rows:
            return [int(t) for t in self.transfers.download(tokens)], [None] * len(tops)
        return self._with_logprobs(raw, tokens, dev["logprob_rows"], lp_rows, tops)

    def _host_inputs(self, num_logits: int, batch: SampleRows, masks) -> dict[str, torch.Tensor]:
        rows, out = batch.rows, {}
        if batch.source_rows != list(range(num_logits)):
            out["source_rows"] = torch.tensor(batch.source_rows, dtype=torch.long)
        penalised = [(k, r) for k, r in enumerate(rows) if r.params.repetition_penalty != 1.0 and r.seen_ids]
        if penalised:
            ids = [sorted(set(r.seen_ids)) for _, r in penalised]
            out["pen_rows"] = torch.tensor([k for (k, _), i in zip(penalised, ids) for _ in i], dtype=torch.long)
            out["pen_ids"] = torch.tensor([t for i in ids for t in i], dtype=torch.long)
            out["pen_values"] = torch.tensor([r.params.repetition_penalty for _, r in penalised])[
                torch.repeat_interleave(torch.arange(len(ids)), torch.tensor([len(i) for i in ids]))]
        terms = count_penalty_terms(rows)
        if terms is not None:
            out.update(zip(("count_rows", "count_ids", "count_amounts"), terms))
        if not all(r.params.temperature == 0 for r in rows):
            out["greedy"] = torch.tensor([r.params.temperature == 0 for r in rows])
            out["temps"] = torch.tensor([r.params.temperature if r.params.temperature > 0 else 1.0
                                         for r in rows])
            out["top_k"] = torch.tensor([r.params.top_k for r in rows], dtype=torch.long)
            out["top_p"] = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32)
            out["uniforms"] = torch.stack([torch.rand((), generator=r.generator) for r in rows])
        if masks is not None:
            bitmask, mask_rows = masks.result()  # the grammar thread's, not the device's, wait
            mask_of = {row: j for j, row in enumerate(mask_rows)}
            targets = [k for k, row in enumerate(batch.source_rows) if row in mask_of]
            out["mask_bits"] = bitmask[torch.tensor([mask_of[batch.source_rows[k]] for k in targets],
                                                    dtype=torch.long)]
            out["mask_targets"] = torch.tensor(targets, dtype=torch.long)
        lp_rows = [k for k, t in enumerate(batch.tops) if t is not None]
        if lp_rows:
            out["logprob_rows"] = torch.tensor(lp_rows, dtype=torch.long)
        return out

    def _with_logprobs(self, raw, tokens, rows_dev, lp_rows, tops):
        """One download: tokens, the chosen tokens' log-probs, the top-k values and ids."""
        logp = torch.log_softmax(raw.index_select(0, rows_dev).float(), dim=-1)  # [R, V]
        chosen = logp.gather(-1, tokens.index_select(0, rows_dev).unsqueeze(-1)).squeeze(-1)
        k_max = max(tops[k] for k in lp_rows)
        parts = [tokens.double(), chosen.double()]
        if k_max:
            top_vals, top_ids = logp.topk(k_max, dim=-1)
            parts += [top_vals.double().flatten(), top_ids.double().flatten()]
        flat = self.transfers.download(torch.cat(parts))
        n, r = tokens.shape[0], len(lp_rows)
        token_ids = [int(t) for t in flat[:n]]
        out: list[TokenLogprob | None] = [None] * len(tops)
        for j, k in enumerate(lp_rows):
            top = ()
            if tops[k]:
                vals = flat[n + r + j * k_max: n + r + j * k_max + tops[k]]
                ids = flat[n + r + r * k_max + j * k_max: n + r + r * k_max + j * k_max + tops[k]]
                top = tuple((int(i), v) for i, v in zip(ids, vals))
            out[k] = TokenLogprob(token_ids[k], flat[n + j], top)
        return token_ids, out


def apply_bitmask_rows(logits: torch.Tensor, bits: torch.Tensor, targets: torch.Tensor) -> None:
    """-inf for each token whose bit is 0 in rows `targets` of logits (in place, no host read)."""
    # logits: [B, V]; bits: int32 [M, W] with W * 32 >= V; targets: long [M]
    vocab = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=bits.device)
    banned = (((bits.unsqueeze(-1) >> shifts) & 1) == 0).view(bits.shape[0], -1)[:, :vocab]
    logits.index_copy_(0, targets, logits.index_select(0, targets).masked_fill(banned, float("-inf")))


def sample_rows(logits: torch.Tensor, dev: dict[str, torch.Tensor]) -> torch.Tensor:
    """engine/sampler.py `sample` on the device -> long [B] token ids (left on the device)."""
    logits = logits.float()
    if "pen_rows" in dev:
        logits = logits.clone()
        rows, ids, p = dev["pen_rows"], dev["pen_ids"], dev["pen_values"]
        vals = logits[rows, ids]
        logits[rows, ids] = torch.where(vals < 0, vals * p, vals / p)
    if "count_rows" in dev:
        logits = subtract_at(logits, dev["count_rows"], dev["count_ids"], dev["count_amounts"])
    out = logits.argmax(dim=-1)
    if "uniforms" not in dev:
        return out
    temps = dev["temps"]
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temps.unsqueeze(-1)
    scaled = top_p_mask(top_k_mask(scaled, dev["top_k"]), dev["top_p"])
    drawn = draw_inverse_cdf(scaled.softmax(dim=-1), dev["uniforms"])
    return torch.where(dev["greedy"], out, drawn)


def draw_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """engine/sampler.py's draw without its host check: the zero-probability fix-up is applied
    by `where` on every row (the same ids)."""
    cdf = probs.double().cumsum(dim=-1)  # [B, V]
    target = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)
    bad = probs.gather(-1, idx.unsqueeze(-1)).squeeze(-1) <= 0
    return torch.where(bad, probs.argmax(dim=-1), idx)
