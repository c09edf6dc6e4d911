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


@pytest.fixture
def soundfile_spy(monkeypatch):
    """soundfile.read that fails the test when handed anything but a regular file: its open
    holds a lock every stream shares, so a FIFO there would stall every other stream's WAVs."""
    import stat

    import soundfile

    real = soundfile.read

    def read(file, *args, **kwargs):
        mode = os.stat(file).st_mode if isinstance(file, (str, Path)) else \
            os.fstat(file.fileno()).st_mode if hasattr(file, "fileno") else stat.S_IFREG
        assert stat.S_ISREG(mode), f"soundfile was handed a non-regular file: {file}"
        return real(file, *args, **kwargs)

    monkeypatch.setattr(soundfile, "read", read)


def test_fifo_as_wav_is_refused_before_soundfile_opens_it(tmp_path, soundfile_spy):
    write_wav(tmp_path / "a.wav", np.full(1600, 0.1, np.float32))
    os.mkfifo(tmp_path / "b.wav")  # e.g. `arecord -t wav > b.wav` in a folder of recordings
    write_wav(tmp_path / "c.wav", np.full(800, 0.1, np.float32))
    items = list(Source(InputSpec("folder", tmp_path)).recordings())
    assert [type(i).__name__ for i in items] == ["Recording", "InputError", "Recording"]
    assert str(items[1]) == f"{tmp_path / 'b.wav'}: not a regular file (a FIFO); for a pipe " \
                            "use pcm: or -"
    with pytest.raises(InputError, match=r"b\.wav: not a regular file \(a FIFO\)"):
        list(Source(InputSpec("wav", tmp_path / "b.wav")).recordings())


def test_folder_symlink_loop_and_dangling_link_are_named(tmp_path):
    write_wav(tmp_path / "a.wav", np.full(1600, 0.1, np.float32))
    os.symlink("loop2.wav", tmp_path / "loop1.wav")
    os.symlink("loop1.wav", tmp_path / "loop2.wav")
    os.symlink("/nonexistent.wav", tmp_path / "gone.wav")
    items = list(Source(InputSpec("folder", tmp_path)).recordings())
    assert [type(i).__name__ for i in items] == ["Recording", "InputError", "InputError",
                                                 "InputError"]
    assert "gone.wav: file not found (a symlink to /nonexistent.wav, which does not exist)" \
        in str(items[1])
    assert "loop1.wav: symlink loop" in str(items[2]) and "loop2.wav: symlink loop" in str(items[3])


def test_text_input_must_be_a_regular_file(tmp_path):
    for spec in ("text:-", "wav:-", "folder:-"):
        with pytest.raises(InputError, match=r"stdin \(-\) carries raw audio only \(pcm:- or -\)"):
            parse_input_spec(spec)
    fifo = tmp_path / "typed.txt"
    os.mkfifo(fifo)  # nothing writes to it: reading must not block
    with pytest.raises(InputError, match=r"typed\.txt: not a regular file \(a FIFO\); text input "
                                         r"must be a regular file of commands, one per line"):
        list(Source(InputSpec("text", fifo)).recordings())


def _wav_with_data_size(path, audio, size, tail=b""):
    """A 16-bit WAV of `audio` whose data chunk declares `size` bytes, with `tail` appended."""
    write_wav(path, audio)
    data = bytearray(path.read_bytes())
    at = data.index(b"data") + 4
    data[at : at + 4] = size.to_bytes(4, "little")
    path.write_bytes(bytes(data) + tail)
    return len(audio) * 2


@pytest.mark.parametrize("size", [0x80000000, 0x7FFFFFFF, 0x7FFFFF00, 0xFFFFFFFF, 0])
def test_streaming_writers_placeholder_size_is_read_to_the_end(tmp_path, size):
    audio = np.random.default_rng(8).uniform(-0.5, 0.5, 1000).astype(np.float32)
    path = tmp_path / "arecord.wav"  # `arecord -f S16_LE -r 16000 > arecord.wav`, then Ctrl-C
    _wav_with_data_size(path, audio, size)
    (rec,) = Source(InputSpec("wav", path)).recordings()
    assert rec.cut_short is None  # not "truncated": nothing is missing
    got = np.concatenate(list(rec.frames()))
    np.testing.assert_allclose(got[:1000], audio, atol=1 / 32767)
    assert not got[1000:].any()


def test_data_size_smaller_than_the_file_is_reported(tmp_path):
    audio = np.random.default_rng(9).uniform(-0.5, 0.5, 16000).astype(np.float32)
    path = tmp_path / "short_header.wav"
    _wav_with_data_size(path, audio, 8000 * 2)  # declares the first half only
    (rec,) = Source(InputSpec("wav", path)).recordings()
    assert sum(len(f) for f in rec.frames()) == 16 * FRAME_SAMPLES  # 8000 samples, padded
    assert rec.cut_short.startswith(f"{path}: header disagrees with the file size: its data "
                                    "chunk declares 0.50 s but 16000 more bytes (~0.50 s) follow")
    listed = tmp_path / "listed.wav"  # the same bytes as a LIST chunk after the data: fine
    n = _wav_with_data_size(listed, audio[:8000], 8000 * 2,
                            tail=b"LIST" + (16000 - 8).to_bytes(4, "little") + bytes(16000 - 8))
    (rec,) = Source(InputSpec("wav", listed)).recordings()
    assert rec.cut_short is None and n == 16000
