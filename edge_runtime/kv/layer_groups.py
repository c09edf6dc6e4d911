"""Layer groups: which layers share a page slice, and which pages a sequence's local layers
still read (no torch; docs/pool.md, "Layer groups").

A model whose layers mix global attention (every key j <= i) with one sliding window W (keys
i - W < j <= i; kv/layer_windows.py) stores its layers in groups of G layers each, G the greatest
common divisor of the global and the local layer counts (Gemma 3 270M: 3 global and 15 local
layers, G = 3: one global group and five local groups). The pool's page id then addresses one
group's layers (a slice, kv/page_pool.py): a page a block table holds is its head slice plus
companions, one slice per other group. The global groups' slices live as long as the page;
the local groups' slices (the page's local part) are dropped by a sequence once the page is
behind its window (`pages_behind`).

`LayerGroups.of` returns None for a model without both kinds of layers, or with local layers of
different windows: every layer then shares one page, as without groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LayerGroups:
    layers: tuple[tuple[int, ...], ...]  # per group its layers: the global groups first
    num_global_groups: int
    window: int  # the local layers' window W

    @classmethod
    def of(cls, layer_windows) -> "LayerGroups | None":
        windows = tuple(layer_windows or ())
        global_layers = [i for i, w in enumerate(windows) if w is None]
        local_layers = [i for i, w in enumerate(windows) if w is not None]
        if not global_layers or not local_layers or len({windows[i] for i in local_layers}) > 1:
            return None
        size = math.gcd(len(global_layers), len(local_layers))
        chunks = lambda ids: [tuple(ids[i:i + size]) for i in range(0, len(ids), size)]
        return cls(tuple(chunks(global_layers) + chunks(local_layers)),
                   len(global_layers) // size, windows[local_layers[0]])

    @property
    def layers_per_group(self) -> int:
        return len(self.layers[0])

    @property
    def num_groups(self) -> int:
        return len(self.layers)

    @property
    def num_local_groups(self) -> int:
        return self.num_groups - self.num_global_groups

    def slot_of(self, layer: int) -> tuple[int, int]:
        """(group, index inside the group) of a layer."""
        for g, ids in enumerate(self.layers):
            if layer in ids:
                return g, ids.index(layer)
        raise AssertionError(f"layer {layer} is in no group: {self.layers}")


def page_ends(seq, page_tokens: int):
    """The end (exclusive) of the positions each page of a block table holds for it, in
    `all_pages()` order: a prefix page ends at the next page or at the prefix length."""
    P, p = page_tokens, seq.prefix_len
    for i in range(len(seq.prefix_pages)):
        yield min((i + 1) * P, p)
    for j in range(len(seq.tail_pages)):
        yield p + (j + 1) * P


def pages_behind(seq, page_tokens: int, window: int, num_tokens: int | None = None) -> int:
    """How many of a sequence's first pages no query of it reads again in a local layer: with
    L positions computed the next query (at L) reads keys > L - W, so a page whose positions all
    lie at or before L - W is behind (they are a prefix of its pages, in position order)."""
    limit = (seq.num_tokens if num_tokens is None else num_tokens) - window + 1
    count = 0
    for end in page_ends(seq, page_tokens):
        if end > limit:
            break
        count += 1
    return count
