"""Per-step flat row numbers for the CPU KV paths (kernels/flat_kv_cpu.py), built once per step.

For every store ("pages": the pool, "inline": the arena):
- slot mapping (made when asked; no CPU kernel reads it): the flat slot (block * block_tokens +
  offset) of every new token stored there, -1 for the others (the per-segment path's `slot_mapping`);
- write rows: the layer-0 row numbers `[T_s, Hkv]` of the new tokens stored there, and which
  tokens of the flattened batch they are;
- decode gather: for each decode token (the only new token of its sequence), the layer-0 row
  numbers `[R, Hkv, L_s]` of every K/V position it attends to in that store (prefix pages and
  tail pages both live in the pool, an inline tail's slots in the arena), padded to the longest
  row, with the valid length of each row (`gather_lens`; `mask_bias` for the torch path);
- prefill rows (several new tokens of one sequence): with `prefill_rows` (the C attention) each
  of its tokens is a row of that gather too, reading exactly what a decode token at its position
  reads, its exact keys from a per-step fp16 "fresh" store (`num_fresh`, `fresh_carry`); else per row its key
  rows `[Hkv, L_s]` per store and a `[n, L]` mask, one entry of `prefill` (torch SDPA).
Layer l's rows are layer 0's plus `l * P * Hkv` (`layer_offset`). A local (sliding-window)
layer reads `gather_for(W)`: each row cut to its last W positions, and `prefill_bias(i, W)`
(kv/layer_windows.py).

A sequence that holds a recent-key window (kv/recent_window.py) reads by the position-only
rule of kv/recent_window.py: a query at position i reads the keys of its aligned block
[i - i % W, i] exact and every older one from int8. A decode token reads its block from the
window (its own K/V written there first). A prefill row reads int8 [0, B) (B: the block start of
its last token; the mask keeps each query to the int8 keys before its own block) and its exact
keys [b, end) (b: the block start of its first token): the positions [b, start) it computed in
earlier steps from the window (`carry`, read before this step's window writes) and its own new
tokens' K/V as the window stores them (fp16). Its last block's new tokens are written to the
window ("window" in `write`) for the steps after.

Built with numpy: a decode step runs this for every row, and numpy's small-array operations cost
~1 us where torch's cost 3-10 us (a batch-5 step spent ~1.3 ms here with torch ops; docs/perf.md).

Invariants (asserted):
- a sequence's positions are, in order, its prefix [0, prefix_len) in its prefix pages, then its
  tail in its full pages (inline tails) or tail pages, then its inline slots; so each store's key
  positions are in position order and the new tokens are the last `num_new` positions;
- every new token lies outside the shared prefix, and its tail storage was reserved.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np
import torch

from edge_runtime.kv import layer_windows
from edge_runtime.kv.recent_window import exact_from, window_offset

_EMPTY = np.zeros(0, dtype=np.int64)


def block_bases(block_ids, length: int, block_tokens: int, layer_tokens: int,
                 num_kv_heads: int) -> np.ndarray:
    """Layer-0 base rows (head 0) of the first `length` tokens of a block list -> int64 [length];
    a block's layer 0 starts at row block * layer_tokens * num_kv_heads (layer_tokens = layers x
    block_tokens), token o of it at + o * num_kv_heads."""
    if length <= 0:
        return _EMPTY
    used = -(-length // block_tokens)
    assert used <= len(block_ids), f"{length} tokens need {used} blocks, {len(block_ids)} reserved"
    blocks = np.array(block_ids[:used], dtype=np.int64) * (layer_tokens * num_kv_heads)
    offsets = np.arange(0, block_tokens * num_kv_heads, num_kv_heads)
    return (blocks[:, None] + offsets).ravel()[:length]


def _first_positions(keys: dict, n: int) -> dict:
    """The first n positions of a sequence's int8 keys (pool positions come before the arena's)."""
    pages, inline = keys["pages"], keys["inline"]
    if n <= pages.size:
        return {"pages": pages[:n], "inline": _EMPTY}
    return {"pages": pages, "inline": inline[:n - pages.size]}


def _rows_of(bases: np.ndarray, first: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query r the entries bases[first[r] : first[r] + lens[r]] -> ([n, width], lens)."""
    width = int(lens.max(initial=0))
    if width == 0 or bases.size == 0:
        return np.zeros((lens.size, 0), dtype=np.int64), np.zeros(lens.size, dtype=np.int64)
    cols = np.minimum(first[:, None] + np.arange(width), bases.size - 1)
    return bases[cols], lens


