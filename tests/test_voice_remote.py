"""edge_runtime/voice/remote.py: the voice loop against a real `edge-runtime serve` process on a
Unix socket (token-id prompts, streamed answers, the service's prefix cache across turns)."""

from __future__ import annotations

import dataclasses

import pytest

from edge_runtime.voice.audio_input import InputSpec, Source
from edge_runtime.voice.config import load_voice_config
from service_helpers import start_server, stop_server, wait_ready, write_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("voice-remote")
    sock = str(tmp / "api.sock")
    proc = start_server(sock, write_config(tmp / "budget.yaml"), "smollm2-135m-instruct")
    try:
        wait_ready(proc, sock)
        yield sock, tmp
    finally:
        stop_server(proc)


def test_loop_through_the_service(server):
    from edge_runtime.voice.session import load_runtime, run_streams

    sock, tmp = server
    typed = tmp / "typed.txt"
    typed.write_text("turn on the kitchen lights\nlock the front door\nplay the radio\n")
    config = dataclasses.replace(load_voice_config(), max_tokens=10)
    runtime = load_runtime(config, "smollm2-135m-instruct", 2, need_asr=False,
                           progress=lambda m: None, server=sock)
    sources = [Source(InputSpec("text", typed)), Source(InputSpec("text", tmp / "missing.txt"))]
    reports = run_streams(runtime, config, sources, half_duplex=True)
    good, bad = reports
    assert [ev["transcript"] for ev in good.events] == typed.read_text().split("\n")[:3]
    assert all(ev["answer"] and ev["answer_tokens"] >= 1 for ev in good.events)
    for ev in good.events[1:]:
        assert ev["reused_prompt_tokens"] > 0
        assert ev["cached_prompt_tokens"] >= 0.8 * ev["prompt_tokens"], ev
    assert bad.events == [] and "missing.txt: file not found" in bad.faults[0]["problem"]


def test_unreachable_service_is_a_fault_of_the_turn(tmp_path):
    from edge_runtime.voice.session import load_runtime, run_streams

    typed = tmp_path / "typed.txt"
    typed.write_text("turn on the radio\n")
    config = dataclasses.replace(load_voice_config(), server_retry_s=0.0)  # fail without retrying
    runtime = load_runtime(config, "smollm2-135m-instruct", 1, need_asr=False,
                           progress=lambda m: None, server=str(tmp_path / "no.sock"))
    (report,) = run_streams(runtime, config, [Source(InputSpec("text", typed))])
    (event,) = report.events
    assert "cannot reach the service" in event["skipped"] and "no.sock" in event["skipped"]
    (fault,) = report.faults  # an unanswered command is a fault: the run's exit status says so
    assert not fault["fatal"] and "not answered" in fault["problem"] and "no.sock" in fault["problem"]


def test_actions_through_the_service_are_valid_calls(server):
    import json

    import jsonschema

    from edge_runtime.service.tool_format import parse_calls
    from edge_runtime.voice.config import CONFIG_DIR
    from edge_runtime.voice.prompting import load_system_prompt
    from edge_runtime.voice.session import load_runtime, run_streams

    sock, tmp = server
    typed = tmp / "actions.txt"
    typed.write_text("close the garage door\nturn off the bedroom lights\n")
    home = CONFIG_DIR / "home-actions.yaml"
    config = dataclasses.replace(load_voice_config(), system_prompt=home)
    runtime = load_runtime(config, "smollm2-135m-instruct", 1, need_asr=False,
                           progress=lambda m: None, server=sock)
    (report,) = run_streams(runtime, config, [Source(InputSpec("text", typed))])
    schemas = {a.function.name: a.function.parameters for a in load_system_prompt(home).actions}
    assert report.faults == [] and len(report.events) == 2
    for ev in report.events:  # the grammar went over the socket as response_format
        assert ev["action"]["ok"], ev
        jsonschema.validate(ev["action"]["arguments"], schemas[ev["action"]["name"]])
        (call,) = parse_calls(ev["call_text"])[1]
        assert call.name == ev["action"]["name"]
        assert json.loads(call.arguments) == ev["action"]["arguments"]
