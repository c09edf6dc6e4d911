"""voice/call_narrowing.py: what a command names outright narrows its grammar; what it does not
name is left to the model; nothing valid is ever lost from the schema's side."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_runtime.voice.call_narrowing import narrow_functions
from edge_runtime.voice.command_set import HOMES
from edge_runtime.voice.prompting import load_system_prompt

FUNCTIONS = {h: [a.function for a in load_system_prompt(p).actions] for h, p in HOMES.items()}


def _narrow(home: str, heard: str) -> dict[str, dict]:
    """name -> {property: enum, or "*" for any value} of what is left."""
    return {f.name: {k: v.get("enum", "*") for k, v in f.parameters.get("properties", {}).items()}
            for f in narrow_functions(FUNCTIONS[home], heard)}


def test_a_named_action_and_device_leave_exactly_that_call():
    assert _narrow("home", "Turn off the kitchen lights.") == {"turn_off": {"device": ["kitchen lights"]}}
    assert _narrow("home", "Is the front door locked?") == {"is_locked": {"device": ["front door"]}}
    assert _narrow("home", "Unlock the front door.") == {"unlock": {"device": ["front door"]}}
    assert _narrow("flat", "turn on the porch lights") == {"turn_on": {"device": ["porch light"]}}


def test_an_action_is_named_by_its_words_after_the_verb_when_no_action_is_named_whole():
    assert _narrow("flat", "switch off the ceiling fan") == {"turn_off": {"device": ["ceiling fan"]}}
    assert set(_narrow("home", "What is the temperature in the hole?")) == \
        {"set_temperature", "get_temperature"}
    assert _narrow("home", "set the temperature to 20") == {"set_temperature": {"degrees": [20]}}


def test_a_device_without_a_named_action_leaves_that_devices_actions():
    assert _narrow("flat", "Make the stereo louder.") == {
        name: {"device": ["stereo"]} for name in ("play", "stop", "turn_up", "turn_down")}


def test_a_misheard_device_maps_onto_the_devices_it_shares_a_word_with():
    left = _narrow("home", "Turn off, location lights.")
    assert left["turn_off"] == {"device": ["kitchen lights", "living room lights", "bedroom lights"]}
    assert "ask_back" in left and "turn_on" not in left  # the model may ask which one
    bliders = _narrow("home", "Close, no bliders.")  # a word like the blinds' word
    assert bliders["close"] == {"device": ["blinds"]} and "ask_back" in bliders
    assert "close" not in _narrow("home", "Close the hole.")  # hole/hall: no device's word
    office = _narrow("flat", "how warm is it in the office")  # office: the office lamp's word
    assert office["turn_on"] == {"device": ["office lamp"]} and "get_temperature" in office


def test_no_device_word_leaves_the_actions_that_need_none():
    no_device = {"set_temperature", "get_temperature", "ask_back"}
    assert set(_narrow("home", "turn on the porch fountain")) == no_device  # asked back, not guessed
    assert set(_narrow("flat", "start the dishwasher")) == no_device
    assert set(_narrow("home", "How warm is it in the hall?")) == no_device
    # one device the action can take: nothing needs to be heard
    assert _narrow("flat", "Play, must air, we go.") == {"play": {"device": ["stereo"]}}
    assert _narrow("home", "Turn the volume up.") == {"turn_up": {"device": ["radio"]}}


@pytest.mark.parametrize("heard, degrees", [("Set the thermostat to 21 degrees.", [21]),
                                            ("set the thermostat to twenty one degrees", [21]),
                                            ("make it 18 or 19", [18, 19]),
                                            ("set it to 45 degrees", "*"),  # out of range: any
                                            ("set the temperature", "*")])
def test_numbers_said_are_the_only_choices(heard, degrees):
    assert _narrow("home", heard)["set_temperature"] == {"degrees": degrees}


def test_an_optional_number_not_said_is_left_out():
    assert _narrow("flat", "dim the hallway lights") == {"dim": {"device": ["hallway lights"]}}
    (dim,) = narrow_functions(FUNCTIONS["flat"], "dim the hallway lights")
    assert dim.parameters["additionalProperties"] is False
    (dim,) = narrow_functions(FUNCTIONS["flat"], "dim the office lamp to 40%")
    assert dim.parameters["properties"]["percent"]["enum"] == [40]
    assert dim.parameters["required"] == ["device", "percent"]  # said: it must be given


def test_a_heard_device_that_the_named_action_cannot_take_drops_the_verb():
    # "open" takes the garage door and the blinds, not the radio: the radio's actions stay
    assert set(_narrow("home", "open the radio")) == {"play", "stop", "turn_up", "turn_down"}


WORDS = sorted({w for fns in FUNCTIONS.values() for f in fns
                for w in f.name.split("_") + json.dumps(f.parameters).replace('"', " ").split()}
               | {"the", "please", "location", "lights", "off", "on", "21", "twenty", "one", "40%"})


@settings(max_examples=200, deadline=None)
@given(home=st.sampled_from(sorted(HOMES)), words=st.lists(st.sampled_from(WORDS), max_size=8))
def test_narrowing_only_ever_removes(home, words):
    declared = {f.name: f.parameters for f in FUNCTIONS[home]}
    left = narrow_functions(FUNCTIONS[home], " ".join(words))
    assert left and len({f.name for f in left}) == len(left)
    for f in left:
        full = declared[f.name]
        assert set(full.get("required", [])) <= set(f.parameters.get("required", []))
        for key, spec in full.get("properties", {}).items():
            got = f.parameters["properties"].get(key)
            if got is None:  # left out: only an optional one
                assert key not in full.get("required", [])
            elif "enum" in full["properties"][key]:
                assert got["enum"] and set(got["enum"]) <= set(spec["enum"])
            elif "enum" in got:  # numbers said, within the range
                assert all(spec["minimum"] <= n <= spec["maximum"] for n in got["enum"])
            else:
                assert got == spec
