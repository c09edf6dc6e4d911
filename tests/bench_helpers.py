"""Helpers for the bench tests: a tiny random-weight Llama folder with a byte-level chat tokenizer.

Real code paths (transformers loading, chat template, generate, our engine), tiny sizes: 2 layers,
hidden 64, vocab 260, so a whole trace replays in a second or two on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": SPECIALS[:2], "eos_token": SPECIALS[1],
                             "bos_token": SPECIALS[2], "pad_token": SPECIALS[3]})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_tiny_llama(folder: Path, seed: int = 0) -> Path:
    """Write a random-weight 2-layer Llama + tokenizer into `folder`; returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    tok = _tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper logits than init's 0.02 so greedy text varies with the prompt
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "bench_helpers.json").write_text(json.dumps({"seed": seed}))
    return folder


def write_trace(path: Path, streams: int, turns: int, max_tokens: int = 6) -> Path:
    lines = []
    for t in range(turns):
        for s in range(streams):
            lines.append(json.dumps({
                "stream": s, "turn": t, "system": "You control the lights. " * 3,
                "command": f"turn {'on' if (s + t) % 2 else 'off'} lamp {s}-{t}",
                "max_tokens": max_tokens,
            }))
    path.write_text("\n".join(lines) + "\n")
    return path