class FlatKVIndex:
    def __init__(self, storage, seqs, prefill_rows: bool = False):
        """prefill_rows: attend every prefill token as a row of the decode gather (the C decode
        attention, which reads keys the same way whatever step a query is in); else each prefill
        row through one causal SDPA call (`prefill`)."""
        pool = storage.pool
        self.num_layers = pool.k.shape[1]  # layers in a pool block (a slice's: layer groups)
        # layers per block of each store: the pool's may hold one layer group only
        self._layers = {"pages": pool.k.shape[1]}
        self.num_kv_heads = pool.k.shape[3]
        self._heads = np.arange(self.num_kv_heads, dtype=np.int64)
        self._block = {"pages": pool.block_tokens}
        if storage.inline is not None:
            self._block["inline"] = storage.inline.block_tokens
            self._layers["inline"] = storage.inline.k.shape[1]
        if getattr(storage, "window", None) is not None:
            self._block["window"] = storage.window.block_tokens
            self._layers["window"] = storage.window.k.shape[1]
        self.num_tokens = sum(s.num_new for s in seqs)
        # (first token, n, parts, bias, carry): carry is None, or the window rows [Hkv, c] of
        # the exact positions before the row's new tokens (read with the new tokens, fp16)
        self.prefill: list[tuple[int, int, list, torch.Tensor, torch.Tensor | None]] = []
        # per store: ([rows, width] layer-0 bases, valid lengths [rows]) chunks, in token order
        decode_keys: dict[str, list] = {"pages": [], "inline": [], "window": [], "fresh": []}
        # gathered prefill rows' exact keys: a per-step fp16 "fresh" store of num_fresh positions
        # (all layers), its entries [f, f + c) copied from window slots before the step
        # (`fresh_carry`: window slots, fresh entries), the new tokens' written there ("fresh" in
        # `write`) like any store's
        self.num_fresh = 0
        carry_src, carry_dst = [], []
        # per store written, in the order the writes run: (tokens, their layer-0 base rows)
        writes: dict[str, list] = {"pages": [], "inline": [], "fresh": [], "window": []}
        tokens, offset = [], 0
        positions = []  # the gathered rows' query positions, in row order
        self.prefill_positions: list[tuple[torch.Tensor, torch.Tensor]] = []  # per `prefill`
        for s in seqs:
            keys = self._key_bases(s)
            self._new_tokens(s, keys, offset, writes)
            keys["window"], carry = _EMPTY, None
            if getattr(s, "window", None) is not None:
                keys, carry = self._window_keys(s, keys, offset, writes["window"])
            if s.num_new == 1:
                tokens.append(offset)
                positions.append(s.start)
                keys["fresh"] = _EMPTY
                for store, x in keys.items():
                    decode_keys[store].append((x[None, :], np.array([x.size])))
            elif prefill_rows:
                tokens.extend(range(offset, offset + s.num_new))
                positions.extend(range(s.start, s.start + s.num_new))
                self._add_prefill_rows(s, keys, offset, decode_keys, carry_src, carry_dst,
                                       writes["fresh"])
            else:
                self._add_prefill(s, keys, offset, carry)
            offset += s.num_new
        self._build_writes(writes)
        self._block["fresh"] = self.num_fresh
        self.fresh_carry = None if not self.num_fresh else tuple(
            torch.from_numpy(np.concatenate(x or [_EMPTY])) for x in (carry_src, carry_dst))
        self._gathered_tokens = tokens
        self.row_positions = np.array(positions, dtype=np.int64)
        self._local: dict[int, tuple[list, list]] = {}
        self.all_gathered = len(tokens) == offset
        self._build_gather(decode_keys)

    @cached_property
    def decode_tokens(self) -> torch.Tensor:  # long [R]: the gathered rows' tokens (torch path)
        return torch.tensor(self._gathered_tokens, dtype=torch.long)

    @cached_property
    def slot_mapping(self) -> dict[str, torch.Tensor]:
        """Per store written: long [T], each token's flat slot there or -1 (what the per-segment
        path builds; no kernel here reads it, so it is made when asked)."""
        out = {}
        for store in [name for name in ("pages", "inline") if name in self._write_bases]:
            tokens, bases = self._write_bases[store]
            mapping = np.full(self.num_tokens, -1, dtype=np.int64)
            mapping[tokens] = self._slots(store, bases)
            out[store] = torch.from_numpy(mapping)
        return out

    def layer_offset(self, store: str, layer: int) -> int:
        return layer * self._block[store] * self.num_kv_heads

    def _bases(self, store: str, block_ids, length: int) -> np.ndarray:
        block = self._block[store]
        return block_bases(block_ids, length, block, self._layers[store] * block, self.num_kv_heads)

    def _slots(self, store: str, bases: np.ndarray) -> np.ndarray:
        """Layer-0 base rows -> flat slots (block * block_tokens + offset)."""
        block = self._block[store]
        block_id, offset = np.divmod(bases // self.num_kv_heads, self._layers[store] * block)
        return block_id * block + offset

    def _key_bases(self, s) -> dict[str, np.ndarray]:
        """Layer-0 base rows of positions [0, start + num_new) of a sequence, per store, in position
        order (pool: prefix then tail pages; arena: the inline end of an inline tail)."""
        assert s.start >= s.prefix_len, f"a new token (position {s.start}) lies inside the shared " \
                                         f"prefix of {s.prefix_len} tokens"
        P, length = self._block["pages"], s.start + s.num_new - s.prefix_len
        prefix = self._bases("pages", s.prefix_pages, s.prefix_len)
        if s.tail_kind == "pages":
            return {"pages": np.concatenate((prefix, self._bases("pages", s.tail_ids, length))),
                    "inline": _EMPTY}
        in_pages = len(s.full_pages) * P
        full = self._bases("pages", s.full_pages, min(length, in_pages))
        return {"pages": np.concatenate((prefix, full)),
                "inline": self._bases("inline", s.tail_ids, length - in_pages)}

    def _window_keys(self, s, keys, offset: int, window_writes) -> tuple[dict, np.ndarray | None]:
        """A windowed sequence (the read rule of kv/recent_window.py): its window writes (the
        new tokens of its last block), its int8 keys cut where its last token's block begins, and
        the window rows it reads exact: a decode token's whole block; a prefill row's `carry`,
        the positions of its first block before its new tokens (returned, None for a decode)."""
        W = self._block.get("window")
        assert W, "a sequence holds a recent-key window but the storage has none"
        end = s.start + s.num_new
        assert s.window_start <= exact_from(s.start, W), \
            f"block of position {s.start} (window {W}) starts before the sequence's first computed " \
            f"position {s.window_start}: its prefix-cache hit was not cut back to the window"
        base = self._bases("window", (s.window,), W)[0]  # offset o is row base + o * Hkv
        rows = lambda positions: base + window_offset(positions, W) * self.num_kv_heads
        last_block = exact_from(end - 1, W)
        written = np.arange(max(s.start, last_block), end)
        window_writes.append((offset + written - s.start, rows(written)))
        cut = _first_positions(keys, last_block)
        if s.num_new == 1:
            cut["window"] = rows(np.arange(last_block, end))
            return cut, None
        cut["window"] = _EMPTY
        carried = rows(np.arange(exact_from(s.start, W), s.start))
        return cut, torch.from_numpy(carried[None, :] + self._heads[:, None])  # [Hkv, c]

    @staticmethod
    def _new_tokens(s, keys, offset: int, out) -> None:
        """The new tokens are the last num_new positions: the inline store's end, then the pool's."""
        left = s.num_new
        for store in ("inline", "pages"):
            x = keys[store]
            n = min(left, x.size)
            if n:
                out[store].append((offset + left - n + np.arange(n), x[x.size - n:]))
            left -= n
        assert left == 0, "tail storage not reserved for every new token"

    def _build_writes(self, writes) -> None:
        """Per store written: `write` (tokens long [n], their rows long [n, Hkv] in layer 0)."""
        self._write_bases: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # tokens, layer-0 bases
        self.write: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for store, pieces in writes.items():
            if not pieces:
                continue
            tokens = np.concatenate([t for t, _ in pieces])
            bases = np.concatenate([b for _, b in pieces])
            self._write_bases[store] = (tokens, bases)
            self.write[store] = (torch.from_numpy(tokens), torch.from_numpy(bases[:, None] + self._heads))

    def _add_prefill(self, s, keys, offset: int, carry) -> None:
        """A multi-token row: its key rows per store [Hkv, L_s] and its mask [n, L]: causal over
        the stores' positions; with a window (`carry` not None) the stores hold int8 [0, B) and
        the exact keys [b, end) follow them (carry, then the new tokens), each query seeing the
        int8 keys before its block and the exact ones of its block up to itself."""
        parts = [(store, torch.from_numpy(x[None, :] + self._heads[:, None]))  # [Hkv, L_s]
                 for store, x in keys.items() if x.size]
        end = s.start + s.num_new
        query = torch.arange(s.start, end)[:, None]  # [n, 1]
        if carry is None:
            visible = torch.arange(end)[None, :] <= query  # [n, L]
            key_positions = torch.arange(end)
        else:
            W = self._block["window"]
            int8_len = sum(x.size for x in keys.values())
            block = exact_from(query, W)
            exact = torch.arange(end - s.num_new - carry.shape[1], end)[None, :]
            visible = torch.cat([torch.arange(int8_len)[None, :] < block,
                                 (exact >= block) & (exact <= query)], dim=1)
            key_positions = torch.cat([torch.arange(int8_len), exact[0]])
        bias = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))
        self.prefill.append((offset, s.num_new, parts, bias, carry))
        self.prefill_positions.append((query[:, 0], key_positions))

    def _add_prefill_rows(self, s, keys, offset: int, out, carry_src, carry_dst,
                          fresh_writes) -> None:
        """A prefill row's queries as gather rows: query p reads its int8 keys [0, B) (B: its
        block start; [0, p] without a window) and, windowed, its block [B, p] exact from the
        fresh store (the carried positions [b, start), then the new tokens)."""
        end = s.start + s.num_new
        query = np.arange(s.start, end)
        zero = np.zeros(s.num_new, dtype=np.int64)
        exact = _rows_of(_EMPTY, zero, zero)
        n_int8 = query + 1
        if getattr(s, "window", None) is not None:
            W = self._block["window"]
            n_int8, b, f = exact_from(query, W), exact_from(s.start, W), self.num_fresh
            exact = _rows_of((f + np.arange(end - b)) * self.num_kv_heads, n_int8 - b,
                             query - n_int8 + 1)
            carried = np.arange(b, s.start)
            carry_src.append(s.window * W + window_offset(carried, W))
            carry_dst.append(f + carried - b)
            entries = f + query - b  # the new tokens' fresh entries
            fresh_writes.append((offset + np.arange(s.num_new), entries * self.num_kv_heads))
            self.num_fresh += end - b
        in_pages = np.minimum(n_int8, keys["pages"].size)
        out["pages"].append(_rows_of(keys["pages"], zero, in_pages))
        out["inline"].append(_rows_of(keys["inline"], zero, n_int8 - in_pages))
        out["window"].append(_rows_of(_EMPTY, zero, zero))
        out["fresh"].append(exact)

    def _build_gather(self, decode_keys) -> None:
        self.gather: list[tuple[str, torch.Tensor]] = []
        self.gather_lens: list[torch.Tensor] = []  # int32 [R] valid entries per row, per store
        for store, chunks in decode_keys.items():
            width = max((x.shape[1] for x, _ in chunks), default=0)
            if width == 0:
                continue
            num_rows = sum(x.shape[0] for x, _ in chunks)
            bases = np.zeros((num_rows, width), dtype=np.int64)  # padding reads row 0, masked
            lens = np.concatenate([n for _, n in chunks]).astype(np.int32)
            at = 0
            for x, _ in chunks:
                bases[at:at + x.shape[0], : x.shape[1]] = x
                at += x.shape[0]
            rows = bases[:, None, :] + self._heads[None, :, None]  # [R, Hkv, W]
            self.gather.append((store, torch.from_numpy(rows)))
            self.gather_lens.append(torch.from_numpy(lens))

    @cached_property
    def mask_bias(self) -> torch.Tensor:
        """float32 [R, 1, 1, sum W_s]: 0 on a row's valid positions, -inf on its padding (the torch
        decode path's mask; the C path takes `gather_lens`)."""
        return layer_windows.mask_bias(self.gather, self.gather_lens)

    def gather_for(self, window: int | None) -> tuple[list, list, torch.Tensor]:
        """(gather, gather_lens, mask_bias) of a layer: `window` None (a global layer) the
        step's; else a local layer's, every row's stored keys cut to its window
        (kv/layer_windows.py), made once per step and window."""
        if window is None:
            return self.gather, self.gather_lens, self.mask_bias
        if window not in self._local:
            gather, lens = layer_windows.cut_gather(self.gather, self.gather_lens,
                                                    self.row_positions, window)
            self._local[window] = (gather, lens, layer_windows.mask_bias(gather, lens))
        return self._local[window]

    def prefill_bias(self, index: int, window: int | None) -> torch.Tensor:
        """`prefill[index]`'s mask [n, L] for a layer with `window` (None: global)."""
        bias = self.prefill[index][3]
        if window is None:
            return bias
        query, keys = self.prefill_positions[index]
        return layer_windows.window_bias(bias, query, keys, window)
