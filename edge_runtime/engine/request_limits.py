"""What makes a request impossible for an engine to run, checked before it is accepted."""

from __future__ import annotations

from edge_runtime.errors import RequestError


def check_request(prompt_ids: list[int], model_config, capacity_tokens: int) -> None:
    """RequestError for an empty prompt, one past the model's context or the whole KV pool
    (`capacity_tokens`), ids outside the vocabulary."""
    if not prompt_ids:
        raise RequestError("the prompt is empty; give at least one token")
    limit = model_config.max_position_embeddings
    if len(prompt_ids) >= limit:
        why = ""
        if limit < getattr(model_config, "model_context", limit):  # capped to a sliding window
            why = (f" (its model-wide sliding window of {model_config.sliding_window} tokens: "
                   "served up to the window, model/config.py)")
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; this model accepts "
                           f"at most {limit - 1}{why}")
    vocab = model_config.vocab_size
    bad = [t for t in prompt_ids if not 0 <= t < vocab]
    if bad:
        raise RequestError(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    if len(prompt_ids) + 1 > capacity_tokens:  # generation that outgrows the pool ends with "error"
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens but the KV pool holds "
                           f"{capacity_tokens}; shorten the prompt or raise num_pages")
