"""Prompt text -> token ids, with or without the model's own chat template.

transformers 5's `apply_chat_template(tokenize=True)` may return a list, a dict or a BatchEncoding
depending on the tokenizer class; these helpers always return a plain `list[int]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from edge_runtime.errors import RequestError


def as_id_list(encoded) -> list[int]:
    if isinstance(encoded, Mapping) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], (list, tuple)):
        assert len(encoded) == 1, f"expected one sequence, got {len(encoded)}"
        encoded = encoded[0]
    return [int(i) for i in encoded]


def control_tokens(tokenizer) -> tuple[str, ...]:
    """The texts the tokenizer turns into its special (control) tokens, e.g. <|im_end|>."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {tok.content for tok in added.values() if getattr(tok, "special", False)}
    texts.update(getattr(tokenizer, "all_special_tokens", None) or [])
    return tuple(sorted(t for t in texts if t))


def encode_messages(tokenizer, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a conversation ending with the assistant's generation prompt.

    A message whose text holds a control token's text (`<|im_end|>`...) is refused: the template's
    tokenization would read it as the token itself, so a user's text could end its own turn and
    open a forged system or assistant turn (tiktoken refuses such text by default too)."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("this model has no chat template; run without --chat")
    controls = control_tokens(tokenizer)
    for i, m in enumerate(messages):
        if m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
            raise RequestError(f"a chat message needs a role (system/user/assistant) and text: {m!r}")
        found = [c for c in controls if c in m["content"]]
        if found:
            raise RequestError(f"message {i} ({m['role']}) contains the text of the model's control "
                               f"token(s) {', '.join(found)}, which chat messages cannot carry; "
                               "remove it")
    return as_id_list(_apply_template(tokenizer, messages))


def _apply_template(tokenizer, messages: Sequence[Mapping[str, str]]):
    """apply_chat_template, its jinja errors as RequestErrors: a template may refuse a conversation
    on purpose (Mistral's raise_exception: roles must alternate, no system role) or be broken."""
    from jinja2 import TemplateError, TemplateSyntaxError

    try:
        return tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=True,
                                             tokenize=True)
    except TemplateSyntaxError as exc:
        raise RequestError(f"the model's chat template is broken: {_one_line(exc)}") from exc
    except TemplateError as exc:
        raise RequestError(f"the model's chat template refused the conversation: {_one_line(exc)}") from exc


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def encode_prompt(tokenizer, text: str, chat: bool, system: str | None = None) -> list[int]:
    """Plain text (the tokenizer's own special-token rules) or one chat turn."""
    if chat:
        messages = ([{"role": "system", "content": system}] if system else [])
        return encode_messages(tokenizer, messages + [{"role": "user", "content": text}])
    if system:
        raise RequestError("a system prompt needs chat mode (--chat)")
    return as_id_list(tokenizer(text))
