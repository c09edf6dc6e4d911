"""Per-step flat row numbers for the CPU KV paths (kernels/flat_kv_cpu.py), built once per step.

For every store ("pages": the pool, "inline": the arena):
- write rows: the layer-0 row numbers `[T_s, Hkv]` of the new tokens stored there, and which
  tokens of the flattened batch they are;
- decode gather: for each decode token (the only new token of its sequence), the layer-0 row
  numbers `[R, Hkv, L_s]` of every K/V position it attends to in that store (prefix pages and
  tail pages both live in the pool, an inline tail's slots in the arena), padded to the longest
  row, with `mask_bias` `[R, 1, 1, sum L_s]` (-inf on padding);
- prefill rows (several new tokens of one sequence): per row its key rows `[Hkv, L_s]` per store
  and a causal `[n, L]` mask, one entry of `prefill`.
Layer l's rows are layer 0's plus `l * P * Hkv` (`layer_offset`).

Invariant: a decode token's positions are exactly [0, pos] of its sequence: the prefix
[0, prefix_len) in its prefix pages and the tail [prefix_len, pos] in its tail storage.
"""
from __future__ import annotations

import torch


def _slots(block_ids, length: int, block_tokens: int) -> torch.Tensor:
    """Flat slots (block * P + offset) of the first `length` tokens of a block list -> long [length]."""
    if length == 0:
        return torch.zeros(0, dtype=torch.long)
    used = -(-length // block_tokens)
    blocks = torch.tensor(list(block_ids[:used]), dtype=torch.long)
    return (blocks[:, None] * block_tokens + torch.arange(block_tokens)).flatten()[:length]


class FlatKVIndex:
    def __init__(self, storage, seqs, slot_mapping: dict[str, torch.Tensor]):
        pool = storage.pool
        self.num_layers = pool.k.shape[1]
        self.num_kv_heads = pool.k.shape[3]
        self._heads = torch.arange(self.num_kv_heads)
        self._block = {"pages": pool.block_tokens}
        if storage.inline is not None:
            self._block["inline"] = storage.inline.block_tokens
        self.write = {store: self._write_rows(store, slots) for store, slots in slot_mapping.items()}
        self._build_decode(seqs)

    def layer_offset(self, store: str, layer: int) -> int:
        return layer * self._block[store] * self.num_kv_heads

    def _rows(self, store: str, slots: torch.Tensor) -> torch.Tensor:
        """flat slots long [...] -> layer-0 rows long [..., Hkv]."""
        block = self._block[store]
        base = (slots // block * self.num_layers * block + slots % block) * self.num_kv_heads
        return base.unsqueeze(-1) + self._heads

    def _write_rows(self, store: str, slots: torch.Tensor):
        tokens = (slots >= 0).nonzero().flatten()
        return tokens, self._rows(store, slots[tokens])

    def _key_slots(self, s) -> dict[str, torch.Tensor]:
        """Flat slots of positions [0, start + num_new) of a sequence, per store, in position order
        (pool: prefix then tail pages; arena: the inline end of an inline tail)."""
        P, length = self._block["pages"], s.start + s.num_new - s.prefix_len
        prefix = _slots(s.prefix_pages, s.prefix_len, P)
        if s.tail_kind == "pages":
            return {"pages": torch.cat((prefix, _slots(s.tail_ids, length, P))),
                    "inline": prefix[:0]}
        in_pages = len(s.full_pages) * P
        full = _slots(s.full_pages, min(length, in_pages), P)
        inline = _slots(s.tail_ids, max(0, length - in_pages), self._block["inline"])
        return {"pages": torch.cat((prefix, full)), "inline": inline}

    def _build_prefill(self, s, offset: int) -> None:
        """A multi-token row: its key rows per store [Hkv, L_s] and the causal mask [n, L]."""
        slots = self._key_slots(s)
        parts = [(store, self._rows(store, x).transpose(0, 1).contiguous())
                 for store, x in slots.items() if x.numel()]
        length = s.start + s.num_new
        visible = torch.arange(length)[None, :] <= torch.arange(s.start, length)[:, None]  # [n, L]
        bias = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))
        self.prefill.append((offset, s.num_new, parts, bias))

    def _build_decode(self, seqs) -> None:
        per_store: dict[str, list[torch.Tensor]] = {"pages": [], "inline": []}
        tokens, offset = [], 0
        self.prefill: list[tuple[int, int, list, torch.Tensor]] = []  # (first token, n, parts, bias)
        for s in seqs:
            if s.num_new == 1:
                tokens.append(offset)
                for store, x in self._key_slots(s).items():
                    per_store[store].append(x)
            else:
                self._build_prefill(s, offset)
            offset += s.num_new
        self.decode_tokens = torch.tensor(tokens, dtype=torch.long)
        self.all_decode = len(tokens) == offset
        self.gather: list[tuple[str, torch.Tensor]] = []
        self.gather_lens: list[torch.Tensor] = []  # int32 [R] valid entries per row, per store
        masks = []
        for store, lists in per_store.items():
            width = max((x.numel() for x in lists), default=0)
            if width == 0:
                continue
            slots = torch.zeros(len(lists), width, dtype=torch.long)  # padding reads slot 0, masked
            valid = torch.zeros(len(lists), width, dtype=torch.bool)
            for i, x in enumerate(lists):
                slots[i, : x.numel()] = x
                valid[i, : x.numel()] = True
            self.gather.append((store, self._rows(store, slots).transpose(1, 2).contiguous()))
            self.gather_lens.append(valid.sum(dim=1, dtype=torch.int32))
            masks.append(valid)
        if tokens:
            valid = torch.cat(masks, dim=1)
            self.mask_bias = torch.zeros(valid.shape).masked_fill_(~valid, float("-inf"))[:, None, None, :]
