"""voice/actions.py: actions from YAML, dispatch to the three handlers (failures spoken and logged,
never raised), and the loop decoding typed commands as calls with the real SmolLM2 engine."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import json
import sys
import threading
from pathlib import Path

import jsonschema
import pytest

from edge_runtime.import_path import code_argv
from edge_runtime.errors import ConfigError
from edge_runtime.service.tool_format import ToolCall
from edge_runtime.voice.actions import Dispatcher, load_actions
from edge_runtime.voice.config import CONFIG_DIR

HOME_ACTIONS = CONFIG_DIR / "home-actions.yaml"
LIGHT = {"name": "set_light", "parameters": {"type": "object", "properties": {
    "device": {"enum": ["kitchen lights"]}, "on": {"type": "boolean"}}},
    "say": "The {device} are {on}."}


def _dispatch(entry: dict, arguments: dict):
    dispatcher = Dispatcher(load_actions([entry], "test.yaml"))
    return asyncio.run(dispatcher.dispatch(ToolCall(entry["name"], json.dumps(arguments))))


@pytest.mark.parametrize("entries, words", [
    ([{"name": "has space"}], "actions[0]: 'name'"),
    ([{"name": "a", "handler": "email"}], "actions[0] (a): 'handler'"),
    ([{"name": "a", "handler": {"http": "http://example.com/x"}}], "on this machine"),
    ([{"name": "a", "handler": {"command": []}}], "handler.command"),
    ([{"name": "a", "timeout_s": 0}], "timeout_s"),
    ([{"name": "a", "parameters": [1]}], "'parameters'"),
    ([{"name": "a"}, {"name": "a"}], "two actions are named 'a'"),
    ([], "non-empty list"),
    ([{"name": "a", "parameters": {"properties": {True: {"type": "boolean"}}}}], "quote it"),
])
def test_bad_action_yaml_names_the_action_and_key(entries, words):
    with pytest.raises(ConfigError, match="test.yaml") as e:
        load_actions(entries, "test.yaml")
    assert words in str(e.value)


def test_events_handler_records_and_speaks_the_template():
    out = _dispatch(LIGHT, {"device": "kitchen lights", "on": False})
    assert out.ok and out.spoken == "The kitchen lights are off."
    assert out.to_event()["arguments"] == {"device": "kitchen lights", "on": False}


def test_command_handler_gets_json_on_stdin_and_failures_are_spoken(tmp_path):
    script = tmp_path / "act.py"
    script.write_text("import json, sys\nargs = json.load(sys.stdin)\n"
                      "if args['on']: sys.exit('relay stuck')\nprint('switched', args['device'])\n")
    entry = dict(LIGHT, say="{result}", handler={"command": [sys.executable, str(script)]})
    ok = _dispatch(entry, {"device": "kitchen lights", "on": False})
    assert ok.ok and ok.result == "switched kitchen lights" and ok.spoken == ok.result
    bad = _dispatch(entry, {"device": "kitchen lights", "on": True})
    assert not bad.ok and "status 1: relay stuck" in bad.error and bad.spoken.startswith("Sorry")
    slow = dict(entry, timeout_s=0.5, handler={"command": code_argv("import time; time.sleep(30)")})
    late = _dispatch(slow, {"device": "kitchen lights", "on": False})
    assert not late.ok and "within 0.5 s" in late.error


def test_http_handler_posts_the_arguments_to_a_local_url():
    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200 if self.path == "/ok" else 500)
            self.end_headers()
            self.wfile.write(b"light is off\n")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        ok = _dispatch(dict(LIGHT, say="{result}", handler={"http": base + "/ok"}),
                       {"device": "kitchen lights", "on": False})
        bad = _dispatch(dict(LIGHT, handler={"http": base + "/broken"}),
                        {"device": "kitchen lights", "on": True})
    finally:
        server.shutdown()
    assert ok.ok and ok.spoken == "light is off"
    assert got == [{"device": "kitchen lights", "on": False}, {"device": "kitchen lights",
                                                                 "on": True}]
    assert not bad.ok and "HTTP 500" in bad.error


@pytest.mark.slow
def test_the_demo_homes_typed_commands_become_right_calls_with_the_real_model(tmp_path):
    """The command set's commands to the demo's home, typed, through the loop (narrowed grammar,
    examples in the system prompt): every call parses and validates, and the accuracy targets
    (90% right function, 80% right arguments) hold. tools/voice_command_bench.py measures the
    spoken set."""
    from edge_runtime.model.loader import DEFAULT_MODEL
    from edge_runtime.voice.audio_input import InputSpec, Source
    from edge_runtime.voice.call_scoring import accuracy, score_call
    from edge_runtime.voice.command_set import COMMANDS
    from edge_runtime.voice.config import load_voice_config
    from edge_runtime.voice.prompting import load_system_prompt
    from edge_runtime.voice.session import load_runtime, run_streams

    commands = [c for c in COMMANDS if c.home == "home"]
    text = tmp_path / "typed.txt"
    text.write_text("\n".join(c.text for c in commands) + "\n")
    config = dataclasses.replace(load_voice_config(), system_prompt=HOME_ACTIONS,
                                 engine_threads=1)
    runtime = load_runtime(config, DEFAULT_MODEL, 1, need_asr=False, progress=lambda m: None)
    events = tmp_path / "events.jsonl"
    try:
        reports = run_streams(runtime, config, [Source(InputSpec("text", text))],
                              events_path=events)
    finally:
        runtime.close()
    schemas = {a.function.name: a.function.parameters
               for a in load_system_prompt(HOME_ACTIONS).actions}
    written = [json.loads(line) for line in Path(events).read_text().splitlines()]
    turns = [ev for ev in written if ev.get("kind") == "utterance"]
    assert len(turns) == len(commands) and reports[0].faults == []
    for ev in turns:  # 100% parse and validate: the grammar allows nothing else
        assert ev["action"]["ok"], ev
        jsonschema.validate(ev["action"]["arguments"], schemas[ev["action"]["name"]])
    scores = [score_call(ev["call_text"], c.name, c.arguments, schemas)
              for ev, c in zip(turns, commands)]
    total = accuracy(scores)
    assert total.valid == len(commands)
    assert total.right_function >= 0.9 * len(commands), scores
    assert total.right_arguments >= 0.8 * len(commands), scores
