"""Prompt text -> token ids, with or without the model's own chat template.

transformers 5's `apply_chat_template(tokenize=True)` may return a list, a dict or a BatchEncoding
depending on the tokenizer class; these helpers always return a plain `list[int]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edge_runtime.errors import RequestError


def _as_id_list(encoded) -> list[int]:
    if isinstance(encoded, Mapping) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], (list, tuple)):
        assert len(encoded) == 1, f"expected one sequence, got {len(encoded)}"
        encoded = encoded[0]
    return [int(i) for i in encoded]


def encode_messages(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a conversation ending with the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("this model has no chat template; run without --chat")
    for m in messages:
        if m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
            raise RequestError(f"a chat message needs a role (system/user/assistant) and text: {m!r}")
    encoded = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=True
    )
    return _as_id_list(encoded)


def encode_prompt(tokenizer, text: str, chat: bool, system: str | None = None) -> list[int]:
    """Plain text (the tokenizer's own special-token rules) or one chat turn."""
    if chat:
        messages = ([{"role": "system", "content": system}] if system else [])
        return encode_messages(tokenizer, messages + [{"role": "user", "content": text}])
    if system:
        raise RequestError("a system prompt needs chat mode (--chat)")
    return _as_id_list(tokenizer(text))
