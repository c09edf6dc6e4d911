"""edge_runtime/voice/report.py: WER normalisation and edit distance, percentiles vs numpy."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edge_runtime.voice.report import (
    edit_distance, latency_split, normalize, number_words, percentile, split_table, stream_table,
    wer, word_errors,
)


def test_normalize():
    assert normalize("Set the thermostat to 21 degrees.") == \
        "set the thermostat to twenty one degrees".split()
    assert normalize("What's   the TEMPERATURE? 100%") == \
        "whats the temperature one hundred percent".split()
    assert normalize("twenty-one, 1,500 and 7") == \
        "twenty one one thousand five hundred and seven".split()
    assert number_words(0) == "zero" and number_words(90) == "ninety"
    assert number_words(342) == "three hundred forty two"


def _reference_distance(a, b):
    """Plain recursive Levenshtein (memoised) as the oracle."""
    from functools import lru_cache

    @lru_cache(maxsize=None)
    def d(i, j):
        if i == 0 or j == 0:
            return i + j
        return min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))

    return d(len(a), len(b))


def test_edit_distance_against_oracle():
    rng = random.Random(0)
    vocab = "the lights on off door lock radio a b".split()
    for _ in range(200):
        a = [rng.choice(vocab) for _ in range(rng.randint(0, 8))]
        b = [rng.choice(vocab) for _ in range(rng.randint(0, 8))]
        assert edit_distance(a, b) == _reference_distance(a, b)


def test_wer_is_corpus_level():
    pairs = [("turn on the lights", "Turn on the lights."),  # 0 / 4
             ("lock the front door", "lock my front door"),  # 1 / 4
             ("play the radio", "play radio now")]  # 2 / 3
    assert word_errors(*pairs[2]) == (2, 3)
    assert wer(pairs) == pytest.approx(3 / 11)
    with pytest.raises(AssertionError):
        wer([("", "x")])


def test_percentile_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 50):
        xs = list(rng.exponential(1.0, n))
        for q in (0, 50, 95, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert np.isnan(percentile([], 50))


def test_tables_from_events():
    events = [{"kind": "utterance", "stream": 0, "utterance": i, "transcript": f"cmd {i}",
               "answer": "ok", "first_token_s": 0.5 + i, "prompt_tokens": 200 + 20 * i,
               "cached_prompt_tokens": 190 * (i > 0) + 20 * i, "vad_s": 0.4, "asr_s": 0.3,
               "asr_queue_s": 0.0, "turn_wait_s": 0.0, "engine_queue_s": 0.01,
               "answer_s": 1.0, "total_s": 2.0} for i in range(3)]
    text = stream_table(0, events, ["a", "b", "c"])
    assert "p50 1.50s" in text and "cmd 2" in text and "230/240" in text
    split = latency_split(events)
    assert split["first_token_s"]["p50"] == pytest.approx(1.5)
    assert split["asr_s"]["mean"] == pytest.approx(0.3)


def test_tables_without_answers_print_dashes_not_nan():
    skipped = [{"kind": "utterance", "stream": 1, "utterance": 0, "transcript": "",
                "skipped": "no speech recognised"}]
    for events in ([], skipped):
        text = stream_table(1, events)
        assert "nan" not in text
        assert "p50 -  p95 -;  cached prompt share, turns >= 2: -" in text
    split = split_table(latency_split(skipped))
    assert "nan" not in split and "      -       -       -" in split
