"""edge_runtime/commands/voice.py: usage errors are one stderr line and exit status 2, found
before any model is loaded (so these tests load none)."""

from __future__ import annotations

import os

import pytest

from edge_runtime.cli import main


def _usage_error(capsys, *argv: str) -> str:
    assert main(["voice", "--quiet", *argv]) == 2
    return capsys.readouterr().err


@pytest.fixture
def texts(tmp_path):
    paths = []
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.txt").write_text("turn on the radio\n")
        paths.append(str(tmp_path / f"{name}.txt"))
    return paths


def test_more_inputs_than_streams_is_a_usage_error(capsys, texts):
    args = [a for p in texts for a in ("--input", p)]
    err = _usage_error(capsys, *args, "--streams", "2")
    assert "3 inputs but --streams 2" in err and "every input needs its own stream" in err


@pytest.mark.parametrize("flag", ["--streams", "--max-tokens"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_zero_or_negative_counts_are_rejected(capsys, texts, flag, value):
    err = _usage_error(capsys, "--input", texts[0], flag, value)
    assert f"{flag} must be >= 1, got {value}" in err


@pytest.mark.parametrize("streams", ["6", "-1"])
def test_demo_stream_count_is_checked(capsys, streams):
    err = _usage_error(capsys, "--demo", "--streams", streams)
    assert "must be >= 1" in err if streams == "-1" else "--demo has 1-5 streams" in err


def test_a_pipe_cannot_feed_two_streams(capsys, tmp_path, texts):
    fifo = tmp_path / "mic"
    os.mkfifo(fifo)
    err = _usage_error(capsys, "--input", str(fifo), "--input", str(fifo))
    assert f"pipe {fifo} would feed streams 0, 1" in err
    err = _usage_error(capsys, "--input", str(fifo), "--input", texts[0], "--streams", "3")
    assert "would feed streams 0, 2" in err  # reused round-robin
    err = _usage_error(capsys, "--input", "-", "--streams", "2")
    assert "stdin (-) would feed streams 0, 1" in err


def test_a_regular_raw_file_may_feed_several_streams(tmp_path):
    from edge_runtime.commands.voice import _check_pipes_unshared
    from edge_runtime.voice.audio_input import Source, parse_input_spec

    (tmp_path / "x.raw").write_bytes(b"\0\0" * 100)
    _check_pipes_unshared([Source(parse_input_spec(str(tmp_path / "x.raw")))] * 2)


@pytest.mark.parametrize("spec", ["", "wav:", "text:", "pcm,rate=8000:"])
def test_empty_input_path_is_rejected(capsys, texts, spec):
    err = _usage_error(capsys, "--input", texts[0], "--input", spec)
    assert "input 1: empty path" in err


def test_unwritable_tts_dir_is_a_usage_error(capsys, tmp_path, texts):
    (tmp_path / "good.wav").write_bytes(b"RIFF")
    err = _usage_error(capsys, "--input", texts[0], "--tts", "--tts-dir",
                       str(tmp_path / "good.wav" / "ans"))
    assert "--tts-dir" in err and "cannot create the folder" in err


def test_unwritable_events_path_is_a_usage_error(capsys, tmp_path, texts):
    err = _usage_error(capsys, "--input", texts[0], "--events", str(tmp_path / "no" / "e.jsonl"))
    assert f"folder {tmp_path / 'no'} does not exist" in err
    err = _usage_error(capsys, "--input", texts[0], "--events", str(tmp_path))
    assert "is a directory" in err
