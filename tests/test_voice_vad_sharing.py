"""edge_runtime/voice/vad.py and loop.py: one silero ONNX session serves every stream (its state
lives in each SileroVAD, so streams stay independent), and text streams get no VAD at all."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from edge_runtime.voice import loop as loop_module
from edge_runtime.voice.audio_input import FRAME_SAMPLES, InputSpec, Source
from edge_runtime.voice.loop import LoopSettings, VoiceLoop
from edge_runtime.voice.vad import SileroVAD, VADConfig
from voice_helpers import smollm2_tokenizer
from test_voice_cli import ScriptedEngine


def _frames(rng, n):
    """Random frames, some loud (speech-like noise bursts) and some quiet."""
    return [(rng.choice([0.3, 1e-3]) * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32)
            for _ in range(n)]


def test_silero_streams_share_one_session_and_stay_independent():
    a, b = SileroVAD(), SileroVAD()
    if a._session is None:
        pytest.skip("onnxruntime not installed: the TorchScript fallback keeps one model each")
    assert a._session is b._session
    rng = np.random.default_rng(0)
    xs, ys = _frames(rng, 40), _frames(rng, 40)
    solo = SileroVAD()
    alone_x = [solo.prob(x) for x in xs]
    solo.reset()
    alone_y = [solo.prob(y) for y in ys]
    inter_x, inter_y = [], []
    for x, y in zip(xs, ys):  # two streams' frames interleaved on the shared session
        inter_x.append(a.prob(x))
        inter_y.append(b.prob(y))
    np.testing.assert_allclose(inter_x, alone_x, atol=1e-6)
    np.testing.assert_allclose(inter_y, alone_y, atol=1e-6)


def test_shared_session_from_several_threads_equals_one_stream_at_a_time():
    if SileroVAD()._session is None:
        pytest.skip("onnxruntime not installed")
    rng = np.random.default_rng(1)
    signals = [_frames(rng, 150) for _ in range(4)]
    solo = []
    for frames in signals:
        vad = SileroVAD()
        solo.append([vad.prob(f) for f in frames])
    together: list = [None] * len(signals)

    def run(i):  # one front-end thread per stream, as in the loop
        vad = SileroVAD()
        together[i] = [vad.prob(f) for f in signals[i]]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(signals))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_allclose(together, solo, atol=1e-6)


def test_text_streams_make_no_vad(tmp_path, monkeypatch):
    made = []
    real = loop_module.make_detector
    monkeypatch.setattr(loop_module, "make_detector", lambda config: made.append(config) or
                        real(config))
    tok = smollm2_tokenizer()
    sources = []
    for i in range(3):
        (tmp_path / f"{i}.txt").write_text("turn on the radio\n")
        sources.append(Source(InputSpec("text", tmp_path / f"{i}.txt")))
    vloop = VoiceLoop(ScriptedEngine(tok), tok, None, "system", LoopSettings(
        vad=VADConfig(backend="silero")), eos_token_ids=(2,))
    reports = asyncio.run(vloop.run(sources))
    assert [len(r.events) for r in reports] == [1, 1, 1] and all(r.events[0]["answer"]
                                                                  for r in reports)
    assert made == []  # 200 text streams held 200 silero sessions (1.7 GB) before
