"""Greedy 40-token continuations of SmolLM2 identical to transformers' generate(do_sample=False).

Ten prompts (plain and chat, 5 to 67 tokens), run through our simple generator one by one and as
one mixed-length batch; both must equal transformers' one-by-one output token for token (including
the EOS token where transformers stops early: three of the ten do, at 15, 30 and 37 tokens).
"""

from __future__ import annotations

import pytest
import torch
from model_helpers import smollm2, smollm2_hf

from lab.greedy import CHAT, PLAIN  # tools/ is on sys.path through model_helpers

from edge_runtime.model.chat import encode_prompt
from edge_runtime.model.simple_generate import generate

MAX_NEW = 40  # past the latest early EOS (37 tokens); the others run to the limit


@pytest.fixture(scope="module")
def prompts_and_reference():
    lm = smollm2()
    hf = smollm2_hf()
    prompts = [encode_prompt(lm.tokenizer, p, chat=False) for p in PLAIN]
    prompts += [encode_prompt(lm.tokenizer, p, chat=True) for p in CHAT]
    reference = []
    for ids in prompts:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW,
                              do_sample=False, eos_token_id=list(lm.config.eos_token_ids),
                              pad_token_id=lm.config.eos_token_ids[0])
        reference.append(out[0, len(ids):].tolist())
    return prompts, reference


@pytest.mark.slow
def test_prompts_are_mixed_lengths(prompts_and_reference):
    prompts, _ = prompts_and_reference
    assert len(prompts) >= 10
    assert min(map(len, prompts)) < 10 and max(map(len, prompts)) > 60


@pytest.mark.slow
def test_one_by_one_matches_transformers(prompts_and_reference):
    prompts, reference = prompts_and_reference
    model = smollm2().model
    reasons = []
    for ids, ref in zip(prompts, reference):
        (res,) = generate(model, [ids], MAX_NEW)
        assert res.token_ids == ref
        assert res.finish_reason == ("length" if len(ref) == MAX_NEW else "stop")
        reasons.append(res.finish_reason)
    assert reasons.count("stop") == 3 and "length" in reasons, reasons  # both ends reached


@pytest.mark.slow
def test_mixed_length_batch_matches_transformers(prompts_and_reference):
    prompts, reference = prompts_and_reference
    streamed = [[] for _ in prompts]
    results = generate(smollm2().model, prompts, MAX_NEW,
                       on_token=lambda i, tok: streamed[i].append(tok))
    assert [r.token_ids for r in results] == reference
    assert streamed == reference
    assert [r.prompt_tokens for r in results] == [len(p) for p in prompts]
