"""Token sampling for a batch of rows, each with its own SamplingParams and random generator.

Order of the logit transforms follows Hugging Face's `generate` (so seeded runs are comparable):
repetition penalty -> temperature -> top-k -> top-p -> sample, with OpenAI's presence/frequency
penalties (which transformers lacks) right after the repetition penalty, as vLLM orders them.
Greedy rows (temperature 0) take the argmax after the penalties only.

Invariants:
- Everything except the final draw is vectorised over the batch; the draw uses one uniform number
  per row from that row's own `torch.Generator`, then inverse-CDF sampling (vectorised), so a seeded
  request gives the same tokens whatever else is in the batch.
- A row never ends up with every token masked: top-k and top-p always keep the most likely token.
- No NaN for any SamplingParams it accepts (engine/api.py bounds them for float32): the
  temperature divides logits shifted by their maximum, so a tiny one cannot overflow.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from edge_runtime.engine.api import SamplingParams, TokenLogprob
from edge_runtime.kernels.argmax_cpu import argmax_rows
from edge_runtime.engine.constraints import token_logprobs


@dataclass
class SamplerRow:
    """What the sampler needs about one row of the batch."""

    params: SamplingParams
    generator: torch.Generator
    seen_ids: list[int]  # prompt + generated ids, for the repetition penalty
    num_prompt: int = 0  # seen_ids[num_prompt:] were generated (presence/frequency penalties)


@dataclass
class SampleRows:
    """The rows one step samples: row k takes the logits row `source_rows[k]` (n > 1 children
    forked at their first token share their parent's row)."""

    source_rows: list[int]
    rows: list[SamplerRow]
    tops: list[int | None]  # per row: None, or how many top log-probs it asked for


class HostSampler:
    """The CPU back end's sampler: logits already on the host (`sample`, `token_logprobs`)."""

    def __init__(self, transfers=None):
        self.transfers = transfers

    def choose(self, logits: torch.Tensor, batch: SampleRows, constraints, masks
               ) -> tuple[list[int], list[TokenLogprob | None]]:
        """-> (one token id per row, its log-probs or None per row)."""
        same = batch.source_rows == list(range(logits.shape[0]))
        raw = logits if same else logits[torch.tensor(batch.source_rows)]
        keep_raw = masks is not None and any(t is not None for t in batch.tops)
        masked = raw.clone() if keep_raw else raw  # log-probs are the unmasked model's
        with torch.inference_mode():  # in place on the forward's (inference) tensor
            constraints.apply_masks(masked, batch.source_rows, masks)
        tokens = sample(masked, batch.rows)
        return tokens, token_logprobs(raw, tokens, batch.tops)


def make_generator(seed: int | None) -> torch.Generator:
    """A per-request generator: seeded when asked, otherwise from fresh OS entropy.

    The seed is taken modulo 2**64, as torch does for negative seeds, so a derived seed (the
    request's seed + i for its i-th sample, engine.py) never overflows torch's uint64."""
    gen = torch.Generator(device="cpu")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(int(seed) % (1 << 64))
    return gen


def apply_repetition_penalty(
    logits: torch.Tensor, seen: list[list[int]], penalties: list[float]
) -> torch.Tensor:
    """HF semantics: a seen token's logit is divided by the penalty if > 0, multiplied if < 0."""
    # logits: [B, V]
    rows = [i for i, p in enumerate(penalties) if p != 1.0 and seen[i]]
    if not rows:
        return logits
    logits = logits.clone()
    for i in rows:
        ids = torch.tensor(sorted(set(seen[i])), dtype=torch.long)
        vals = logits[i, ids]
        p = penalties[i]
        logits[i, ids] = torch.where(vals < 0, vals * p, vals / p)
    return logits


def count_penalty_terms(rows: list[SamplerRow]):
    """(row, token id, amount) for every generated token of a row with a presence or frequency
    penalty: amount = presence + frequency * count, as float32 (both samplers subtract these
    same values), or None when no row has one."""
    rows_idx, ids, amounts = [], [], []
    for i, r in enumerate(rows):
        pres, freq = r.params.presence_penalty, r.params.frequency_penalty
        if not (pres or freq):
            continue
        counts = Counter(r.seen_ids[r.num_prompt:])
        for t in sorted(counts):
            rows_idx.append(i)
            ids.append(t)
            amounts.append(pres + freq * counts[t])
    if not ids:
        return None
    return (torch.tensor(rows_idx, dtype=torch.long), torch.tensor(ids, dtype=torch.long),
            torch.tensor(amounts, dtype=torch.float32))


def subtract_at(logits: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, amounts: torch.Tensor
                ) -> torch.Tensor:
    """logits with logits[rows, ids] -= amounts (a copy; each (row, id) pair at most once)."""
    logits = logits.clone()
    logits[rows, ids] = logits[rows, ids] - amounts
    return logits


def top_k_mask(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Set to -inf every logit below the k-th largest of its row (k = 0 keeps all)."""
    # logits: [B, V]; top_k: long [B]
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, torch.full_like(top_k, vocab), top_k.clamp(max=vocab))
    sorted_logits = logits.sort(dim=-1, descending=True).values
    kth = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_mask(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p (HF semantics:
    drop the tokens whose ascending cumulative probability is <= 1 - top_p; keep at least one)."""
    # logits: [B, V]; top_p: float [B]
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - top_p).unsqueeze(-1)
    remove_sorted[:, -1] = False  # the most likely token always stays
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def sample(logits: torch.Tensor, rows: list[SamplerRow]) -> list[int]:
    """One token id per row."""
    # logits: [B, V] float32
    assert logits.dim() == 2 and logits.shape[0] == len(rows), (logits.shape, len(rows))
    if logits.dtype != torch.float32:  # the forward's logits are float32: no no-op .float()
        logits = logits.float()
    logits = apply_repetition_penalty(
        logits, [r.seen_ids for r in rows], [r.params.repetition_penalty for r in rows]
    )
    terms = count_penalty_terms(rows)
    if terms is not None:
        logits = subtract_at(logits, *terms)
    if all(r.params.temperature == 0 for r in rows):
        return argmax_rows(logits)
    greedy = torch.tensor([r.params.temperature == 0 for r in rows])
    out = logits.argmax(dim=-1)
    temps = torch.tensor([r.params.temperature if r.params.temperature > 0 else 1.0 for r in rows])
    # shifted by the row's max first: logit / a tiny temperature would overflow float32 to +inf
    # (and the probabilities to NaN); (logit - max) / t only falls towards -inf, probability 0
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temps.unsqueeze(-1)
    scaled = top_k_mask(scaled, torch.tensor([r.params.top_k for r in rows], dtype=torch.long))
    scaled = top_p_mask(scaled, torch.tensor([r.params.top_p for r in rows], dtype=torch.float32))
    probs = scaled.softmax(dim=-1)  # [B, V]
    uniforms = torch.stack([torch.rand((), generator=r.generator) for r in rows])  # [B]
    drawn = draw_inverse_cdf(probs, uniforms)
    return torch.where(greedy, out, drawn).tolist()


def skip_draw(generator: torch.Generator) -> None:
    """Take the one uniform a sampled row draws per step (`sample`), without a step: a token
    appended without sampling (a grammar's forced token) keeps the row's random stream where
    sampling it would have left it."""
    torch.rand((), generator=generator)


def draw_inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index i with cdf[i-1] <= u * total < cdf[i], skipping zero-probability tokens."""
    # probs: [B, V]; uniforms: [B] in [0, 1)
    cdf = probs.double().cumsum(dim=-1)  # [B, V]
    target = (uniforms.double() * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    idx = idx.clamp(max=probs.shape[-1] - 1)
    # searchsorted can land on a zero-probability token only through rounding at the very end.
    bad = probs.gather(-1, idx.unsqueeze(-1)).squeeze(-1) <= 0
    if bool(bad.any()):
        idx = torch.where(bad, probs.argmax(dim=-1), idx)
    return idx
