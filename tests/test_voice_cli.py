"""edge_runtime/commands/voice.py: usage errors are one stderr line and exit status 2, found
before any model is loaded (so these tests load none)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import numpy as np
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


# --------------------------------------------------------------------------- a run with doubles
# The tests below run the command to its end with the model replaced by `ScriptedEngine` (the
# AsyncEngine.stream contract, answering "OK."), so they load no model; a usage error must come
# before `load_runtime`, which `no_model` turns into a test failure.


class ScriptedEngine:
    """Answers every prompt with "OK."; `before(n)` runs before the n-th request (1 = the
    system-prompt prefill)."""

    def __init__(self, tokenizer, before=None):
        self.tokenizer = tokenizer
        self.before = before
        self.requests = 0

    async def stream(self, prompt_ids, params=None, request_id=None, stream_id=None):
        from edge_runtime.engine.api import Completion, GenerationResult, TokenEvent

        self.requests += 1
        if self.before:
            await self.before(self.requests)
        ids = self.tokenizer.encode("OK.", add_special_tokens=False)
        yield TokenEvent(request_id, 0, ids, "OK.")
        yield TokenEvent(request_id, 0, [], "", result=GenerationResult(
            request_id, len(prompt_ids), 0, [Completion("OK.", ids, "stop")]))

    def shutdown(self) -> None:
        pass


@pytest.fixture
def fake_model(monkeypatch):
    """`edge-runtime voice` runs on ScriptedEngine; returns it to adjust (`.before`)."""
    from edge_runtime.voice import session
    from voice_helpers import smollm2_tokenizer

    engine = ScriptedEngine(smollm2_tokenizer())
    monkeypatch.setattr(session, "load_runtime", lambda *a, **k: session.Runtime(
        engine.tokenizer, (2,), engine, None))
    return engine


@pytest.fixture
def no_model(monkeypatch):
    from edge_runtime.voice import session

    def load_runtime(*args, **kwargs):
        raise AssertionError("the model was loaded before the usage error was found")

    monkeypatch.setattr(session, "load_runtime", load_runtime)


def test_demo_refuses_input(capsys, texts, no_model):
    err = _usage_error(capsys, "--demo", "--input", texts[0])
    assert "--demo makes its own inputs; drop --input" in err


@pytest.mark.parametrize("value", ["inf", "1e12", "nan", "-5", "3601"])
def test_stagger_must_be_finite_and_bounded(capsys, texts, no_model, value):
    err = _usage_error(capsys, "--input", texts[0], f"--stagger={value}")
    assert "--stagger must be a number of seconds from 0 to 3600" in err


def test_device_is_checked_before_the_model_loads(capsys, texts, no_model, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = _usage_error(capsys, "--input", texts[0], "--device", "cuda")
    assert "--device cuda: no CUDA GPU is usable on this machine" in err
    err = _usage_error(capsys, "--input", texts[0], "--device", "tpu")
    assert "--device 'tpu': unknown device" in err


BAD_VOICE_CONFIGS = [  # (YAML, what the one error line must say)
    ('vad: {threshold: "abc"}',
     "vad.threshold must be a number at least 0.2 and below 1, got 'abc'"),
    ('cpu: {asr_workers: "2"}', "cpu.asr_workers must be a whole number from 1 to 1024, got '2' "
                                "(text, not a number: drop the quotes)"),
    ("vad: {pad_ms: 1e9}", "vad.pad_ms must be a number from 0 to 5000, got '1e9' (YAML reads"),
    ('server_retry_s: "x"', "server_retry_s must be a number from 0 to 86400, got 'x'"),
    ("cpu: 5", "cpu must be a mapping of settings"),
    ("vad: [1, 2]", "vad must be a mapping of settings"),
    ("vad: {max_utterance_s: .nan}",
     "vad.max_utterance_s must be a number above 1 and at most 600, got nan"),
    ("vad: {min_silence_ms: .inf}", "vad.min_silence_ms must be a number from 0 to 10000, got inf"),
    ("history_tokens: .nan", "history_tokens must be a whole number >= 0, got nan"),
    ("system_prompt: null", "system_prompt must be the path of a YAML file, got null"),
    ("max_tokens: 2.5", "max_tokens must be a whole number >= 1, got 2.5"),
    ("asr: 5", "asr must be a non-empty text, got 5"),
    ('asr_hint: "no"', "asr_hint must be true or false, got 'no'"),
    ('jump_forward: "off"', "jump_forward must be true or false, got 'off'"),
    ("cpu: {max_tokens: 4}", "unknown setting(s) cpu.max_tokens"),
]


@pytest.mark.parametrize("yaml_text, problem", BAD_VOICE_CONFIGS)
def test_voice_config_types_and_ranges_are_checked_on_reading(capsys, tmp_path, texts, no_model,
                                                              yaml_text, problem):
    config = tmp_path / "voice.yaml"
    config.write_text(yaml_text + "\n")
    err = _usage_error(capsys, "--input", texts[0], "--voice-config", str(config))
    assert f"{config}: {problem}" in err and len(err.strip().splitlines()) == 1, err


def test_missing_system_prompt_is_found_before_the_model_loads(capsys, tmp_path, texts, no_model):
    err = _usage_error(capsys, "--input", texts[0], "--system-prompt", str(tmp_path / "no.yaml"))
    assert "no.yaml: system prompt YAML not found" in err


def _hard_link_or_skip(src, dst):
    try:
        os.link(src, dst)
    except OSError as exc:
        pytest.skip(f"no hard links here ({exc})")


def test_outputs_may_not_overwrite_inputs(capsys, tmp_path, texts, no_model):
    from edge_runtime.voice.tts import write_wav

    before = open(texts[0]).read()
    err = _usage_error(capsys, "--input", texts[0], "--events", texts[0])
    assert f"--events {texts[0]} is input 0 ({texts[0]}): the events would overwrite it" in err
    assert open(texts[0]).read() == before  # nothing was opened for writing
    wav = tmp_path / "rec.wav"
    write_wav(wav, np.zeros(1600, np.float32))
    _hard_link_or_skip(wav, tmp_path / "same.jsonl")
    err = _usage_error(capsys, "--input", texts[1], "--input", f"wav:{wav}",
                       "--events", str(tmp_path / "same.jsonl"))
    assert f"is input 1 ({wav})" in err
    folder = tmp_path / "recs"
    folder.mkdir()
    err = _usage_error(capsys, "--input", str(folder), "--events", str(folder / "ev.wav"))
    assert f"is inside input 0 ({folder}): it would be read as one of its WAVs" in err
    err = _usage_error(capsys, "--input", str(folder), "--tts", "--tts-dir", str(folder))
    assert f"--tts-dir {folder} is input 0 ({folder})" in err
    prompt = tmp_path / "home.yaml"
    prompt.write_text("intro: You control a home.\n")
    err = _usage_error(capsys, "--input", texts[0], "--system-prompt", str(prompt),
                       "--events", str(prompt))
    assert f"--events {prompt} is the --system-prompt file ({prompt})" in err
    answer_named = tmp_path / "stream0_utt0.wav"
    write_wav(answer_named, np.zeros(1600, np.float32))
    err = _usage_error(capsys, "--input", str(answer_named), "--tts", "--tts-dir", str(tmp_path))
    assert "a spoken answer would overwrite it" in err


def test_stdin_and_its_other_names_are_one_pipe(capsys, tmp_path, monkeypatch, no_model):
    read, write = os.pipe()
    saved = os.dup(0)
    os.dup2(read, 0)  # stdin is a pipe, as in `arecord ... | edge-runtime voice --input -`
    try:
        for other in ("/dev/stdin", "/dev/fd/0", "pcm:/proc/self/fd/0"):
            err = _usage_error(capsys, "--input", "-", "--input", other)
            assert "stdin (-) would feed streams 0, 1" in err, (other, err)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read, write):
            os.close(fd)
    fifo = tmp_path / "mic"
    os.mkfifo(fifo)
    _hard_link_or_skip(fifo, tmp_path / "mic2")
    err = _usage_error(capsys, "--input", f"pcm:{fifo}", "--input", f"pcm:{tmp_path / 'mic2'}")
    assert f"pipe {fifo} would feed streams 0, 1 (given as {fifo}, {tmp_path / 'mic2'})" in err


def test_events_write_failure_is_one_line_and_the_streams_go_on(capsys, texts, fake_model):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    code = main(["voice", "--quiet", "--input", texts[0], "--input", texts[1],
                 "--events", "/dev/full"])
    out, err = capsys.readouterr()
    assert code == 1  # everything answered, but the events asked for were not written
    assert err.count("--events /dev/full: write failed (No space left on device); events are "
                     "off from here") == 1, err
    assert "Traceback" not in err and "events written" not in err
    assert '"answered": 2' in out


def test_closed_stdout_goes_quiet_and_the_run_finishes(monkeypatch, tmp_path, texts, fake_model):
    class ClosedPipe:  # `edge-runtime voice ... | head -c 3` after head exited
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            raise OSError("no file descriptor")  # so the command falls back to devnull

    monkeypatch.setattr("sys.stdout", ClosedPipe())
    events = tmp_path / "ev.jsonl"
    (tmp_path / "two.txt").write_text("turn on the radio\nlock the door\n")
    code = main(["voice", "--input", str(tmp_path / "two.txt"), "--events", str(events)])
    assert code == 0  # one stream, not --quiet: answers stream to stdout as they are generated
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
    assert kinds == ["utterance", "utterance"]


def test_ctrl_c_prints_the_turns_answered_so_far(capsys, tmp_path, fake_model):
    async def interrupt_third(n):  # 1: system prompt, 2: first command, 3: Ctrl-C
        if n == 3:
            signal.raise_signal(signal.SIGINT)
            await asyncio.sleep(60)  # cancelled by the interrupt; if it is lost, the asserts fail

    # Ctrl-C as a terminal delivers it: a process started in the background by a shell without
    # job control inherits SIGINT ignored, and the interrupt would never arrive
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    fake_model.before = interrupt_third
    (tmp_path / "two.txt").write_text("turn on the radio\nlock the door\n")
    try:
        code = main(["voice", "--quiet", "--input", str(tmp_path / "two.txt")])
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    assert code == 130
    assert "turn on the radio" in out and '"answered": 1' in out
    assert "interrupted" in err and "Traceback" not in err


def test_weights_option_reaches_the_model_load(capsys, monkeypatch, texts):
    """`voice --weights` as generate/serve: passed to the load; a wrong value is a usage error."""
    from edge_runtime.voice import session
    from voice_helpers import smollm2_tokenizer

    engine = ScriptedEngine(smollm2_tokenizer())
    seen = {}

    def load_runtime(*args, **kwargs):
        seen.update(kwargs)
        return session.Runtime(engine.tokenizer, (2,), engine, None)

    monkeypatch.setattr(session, "load_runtime", load_runtime)
    assert main(["voice", "--quiet", "--input", texts[0], "--weights", "fp32"]) == 0
    assert seen["weights"] == "fp32"
    assert main(["voice", "--quiet", "--input", texts[0]]) == 0
    assert seen["weights"] == "auto"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["voice", "--quiet", "--input", texts[0], "--weights", "int3"])
    assert "invalid choice: 'int3'" in capsys.readouterr().err


# --------------------------------------------------------------------------- --wyoming


@pytest.mark.parametrize("argv, words", [
    (["--wyoming", "127.0.0.1:10300", "--demo"], "--wyoming serves its connections' audio; "
                                                  "drop --demo"),
    (["--wyoming", ":10300", "--tts", "--streams", "2"], "drop --tts, --streams"),
    (["--wyoming", "host:70000"], "--wyoming 'host:70000': the port must be a number"),
    (["--wyoming", "::1:10300"], "an IPv6 address goes in brackets"),
])
def test_wyoming_usage_errors_come_before_the_model(capsys, no_model, argv, words):
    assert words in _usage_error(capsys, *argv)


def test_wyoming_serves_until_sigterm(capsys, fake_model):
    import socket
    import threading

    from wyoming.client import AsyncTcpClient
    from wyoming.info import Describe

    with socket.socket() as probe:  # a free port on loopback
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    replies = []

    async def describe():
        for _ in range(200):
            try:
                async with AsyncTcpClient("127.0.0.1", port) as client:
                    await client.write_event(Describe().event())
                    return await client.read_event()
            except OSError:  # not listening yet
                await asyncio.sleep(0.05)

    def satellite():
        try:
            replies.append(asyncio.run(describe()))
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=satellite)
    thread.start()
    assert main(["voice", "--wyoming", f":{port}"]) == 0
    thread.join(30)
    err = capsys.readouterr().err
    assert replies and replies[0].type == "info"
    assert f"listening on tcp://127.0.0.1:{port}" in err and "no authentication" not in err
    assert "stopped: open 0, accepted 1," in err
