"""Constrained decoding in the engine (engine/grammar.py, engine/constraints.py) on the tiny random
model with SmolLM2's tokenizer: outputs parse and validate, and a constrained request batched with
others (prefix sharing, preemption, n > 1) gets exactly what it gets alone (greedy)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engine_helpers import engine_for, tiny, tiny_prompts

from edge_runtime.engine.api import GrammarSpec, SamplingParams
from edge_runtime.engine.grammar import allocate_bitmask, apply_bitmask, schema_text
from edge_runtime.errors import RequestError

SCHEMA = {
    "type": "object",
    "properties": {
        "device": {"enum": ["kitchen light", "hall light", "porch light"]},
        "on": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["device", "on", "level"],
    "additionalProperties": False,
}
SPEC = GrammarSpec("json_schema", schema_text(SCHEMA))


def constrained(max_tokens: int = 40, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, grammar=SPEC, **kw)


def plain(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def _engine(**cfg):
    cfg = dict(dict(kv_dtype="fp32", page_tokens=16, num_pages=40), **cfg)
    return engine_for(tiny(), **cfg)


def test_apply_bitmask_matches_xgrammar_on_random_masks():
    import xgrammar as xgr
    gen = torch.Generator().manual_seed(0)
    for rows, vocab in ((1, 49152), (3, 100), (5, 33)):
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, (vocab + 31) // 32), generator=gen,
                                dtype=torch.int32)
        logits = torch.randn(rows + 2, vocab, generator=gen)
        ours = apply_bitmask(logits.clone(), bitmask, list(range(1, rows + 1)))
        ref, full = logits.clone(), allocate_bitmask(rows + 2, vocab)  # all allowed
        full[1:rows + 1] = bitmask
        xgr.apply_token_bitmask_inplace(ref, full)
        assert torch.equal(ours, ref)
        assert torch.equal(ours[0], logits[0]) and torch.equal(ours[-1], logits[-1])
    assert allocate_bitmask(2, 33).shape == (2, 2)


def test_constrained_greedy_output_parses_and_validates():
    eng = _engine()
    for prompt in tiny_prompts([9, 20, 5], seed=900):
        res = eng.generate([prompt], constrained())[0]
        assert res.finish_reason == "stop", res.text
        jsonschema.validate(json.loads(res.text), SCHEMA)
        assert list(json.loads(res.text)) == list(SCHEMA["properties"])  # the schema's order
    assert eng.stats()["grammar_compiles"] == 1  # one compile, cached for the next requests
    eng.kv.check_leaks()


def test_json_object_grammar_gives_an_object():
    eng = _engine()
    res = eng.generate(tiny_prompts([7], seed=901), SamplingParams(
        max_tokens=60, grammar=GrammarSpec("json_object")))[0]
    if res.finish_reason == "stop":
        assert isinstance(json.loads(res.text), dict)
    else:  # a random model may write a long object; what it wrote is still an object's start
        assert res.finish_reason == "length" and res.text.startswith("{")


def test_constrained_and_unconstrained_batched_get_what_they_get_alone():
    prompts = tiny_prompts([12, 30, 8, 21, 15], seed=910)
    system = tiny_prompts([20], seed=911)[0]  # a shared prefix for three of them
    prompts = [system + p if i % 2 == 0 else p for i, p in enumerate(prompts)]
    params = [constrained() if i % 2 == 0 else plain() for i in range(len(prompts))]
    alone = [_engine().generate([p], sp)[0] for p, sp in zip(prompts, params)]
    batched = _engine(max_num_seqs=5).generate(prompts, params)
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    for r, sp in zip(batched, params):
        if sp.grammar is not None:
            jsonschema.validate(json.loads(r.text), SCHEMA)


def test_constrained_requests_survive_preemption_unchanged():
    prompts = tiny_prompts([30, 35, 28, 33], seed=920)
    alone = [_engine().generate([p], constrained())[0].token_ids for p in prompts]
    eng = _engine(page_tokens=16, num_pages=7, enable_inline=False, max_num_seqs=4,
                  max_batch_tokens=200)
    results = eng.generate(prompts, constrained())
    assert [r.token_ids for r in results] == alone
    assert eng.stats()["preemptions"] > 0
    eng.kv.check_leaks()


def test_n_samples_each_follow_the_grammar_with_their_own_state():
    eng = _engine()
    res = eng.generate(tiny_prompts([10], seed=930), constrained(
        n=4, temperature=1.5, seed=7))[0]
    texts = [c.text for c in res.completions]
    for c in res.completions:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), SCHEMA)
    assert len(set(texts)) > 1  # the samples went different ways through the grammar
    eng.kv.check_leaks()


def test_max_tokens_inside_the_answer_ends_with_length_and_the_text_so_far():
    eng = _engine()
    full = eng.generate(tiny_prompts([9], seed=900), constrained())[0]
    cut = eng.generate(tiny_prompts([9], seed=900), constrained(max_tokens=4))[0]
    assert cut.finish_reason == "length"
    assert cut.token_ids == full.token_ids[:4] and full.text.startswith(cut.text)


def test_a_schema_the_library_cannot_compile_is_a_request_error_and_leaves_nothing():
    eng = _engine()
    bad = GrammarSpec("json_schema", '{"type": "nonsense"}', what="'response_format'")
    with pytest.raises(RequestError, match=r"'response_format' cannot be used.*nonsense"):
        eng.add_request([1, 2, 3], SamplingParams(grammar=bad))
    assert not eng.has_unfinished() and not eng.requests
    with pytest.raises(RequestError, match="beam"):
        SamplingParams(grammar=SPEC, beam_width=2)


def test_logprobs_are_the_models_before_the_mask():
    eng = _engine()
    prompt = tiny_prompts([11], seed=940)[0]
    free = eng.generate([prompt], SamplingParams(max_tokens=5, ignore_eos=True, logprobs=3))[0]
    lps = free.completions[0].logprobs
    assert [lp.token_id for lp in lps] == free.token_ids
    for lp in lps:  # greedy: the chosen token is the most likely one
        assert lp.top[0][0] == lp.token_id and lp.top[0][1] == pytest.approx(lp.logprob)
        assert len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1]
    forced = eng.generate([prompt], constrained(logprobs=0))[0].completions[0]
    first = forced.logprobs[0]
    assert first.top == () and first.logprob <= lps[0].logprob  # '{' is not the model's top pick
