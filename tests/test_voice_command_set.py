"""voice/command_set.py, voice/call_scoring.py and voice/action_examples.py: the spoken command
set is what the evaluation claims (size, actions, devices outside the demo, expected calls valid),
its examples stay apart from it, and the scoring tells each kind of miss apart."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from edge_runtime.errors import ConfigError
from edge_runtime.voice.action_examples import load_examples
from edge_runtime.voice.actions import load_actions
from edge_runtime.voice.call_scoring import accuracy, score_call
from edge_runtime.voice.command_set import COMMANDS, HOMES, build_command_wavs
from edge_runtime.voice.demo import DEMO_COMMANDS
from edge_runtime.voice.prompting import load_system_prompt
from edge_runtime.voice.report import word_errors
from edge_runtime.voice.wav_file import SAMPLE_RATE, read_wav
from voice_helpers import needs_espeak

SCHEMAS = {h: {a.function.name: a.function.parameters for a in load_system_prompt(p).actions}
           for h, p in HOMES.items()}


def _devices(home: str) -> set[str]:
    return {d["name"] for d in yaml.safe_load(HOMES[home].read_text())["devices"]}


def test_the_set_has_40_commands_over_8_actions_half_outside_the_demo():
    assert len(COMMANDS) >= 40 and len({c.text for c in COMMANDS}) == len(COMMANDS)
    assert len({c.name for c in COMMANDS}) >= 8
    flat = [c for c in COMMANDS if c.home == "flat"]
    assert len(flat) * 2 >= len(COMMANDS)
    assert not _devices("flat") & _devices("home")  # the second home shares no device
    demo_words = {w for cmds in DEMO_COMMANDS for c in cmds for w in c.split()}
    for c in flat:  # each names something the demo never says
        assert set(c.text.split()) - demo_words, c.text


def test_the_demo_commands_are_in_the_set_for_the_demo_home():
    home = {c.text for c in COMMANDS if c.home == "home"}
    assert {c for cmds in DEMO_COMMANDS for c in cmds} <= home


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.text)
def test_every_expected_call_is_valid_for_its_home(command):
    arguments = {"question": "?"} if command.arguments is None else command.arguments
    text = f'<tool_call>\n{json.dumps({"name": command.name, "arguments": arguments})}\n</tool_call>'
    score = score_call(text, command.name, command.arguments, SCHEMAS[command.home])
    assert score.valid and score.right_arguments, (command, score)


def test_no_command_is_one_of_its_homes_examples():
    for home, path in HOMES.items():
        data = yaml.safe_load(path.read_text())
        said = {e["say"].lower() for e in data["examples"]}
        assert not said & {c.text for c in COMMANDS if c.home == home}


def test_scoring_tells_the_misses_apart():
    schemas = SCHEMAS["home"]
    light = {"device": "kitchen lights"}

    def call(name, args):
        return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'

    both = score_call(call("turn_on", light), "turn_on", light, schemas)
    wrong_args = score_call(call("turn_on", {"device": "bedroom lights"}), "turn_on", light, schemas)
    wrong_fn = score_call(call("turn_off", light), "turn_on", light, schemas)
    invalid = score_call(call("turn_on", {"device": "porch"}), "turn_on", {"device": "porch"},
                         schemas)
    unknown = score_call(call("explode", {}), "explode", {}, schemas)
    cut = score_call('<tool_call>\n{"name": "turn_on", "argu', "turn_on", light, schemas)
    two = score_call(call("turn_on", light) + call("turn_on", light), "turn_on", light, schemas)
    any_question = score_call(call("ask_back", {"question": "Which one?"}), "ask_back", None,
                              schemas)
    assert (both.valid, both.right_function, both.right_arguments) == (True, True, True)
    assert (wrong_args.right_function, wrong_args.right_arguments) == (True, False)
    assert (wrong_fn.valid, wrong_fn.right_function) == (True, False)
    assert invalid.parsed and not invalid.valid and not invalid.right_arguments
    assert unknown.parsed and not unknown.valid
    assert not cut.parsed and not two.parsed
    assert any_question.right_arguments
    total = accuracy([both, wrong_args, wrong_fn, invalid, cut])
    assert (total.total, total.parsed, total.valid, total.right_function,
            total.right_arguments) == (5, 4, 3, 2, 1)


def test_examples_are_checked_against_the_actions():
    actions = load_actions([{"name": "turn_on", "parameters": {
        "type": "object", "properties": {"device": {"enum": ["lamp"]}}, "required": ["device"]}}],
        "t.yaml")
    ok = load_examples([{"say": "lamp on", "call": "turn_on", "arguments": {"device": "lamp"}}],
                       actions, "t.yaml")
    assert ok[0].arguments == {"device": "lamp"}
    for entry, words in [({"say": "x", "call": "fly"}, "'call' must be one of the actions"),
                         ({"say": "x", "call": "turn_on", "arguments": {"device": "sofa"}},
                          "do not fit turn_on"),
                         ({"call": "turn_on"}, "'say'")]:
        with pytest.raises(ConfigError, match=re.escape(words)):
            load_examples([entry], actions, "t.yaml")


def test_the_system_prompt_shows_examples_only_when_asked():
    path = HOMES["flat"]
    with_examples = load_system_prompt(path).text
    without = load_system_prompt(path, examples=False).text
    assert with_examples.startswith(without) and "Examples:" not in without
    assert '- porch light on please -> {"name": "turn_on", "arguments": {"device": ' \
           '"porch light"}}' in with_examples


@needs_espeak
def test_commands_are_synthesized_once_into_the_cache(tmp_path):
    commands = COMMANDS[:2]
    first = build_command_wavs(commands, tmp_path)
    stamps = [p.stat().st_mtime_ns for p in first]
    said = []
    again = build_command_wavs(commands, tmp_path, progress=said.append)
    assert again == first and [p.stat().st_mtime_ns for p in again] == stamps
    assert said == []  # nothing synthesized, nothing said
    first[1].write_bytes(b"RIFF, not a wav")  # a corrupt cache entry is rebuilt, and says so
    build_command_wavs(commands, tmp_path, progress=said.append)
    assert len(said) == 1 and said[0].startswith("synthesizing command 2/2")
    assert len(read_wav(first[1])) > 0
    audio = read_wav(first[0])
    assert 0.8 * SAMPLE_RATE < len(audio) < 4 * SAMPLE_RATE and abs(audio).max() > 0.05


def test_word_errors_of_a_spoken_number():
    assert word_errors("set the heating to twenty two degrees", "Set the heating to 22°.") == (0, 7)
