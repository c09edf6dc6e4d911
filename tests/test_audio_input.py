"""edge_runtime/voice/audio_input.py: resampling against analytic signals, downmix, WAV/PCM/text
reading, and the InputError messages (file named, problem stated); WAV files: test_wav_file.py."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.errors import InputError
from edge_runtime.voice.audio_input import (
    FRAME_SAMPLES, InputSpec, Source, frames_of, parse_input_spec, pcm_frames,
)
from edge_runtime.voice.tts import write_wav
from edge_runtime.voice.wav_file import read_wav
from voice_helpers import random_tones


def test_pcm_rate_option_is_range_checked():
    with pytest.raises(InputError, match="sample rate 99999999999 Hz is outside"):
        parse_input_spec("pcm,rate=99999999999:/tmp/x")
    with pytest.raises(InputError, match="sample rate 100 Hz is outside"):
        list(pcm_frames(Path("/nonexistent.raw"), rate=100))


def test_frames_are_fixed_size_and_zero_padded():
    x = np.random.default_rng(4).uniform(-1, 1, FRAME_SAMPLES * 2 + 100).astype(np.float32)
    frames = list(frames_of(x))
    assert [f.shape for f in frames] == [(FRAME_SAMPLES,)] * 3
    np.testing.assert_array_equal(np.concatenate(frames)[: len(x)], x)
    assert not frames[-1][100:].any()


def test_parse_input_spec(tmp_path):
    (tmp_path / "cmds.txt").write_text("hello\n")
    assert parse_input_spec(str(tmp_path)) == InputSpec("folder", tmp_path)
    assert parse_input_spec(str(tmp_path / "cmds.txt")).kind == "text"
    assert parse_input_spec("mic.raw").kind == "pcm"
    assert parse_input_spec("-").kind == "pcm"
    assert parse_input_spec("a.wav") == InputSpec("wav", Path("a.wav"))
    assert parse_input_spec("pcm:/dev/stdin") == InputSpec("pcm", Path("/dev/stdin"))
    assert parse_input_spec("pcm,rate=8000,channels=2:/tmp/m") == \
        InputSpec("pcm", Path("/tmp/m"), 8000, 2)
    with pytest.raises(InputError, match="bad input option 'rate=fast'"):
        parse_input_spec("pcm,rate=fast:/tmp/m")
    with pytest.raises(InputError, match="only pcm takes"):
        parse_input_spec("wav,rate=8000:/tmp/a.wav")
    fifo = tmp_path / "mic"
    os.mkfifo(fifo)
    assert parse_input_spec(str(fifo)).kind == "pcm"


def test_input_kinds_are_case_insensitive_and_unknown_ones_named(tmp_path):
    assert parse_input_spec("WAV:a.wav") == InputSpec("wav", Path("a.wav"))
    assert parse_input_spec("PCM,rate=8000:/tmp/m") == InputSpec("pcm", Path("/tmp/m"), 8000)
    for spec in ("wave:good.wav", "mic:/tmp/x"):
        with pytest.raises(InputError, match=rf"unknown input kind '{spec.split(':')[0]}'.*"
                                             r"use wav:, folder:, pcm: or text:"):
            parse_input_spec(spec)
    odd = tmp_path / "notes:1.wav"  # an existing path with a colon is still a path
    odd.write_bytes(b"")
    assert parse_input_spec(str(odd)) == InputSpec("wav", odd)


@pytest.mark.parametrize("spec", ["", "wav:", "text:", "pcm,rate=8000:"])
def test_empty_path_is_rejected(spec):
    with pytest.raises(InputError, match="empty path"):
        parse_input_spec(spec)


def test_pcm_fifo_streams_what_the_writer_wrote(tmp_path):
    rng = np.random.default_rng(5)
    pcm = rng.integers(-30000, 30000, FRAME_SAMPLES * 3 + 17, dtype=np.int16)
    fifo = tmp_path / "mic"
    os.mkfifo(fifo)

    def writer():
        with open(fifo, "wb") as f:
            data = pcm.astype("<i2").tobytes()
            for i in range(0, len(data), 300):  # odd-sized writes, as arecord might do
                f.write(data[i : i + 300])
                f.flush()

    thread = threading.Thread(target=writer)
    thread.start()
    frames = list(pcm_frames(fifo))
    thread.join()
    got = np.concatenate(frames)
    np.testing.assert_array_equal(got[: len(pcm)], pcm.astype(np.float32) / 32768.0)
    assert len(frames) == 4 and not got[len(pcm) :].any()


def test_pcm_8k_stereo_pipe_is_converted_like_a_file(tmp_path):
    rng = np.random.default_rng(7)
    left, at = random_tones(rng, 8000, 0.7, max_hz=3000)
    stereo = np.stack([left, 0.5 * left], axis=1)  # [n, 2]
    raw = tmp_path / "mic.raw"
    raw.write_bytes((stereo * 32767).astype("<i2").tobytes())
    wav = tmp_path / "same.wav"
    write_wav(wav, stereo, rate=8000, channels=2)
    got = np.concatenate(list(pcm_frames(raw, rate=8000, channels=2)))
    want = read_wav(wav)
    np.testing.assert_allclose(got[: len(want)], want, atol=1e-4)  # float32 vs float64 rounding
    assert not got[len(want):].any()
    ref = 0.75 * at(np.arange(len(want)) / 16000)
    assert np.abs(want[320:-320] - ref[320:-320]).max() < 2e-3


def test_pcm_odd_byte_count_is_an_error(tmp_path):
    raw = tmp_path / "x.raw"
    raw.write_bytes(b"\x01\x02\x03")
    with pytest.raises(InputError, match=r"x\.raw: ended inside a sample"):
        list(pcm_frames(raw))


def test_folder_reports_bad_file_and_continues(tmp_path):
    rng = np.random.default_rng(6)
    write_wav(tmp_path / "a.wav", rng.uniform(-0.5, 0.5, 1600).astype(np.float32))
    (tmp_path / "b.wav").write_bytes(b"not a wav at all")
    write_wav(tmp_path / "c.wav", rng.uniform(-0.5, 0.5, 800).astype(np.float32), rate=8000)
    items = list(Source(InputSpec("folder", tmp_path)).recordings())
    assert [type(i).__name__ for i in items] == ["Recording", "InputError", "Recording"]
    assert "b.wav" in str(items[1]) and items[2].path.name == "c.wav"
    assert sum(len(f) for f in items[2].frames()) == 4 * FRAME_SAMPLES  # 1600 samples at 16k


def test_text_commands(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("turn on the lights\n\n  lock the door  \n")
    (rec,) = Source(InputSpec("text", path)).recordings()
    assert rec.lines == ["turn on the lights", "lock the door"]
    (tmp_path / "blank.txt").write_text("\n \n")
    with pytest.raises(InputError, match=r"blank\.txt: contains no commands"):
        list(Source(InputSpec("text", tmp_path / "blank.txt")).recordings())
