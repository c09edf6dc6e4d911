"""Building a model on the meta device without nn's random weight init.

Every weight comes from the checkpoint, so the init is wasted work; and init ops on meta tensors
import torch._dynamo (~3 s of start-up). Used by the float loader (model/loader.py) and the GGUF
blocks loader (model/gguf_int4.py).
"""

from __future__ import annotations

import contextlib

from torch import nn


@contextlib.contextmanager
def no_weight_init():
    """Skip nn.Linear/nn.Embedding random init while building on meta: every weight comes from the
    checkpoint, and init ops on meta tensors import torch._dynamo (~3 s of start-up)."""
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    nn.Linear.reset_parameters = nn.Embedding.reset_parameters = lambda self: None
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved
