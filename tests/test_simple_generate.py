"""The simple batch generator on a small random Llama: batch == one by one, seeded sampling is
reproducible, EOS and the context limit end a sequence, too-long prompts are refused."""

from __future__ import annotations

import pytest
from model_helpers import random_ids, save_random_model, tiny_hf_config

from edge_runtime.errors import RequestError
from edge_runtime.model.loader import load_model
from edge_runtime.model.simple_generate import generate


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = save_random_model(tiny_hf_config("llama", max_position_embeddings=64),
                               tmp_path_factory.mktemp("gen"), seed=5)
    return load_model(str(folder), progress=None).model


def prompts(vocab):
    return [random_ids(n, vocab, seed=n) for n in (3, 17, 1, 40)]


def test_batch_equals_one_by_one_greedy(model):
    ps = prompts(model.config.vocab_size)
    batch = generate(model, ps, [8, 5, 12, 3], eos_token_ids=())
    for p, n, res in zip(ps, [8, 5, 12, 3], batch):
        (alone,) = generate(model, [p], n, eos_token_ids=())
        assert res.token_ids == alone.token_ids and len(res.token_ids) == n
        assert res.finish_reason == "length" and res.prompt_tokens == len(p)


def test_seeded_sampling_is_reproducible(model):
    ps = prompts(model.config.vocab_size)
    a = generate(model, ps, 10, temperature=1.5, seed=123, eos_token_ids=())
    b = generate(model, ps, 10, temperature=1.5, seed=123, eos_token_ids=())
    c = generate(model, ps, 10, temperature=1.5, seed=124, eos_token_ids=())
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_eos_stops_and_is_included(model):
    p = random_ids(6, model.config.vocab_size, seed=9)
    (free,) = generate(model, [p], 6, eos_token_ids=())
    eos = free.token_ids[2]
    (stopped,) = generate(model, [p], 6, eos_token_ids=[eos])
    first = free.token_ids.index(eos)
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason == "stop"


def test_context_limit_and_too_long_prompt(model):
    vocab = model.config.vocab_size
    (res,) = generate(model, [random_ids(60, vocab, seed=1)], 10, eos_token_ids=())
    assert len(res.token_ids) == 4 and res.finish_reason == "length"  # 60 + 4 == context 64
    with pytest.raises(RequestError, match="64"):
        generate(model, [random_ids(64, vocab, seed=2)], 1)
    with pytest.raises(RequestError, match="empty"):
        generate(model, [[]], 1)
