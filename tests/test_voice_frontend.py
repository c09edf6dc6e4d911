"""edge_runtime/voice/frontend.py: items posted per stream, half-duplex gating, faults."""

from __future__ import annotations

import asyncio

import numpy as np

from edge_runtime.voice.audio_input import InputSpec, Source
from edge_runtime.voice.frontend import Command, Fault, FrontEnd
from edge_runtime.voice.tts import write_wav
from edge_runtime.voice.vad import EnergyVAD, UtteranceCutter, VADConfig


def _front(source, half_duplex):
    async def main():
        queue: asyncio.Queue = asyncio.Queue()
        cutter = UtteranceCutter(VADConfig(backend="energy"), EnergyVAD())
        front = FrontEnd(source, cutter, queue, asyncio.get_running_loop(), realtime=False,
                         half_duplex=half_duplex)
        front.start()
        items = [await queue.get()]
        if half_duplex:  # nothing more arrives until the first command is answered
            await asyncio.sleep(0.3)
            assert queue.empty()
        while items[-1] is not None:
            front.answered()
            items.append(await queue.get())
        front.thread.join(5)
        return items

    return asyncio.run(main())


def test_half_duplex_waits_for_each_answer(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one\ntwo\nthree\n")
    items = _front(Source(InputSpec("text", path)), half_duplex=True)
    assert [i.text for i in items[:-1]] == ["one", "two", "three"] and items[-1] is None


def test_audio_faults_and_truncation_are_posted(tmp_path):
    rng = np.random.default_rng(0)
    quiet = 1e-4 * rng.standard_normal(8000)
    loud = 0.2 * rng.standard_normal(12000)
    write_wav(tmp_path / "a.wav", np.concatenate([quiet, loud, quiet, quiet, loud]).astype(np.float32))
    (tmp_path / "b.wav").write_bytes(b"junk")
    items = _front(Source(InputSpec("folder", tmp_path)), half_duplex=False)
    kinds = [type(i).__name__ for i in items]
    assert kinds == ["Command", "Fault", "Fault", "NoneType"], kinds
    command, truncated, bad = items[0], items[1], items[2]
    assert isinstance(command, Command) and command.utterance.source.name == "a.wav"
    assert isinstance(truncated, Fault) and "a.wav: input ended mid-utterance" in truncated.problem
    assert not truncated.fatal
    assert isinstance(bad, Fault) and "b.wav: not a readable WAV file" in bad.problem


def test_missing_input_is_fatal_for_its_stream(tmp_path):
    items = _front(Source(InputSpec("wav", tmp_path / "gone.wav")), half_duplex=False)
    assert isinstance(items[0], Fault) and items[0].fatal and "gone.wav: file not found" in items[0].problem
    assert items[1] is None
