"""tools/streaming_asr_probe.py: the home's language model is a proper back-off model (each
history's probabilities and its back-off mass sum to one), written from the home's YAML, and
pocketsphinx loads it and decodes with it."""

import math

import pytest
from tool_helpers import load_tool

from edge_runtime.voice.command_set import HOMES

probe = load_tool("streaming_asr_probe")


def _read_arpa(path):
    grams, order = {}, 0
    for line in path.read_text().splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1])
            continue
        parts = line.split("\t")
        if order and len(parts) >= 2:
            grams[tuple(parts[1].split())] = (float(parts[0]),
                                              float(parts[2]) if len(parts) > 2 else 0.0)
    return grams


def _prob(grams, history, word):
    """P(word | history) by the ARPA back-off rule."""
    if (*history, word) in grams:
        return 10 ** grams[(*history, word)][0]
    backoff = 10 ** grams[history][1] if history in grams else 1.0
    return backoff * _prob(grams, history[1:], word)


@pytest.mark.parametrize("home", sorted(HOMES))
def test_the_homes_model_sums_to_one_for_every_history(home, tmp_path):
    sentences = probe.home_sentences(HOMES[home])
    words = {w for s in sentences for w in s}
    assert {"thermostat", "blinds"} <= words if home == "home" else {"curtains"} <= words
    probe.write_arpa(sentences, tmp_path / "home.arpa")
    grams = _read_arpa(tmp_path / "home.arpa")
    vocab = [g[0] for g in grams if len(g) == 1 and g[0] != "<s>"]
    histories = sorted({g[:-1] for g in grams if len(g) > 1})
    for history in histories[:200]:
        total = sum(_prob(grams, history, w) for w in vocab)
        assert math.isclose(total, 1.0, rel_tol=1e-3), (history, total)


def test_pocketsphinx_decodes_with_the_homes_model(tmp_path):
    pytest.importorskip("pocketsphinx")
    import numpy as np

    probe.write_arpa(probe.home_sentences(HOMES["home"]), tmp_path / "home.arpa")
    sphinx = probe.StreamingSphinx(tmp_path / "home.arpa")
    words, streamed, end = sphinx.run(np.zeros(16000, np.float32))  # a second of silence
    assert words == "" and streamed >= 0 and end >= 0
