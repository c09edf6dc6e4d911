"""What a family's chat needs that its files may lack: Gemma 3's chat template and end-of-turn
token, which a GGUF of it does not carry (the 270M file has neither `tokenizer.chat_template`
nor an end-of-turn id; transformers' conversion keeps only `<eos>`).

Gemma 3 has no system role. Its own template (Google's, reproduced below) puts a system
message's text at the start of the first user turn, followed by a blank line; we do the same, so
`--system` and the API's system messages reach the model as Gemma's checkpoints were tuned to see
them. Roles must alternate user/model after it (the template refuses otherwise).

Invariant: a tokenizer that already has a chat template keeps it; nothing here changes a model
of another family.
"""

from __future__ import annotations

import dataclasses

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA3_END_OF_TURN = "<end_of_turn>"


def complete_chat(config, tokenizer):
    """The config with the family's end-of-turn token among its EOS ids, and the tokenizer given
    the family's template where it has none (Gemma 3); other families unchanged."""
    if config.architecture != "Gemma3ForCausalLM":
        return config
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    end = tokenizer.convert_tokens_to_ids(GEMMA3_END_OF_TURN)
    if isinstance(end, int) and end != tokenizer.unk_token_id and end not in config.eos_token_ids:
        config = dataclasses.replace(config, eos_token_ids=config.eos_token_ids + (end,))
    return config
