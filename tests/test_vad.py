"""edge_runtime/voice/vad.py: silero streaming against the silero_vad package's own wrapper, and
the utterance cutter (min speech, min silence, padding, max length, truncation) on bursts with
known boundaries."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.voice.audio_input import FRAME_S, FRAME_SAMPLES, SAMPLE_RATE, frames_of
from edge_runtime.voice.vad import EnergyVAD, SileroVAD, UtteranceCutter, VADConfig

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="needs espeak-ng (apt-get install espeak-ng)")


def _bursts(rng, layout: list[tuple[str, float]]) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """('s' | 'n', seconds) pieces: loud random noise for speech, faint noise for silence.
    Returns the audio and the (start, end) seconds of each speech piece."""
    parts, spans, t = [], [], 0.0
    for kind, seconds in layout:
        n = int(round(seconds * SAMPLE_RATE))
        amp = 0.2 if kind == "s" else 1e-4
        parts.append((amp * rng.standard_normal(n)).astype(np.float32))
        if kind == "s":
            spans.append((t, t + n / SAMPLE_RATE))
        t += n / SAMPLE_RATE
    return np.concatenate(parts), spans


def _cut(audio: np.ndarray, config: VADConfig, detector=None, source=Path("x.wav")):
    cutter = UtteranceCutter(config, detector or EnergyVAD())
    cutter.new_recording(source)
    out = [u for u in (cutter.push(f) for f in frames_of(audio)) if u is not None]
    last = cutter.finish()
    return out + ([last] if last is not None else [])


ENERGY = VADConfig(backend="energy", min_speech_ms=200, min_silence_ms=400, pad_ms=160)


def test_energy_cutter_finds_known_bursts():
    rng = np.random.default_rng(0)
    audio, spans = _bursts(rng, [("n", 0.7), ("s", 1.1), ("n", 0.9), ("s", 0.6), ("n", 1.0),
                                 ("s", 1.5), ("n", 0.8)])
    utts = _cut(audio, ENERGY)
    assert [u.index for u in utts] == [0, 1, 2]
    for u, (start, end) in zip(utts, spans):
        assert abs(u.start_s - start) <= FRAME_S and abs(u.end_s - end) <= FRAME_S
        assert not u.truncated and u.source == Path("x.wav")
        # speech plus up to pad_ms on each side, in whole frames
        assert abs(len(u.audio) / SAMPLE_RATE - (end - start) - 0.32) <= 2 * FRAME_S


def test_short_gaps_do_not_split_and_blips_are_dropped():
    rng = np.random.default_rng(1)
    audio, _ = _bursts(rng, [("n", 0.5), ("s", 0.6), ("n", 0.2), ("s", 0.6), ("n", 0.8),
                             ("s", 0.064), ("n", 0.8)])
    utts = _cut(audio, ENERGY)
    assert len(utts) == 1  # 200 ms gap < min_silence; 64 ms blip < min_speech
    assert abs(utts[0].end_s - utts[0].start_s - 1.4) <= 2 * FRAME_S


def _drafts_and_cuts(audio: np.ndarray, config: VADConfig):
    """(frame number, draft) of every settled() draft and (frame number, utterance) of every cut."""
    cutter = UtteranceCutter(config, EnergyVAD())
    cutter.new_recording(Path("x.wav"))
    drafts, cuts = [], []
    for i, frame in enumerate(frames_of(audio)):
        utt = cutter.push(frame)
        draft = cutter.settled()
        if draft is not None:
            drafts.append((i, draft))
        if utt is not None:
            cuts.append((i, utt))
    return drafts, cuts


@pytest.mark.parametrize("pad_ms", [0, 64, 160])
def test_a_settled_draft_comes_once_before_its_cut_with_the_same_audio(pad_ms):
    rng = np.random.default_rng(7)
    config = VADConfig(backend="energy", min_speech_ms=200, min_silence_ms=400, pad_ms=pad_ms)
    audio, _ = _bursts(rng, [("n", 0.7), ("s", 1.1), ("n", 0.9), ("s", 0.6), ("n", 1.0),
                             ("s", 0.064), ("n", 0.8)])  # the 64 ms blip: no draft, no cut
    drafts, cuts = _drafts_and_cuts(audio, config)
    assert len(drafts) == len(cuts) == 2
    for (draft_at, draft), (cut_at, utt) in zip(drafts, cuts):
        # pad frames of silence (at least one) after the speech: min_silence - pad frames early
        silence_frames = max(1, round(pad_ms / (FRAME_S * 1000)))
        assert cut_at - draft_at == round(400 / (FRAME_S * 1000)) - silence_frames
        assert utt.same_speech(draft) and np.array_equal(utt.audio, draft.audio)
        assert draft.end_wall == utt.end_wall


def test_a_draft_whose_speech_resumes_is_not_the_cut_utterance():
    rng = np.random.default_rng(8)
    # a 256 ms pause: past pad_ms (a draft), short of min_silence (no cut)
    audio, spans = _bursts(rng, [("n", 0.5), ("s", 0.6), ("n", 0.256), ("s", 0.6), ("n", 0.8)])
    drafts, cuts = _drafts_and_cuts(audio, ENERGY)
    assert len(drafts) == 2 and len(cuts) == 1
    utt = cuts[0][1]
    assert not utt.same_speech(drafts[0][1]) and utt.same_speech(drafts[1][1])
    assert abs(drafts[0][1].end_s - spans[0][1]) <= FRAME_S
    assert np.array_equal(utt.audio, drafts[1][1].audio)


def test_input_ending_mid_speech_is_truncated_but_trailing_silence_is_not():
    rng = np.random.default_rng(2)
    audio, _ = _bursts(rng, [("n", 0.5), ("s", 0.8), ("n", 0.8), ("s", 0.7)])
    utts = _cut(audio, ENERGY)
    assert [u.truncated for u in utts] == [False, True]
    audio, _ = _bursts(rng, [("n", 0.5), ("s", 0.8), ("n", 0.25)])  # ends inside min_silence
    (utt,) = _cut(audio, ENERGY)
    assert not utt.truncated


def test_speech_longer_than_max_utterance_is_one_run_on_utterance():
    rng = np.random.default_rng(3)
    audio, spans = _bursts(rng, [("n", 0.3), ("s", 3.3), ("n", 0.8), ("s", 0.6), ("n", 0.8)])
    config = VADConfig(backend="energy", max_utterance_s=1.5)
    run_on, command = _cut(audio, config)
    assert run_on.run_on and not command.run_on  # not two halves sent as commands
    assert abs(run_on.start_s - spans[0][0]) <= FRAME_S and abs(run_on.end_s - spans[0][1]) <= FRAME_S
    assert len(run_on.audio) <= (1.5 + 0.16) * SAMPLE_RATE + FRAME_SAMPLES  # bounded memory
    assert abs(command.start_s - spans[1][0]) <= FRAME_S and command.index == 1
    (open_at_end,) = _cut(audio[: int(2.5 * SAMPLE_RATE)], config)  # input ends in the run-on
    assert open_at_end.run_on


def test_new_recording_closes_the_open_utterance():
    rng = np.random.default_rng(4)
    cutter = UtteranceCutter(ENERGY, EnergyVAD())
    cutter.new_recording(Path("a.wav"))
    audio, _ = _bursts(rng, [("n", 0.3), ("s", 0.6)])
    assert all(cutter.push(f) is None for f in frames_of(audio))
    utt = cutter.new_recording(Path("b.wav"))
    assert utt is not None and utt.source == Path("a.wav") and not utt.truncated


def test_silero_streaming_matches_the_package_wrapper():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    from silero_vad import load_silero_vad  # its import sets torch threads to 1

    torch.set_num_threads(threads)
    reference = load_silero_vad(onnx=True)
    rng = np.random.default_rng(5)
    audio, _ = _bursts(rng, [("n", 0.3), ("s", 0.5), ("n", 0.4)])
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(len(audio)) / SAMPLE_RATE) * (audio != 0)
    ours = SileroVAD()
    for frame in frames_of((audio + tone).astype(np.float32)):
        want = float(reference(torch.from_numpy(frame.copy()), SAMPLE_RATE))
        assert abs(ours.prob(frame) - want) < 1e-5
    ours.reset()
    reference.reset_states()
    frame = audio[:FRAME_SAMPLES]
    assert abs(ours.prob(frame) - float(reference(torch.from_numpy(frame.copy()), 16000))) < 1e-5


@needs_espeak
def test_silero_cuts_spoken_commands():
    from edge_runtime.voice.tts import synthesize

    speech = [synthesize(t) for t in ("turn on the lights", "lock the front door", "stop")]
    gap = np.zeros(SAMPLE_RATE, np.float32)
    audio = np.concatenate([gap, speech[0], gap, speech[1], gap, speech[2], gap])
    # reference boundaries: first and last sample above 1% of full scale in each piece
    bounds, t = [], len(gap)
    for s in speech:
        loud = np.flatnonzero(np.abs(s) > 0.01)
        bounds.append(((t + loud[0]) / SAMPLE_RATE, (t + loud[-1]) / SAMPLE_RATE))
        t += len(s) + len(gap)
    utts = _cut(audio, VADConfig(), SileroVAD())
    assert len(utts) == 3
    for u, (start, end) in zip(utts, bounds):
        assert abs(u.start_s - start) < 0.15 and abs(u.end_s - end) < 0.25


def test_config_validation():
    with pytest.raises(ConfigError, match="backend"):
        VADConfig(backend="webrtc")
    with pytest.raises(ConfigError, match="threshold"):
        VADConfig(threshold=1.5)
    with pytest.raises(ConfigError, match="min_silence_ms"):
        VADConfig(min_silence_ms=-1)
