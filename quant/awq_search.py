"""The two AWQ searches for one group of linears (Lin et al. 2023; AutoAWQ 0.2.9's rules).

- Scale search: for alpha in {0, 1/n, ..., (n-1)/n}, s = mean|x|^alpha / mean_w^(1-alpha)
  ("duo scaling", AutoAWQ's default; plain mean|x|^alpha without it), normalised by
  sqrt(max(s) * min(s)); the linears get W * s quantized then / s, and the block output is
  compared (MSE) with the float output. The best s is folded into the preceding op:
  RMSNorm weight / s or previous linear's output rows / s, and the linears' columns * s.
- Clip search (skipped for q/k, as AutoAWQ): per output channel and group, shrink the max |w| by
  (1 - i/n_grid), i < max_shrink * n_grid, keep the one with the least output MSE. AutoAWQ
  broadcasts over 512 sampled tokens; we use each group's Gram matrix (same MSE, exactly), which
  makes every calibration token affordable.

Invariant: every search restores the weights it tried (float32 clones, never aliases: the
`v.cpu()` aliasing is exactly what corrupts AutoAWQ's search on CPU).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from edge_runtime.quant.awq_pack import fake_quantize


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).pow(2).mean())


def weight_mean(linears: list[nn.Linear], group_size: int) -> torch.Tensor:
    """Mean over output rows of |w| normalised by its group's max: [in_features]."""
    weight = torch.cat([fc.weight.data for fc in linears], dim=0).float()
    shape = weight.shape
    grouped = weight.abs().view(-1, group_size)
    grouped = grouped / (grouped.amax(dim=1, keepdim=True) + 1e-6)
    return grouped.view(shape).mean(0)


def search_scale(block: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                 linears: list[nn.Linear], group_size: int, n_grid: int = 20,
                 duo_scaling: bool = True, x_loss: torch.Tensor | None = None) -> torch.Tensor:
    """Best per-input-channel scale s [in_features] for `linears`, all fed by x [..., in].

    `block(x)` runs the module to inspect (it calls the linears); `x_loss` is the input the loss
    is measured on (a subset of x's tokens, for token-wise blocks), default x.
    """
    x_loss = x if x_loss is None else x_loss
    x_mean = x.abs().reshape(-1, x.shape[-1]).float().mean(0)  # [in]
    w_mean = weight_mean(linears, group_size) if duo_scaling else None
    with torch.no_grad():
        ref_out = block(x_loss)
    originals = [fc.weight.data.detach().clone() for fc in linears]
    best_err, best_scales = float("inf"), None
    try:
        for step in range(n_grid):
            ratio = step / n_grid
            if duo_scaling:
                scales = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
            else:
                scales = x_mean.pow(ratio).clamp(min=1e-4)
            scales = scales / (scales.max() * scales.min()).sqrt()
            scales[torch.isinf(scales) | torch.isnan(scales)] = 1.0
            for fc, w0 in zip(linears, originals):
                fc.weight.data = fake_quantize(w0 * scales, group_size) / scales
            with torch.no_grad():
                err = _mse(block(x_loss), ref_out)
            if err < best_err:
                best_err, best_scales = err, scales.clone()
    finally:
        for fc, w0 in zip(linears, originals):
            fc.weight.data = w0
    assert best_scales is not None, "scale search produced no finite loss"
    return best_scales


def fold_scale(prev: nn.Module, linears: list[nn.Linear], scales: torch.Tensor) -> None:
    """prev's output / s and linears' input columns * s: the float function is unchanged."""
    s = scales.to(prev.weight.dtype)
    if isinstance(prev, nn.Linear):
        # a previous linear's last rows feed the scaled channels (v -> o, up -> down)
        prev.weight.data[-s.numel():].div_(s.view(-1, 1))
        if prev.bias is not None:
            prev.bias.data[-s.numel():].div_(s)
    else:  # an RMSNorm: y = weight * normalize(x)
        prev.weight.data.div_(s)
    for fc in linears:
        fc.weight.data.mul_(s.view(1, -1))


def search_clip(weight: torch.Tensor, x: torch.Tensor, group_size: int, n_grid: int = 20,
                max_shrink: float = 0.5, clip_tokens: int | None = None,
                oc_batch: int = 256) -> torch.Tensor:
    """Best clipping max |w| per (output channel, group): [out, in / G].

    weight: [out, in]; x: [..., in] the linear's input (strided down to clip_tokens if given).
    The output MSE of a group over tokens, mean_t (x_g . dw)^2, equals dw^T C_g dw with the
    group's Gram matrix C_g = X_g^T X_g / T, so the token dimension is summed once up front.
    """
    out_f, in_f = weight.shape
    n_group = in_f // group_size
    x = x.reshape(-1, in_f).double()
    if clip_tokens:
        x = x[:: max(1, x.shape[0] // clip_tokens)]
    xg = x.view(-1, n_group, group_size).transpose(0, 1)  # [n_group, T, G]
    gram = torch.bmm(xg.transpose(1, 2), xg) / x.shape[0]  # [n_group, G, G]
    best_all = []
    for start in range(0, out_f, oc_batch):
        w = weight[start:start + oc_batch].float()  # [co, in]
        org_max = w.view(-1, n_group, group_size).abs().amax(dim=-1)  # [co, n_group]
        best_max, min_err = org_max.clone(), torch.full_like(org_max, float("inf"))
        for i in range(int(max_shrink * n_grid)):
            max_val = org_max * (1 - i / n_grid)
            cur = torch.clamp(w.view(-1, n_group, group_size), -max_val[..., None], max_val[..., None])
            dw = (fake_quantize(cur.reshape(w.shape), group_size) - w).double()
            dw = dw.view(-1, n_group, group_size).transpose(0, 1)  # [n_group, co, G]
            err = (torch.bmm(dw, gram) * dw).sum(-1).t().float()  # [co, n_group]
            better = err < min_err
            min_err[better] = err[better]
            best_max[better] = max_val[better]
        best_all.append(best_max)
    return torch.cat(best_all, dim=0)


def apply_clip(linear: nn.Linear, max_val: torch.Tensor, group_size: int) -> None:
    w = linear.weight.data
    out_f, in_f = w.shape
    grouped = w.view(out_f, in_f // group_size, group_size)
    linear.weight.data = torch.clamp(grouped, -max_val[..., None], max_val[..., None]).reshape(out_f, in_f)
