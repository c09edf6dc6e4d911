"""edge_runtime/voice/report.py: WER normalisation and edit distance, percentiles vs numpy, the
alignment of utterances with reference commands (against an exhaustive oracle)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edge_runtime.voice import report
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


DEMO0 = ["turn on the kitchen lights", "dim the kitchen lights", "play the radio",
         "turn off the kitchen lights"]


def _heard(*transcripts):
    return [{"kind": "utterance", "stream": 0, "utterance": i, "transcript": t, "answer": "ok"}
            for i, t in enumerate(transcripts)]


def test_a_dropped_command_is_a_deletion_and_shifts_no_row():
    events = _heard("Turn on the kitchen lights.", "Dim, location lights.",
                    "Turn off the kitchen lights.")  # "play the radio" was never cut
    assert report.align(DEMO0, [e["transcript"] for e in events]) == \
        [(0, 0), (1, 1), (2, None), (3, 2)]
    s = report.score(DEMO0, [e["transcript"] for e in events])
    assert (s.edits, s.words, s.commands, s.missed) == (2 + 3, 17, 4, ("play the radio",))
    rows = stream_table(0, events, DEMO0).splitlines()[2:6]
    assert "play the radio" in rows[2] and "(not heard)" in rows[2]
    assert "turn off the kitchen lights" in rows[3] and "Turn off the kitchen lights." in rows[3]


def test_a_split_command_is_an_insertion():
    heard = ["turn on the", "kitchen lights", "dim the kitchen lights"]
    assert report.align(DEMO0[:2], heard) == [(0, 0), (None, 1), (1, 2)]
    s = report.score(DEMO0[:2], heard)
    assert (s.edits, s.words, s.extra) == (2 + 2, 9, ("kitchen lights",))
    total = report.Score.total([s, report.score(["play the radio"], ["play the radio"])])
    assert total.wer == pytest.approx(4 / 12) and total.commands == 3
    assert total.gaps() == " (1 extra utterance(s): 'kitchen lights')"


def test_alignment_is_a_minimum_over_all_pairings():
    rng = random.Random(1)
    vocab = "turn on off the lights radio door lock play".split()
    for _ in range(100):
        refs = [" ".join(rng.choices(vocab, k=rng.randint(1, 4))) for _ in range(rng.randint(0, 4))]
        hyps = [" ".join(rng.choices(vocab, k=rng.randint(0, 4))) for _ in range(rng.randint(0, 4))]
        pairs = report.align(refs, hyps)
        assert [i for i, _ in pairs if i is not None] == list(range(len(refs)))
        assert [j for _, j in pairs if j is not None] == list(range(len(hyps)))
        assert report.score(refs, hyps).edits == _best_pairing_cost(refs, hyps)


def _best_pairing_cost(refs, hyps):
    """Oracle: every order-keeping one-to-one pairing, unpaired words all count as errors."""
    from functools import lru_cache

    r, h = [normalize(x) for x in refs], [normalize(x) for x in hyps]

    @lru_cache(maxsize=None)
    def best(i, j):
        if i == len(r) or j == len(h):
            return sum(map(len, r[i:])) + sum(map(len, h[j:]))
        return min(best(i + 1, j + 1) + edit_distance(r[i], h[j]), best(i + 1, j) + len(r[i]),
                   best(i, j + 1) + len(h[j]))

    return best(0, 0)


def test_summary_counts_every_spoken_command(capsys):
    from edge_runtime.commands.voice import _print_summary
    from edge_runtime.voice.loop import StreamReport

    reports = [StreamReport(0, "s0.wav", _heard("turn on the kitchen lights",
                                                "dim the kitchen lights",
                                                "turn off the kitchen lights")),
               StreamReport(1, "s1.wav", _heard("play the radio"))]
    _print_summary(reports, [DEMO0, ["play the radio"]])
    out = capsys.readouterr().out
    assert "word error rate: 15.0% over 5 commands (1 not heard: 'play the radio')" in out
