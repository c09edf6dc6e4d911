"""service/tool_format.py: the tool-call text format, its grammar, and parsing (whole and streamed);
service/tools_api.py: the OpenAI fields -> grammar, prompt, 400s naming the field."""

from __future__ import annotations

import json
import random

import pytest

from edge_runtime.service.tool_format import (CallStreamParser, ToolCall, ToolFunction, call_grammar,
                                            parse_calls, render_call)
from edge_runtime.service.schema import ApiError, parse_chat
from edge_runtime.service.tools_api import parse_extras

LIGHT = ToolFunction("set_light", "Switch a light", json.dumps(
    {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}))
TOOLS = [{"type": "function", "function": {"name": "set_light", "parameters": LIGHT.parameters}},
         {"type": "function", "function": {"name": "get_time"}}]
ASK = [{"role": "user", "content": "lights off"}]


def _texts():
    a, b = ToolCall("set_light", '{"on": false}'), ToolCall("get_time", "{}")
    return [
        ("Sure. " + render_call(a), "Sure.", [a]),
        (render_call(a) + "\n" + render_call(b), "", [a, b]),
        ("no calls here <tool_ but not one", "no calls here <tool_ but not one", []),
        (render_call(a)[:-3], render_call(a)[:-3], []),  # cut off by max_tokens: stays text
        ("<tool_call>\nnot json\n</tool_call> after", "<tool_call>\nnot json\n</tool_call> after",
         []),
    ]


@pytest.mark.parametrize("text, content, calls", _texts())
def test_parse_calls(text, content, calls):
    assert parse_calls(text) == (content, calls)


@pytest.mark.parametrize("text, content, calls", _texts())
def test_streamed_parse_gives_the_same_calls_and_text_at_any_split(text, content, calls):
    rng = random.Random(len(text))
    for _ in range(20):
        parser, items, pos = CallStreamParser(), [], 0
        while pos < len(text):
            step = rng.randint(1, 7)
            items += parser.feed(text[pos:pos + step])
            pos += step
        items += parser.finish()
        assert [v for k, v in items if k == "call"] == calls
        assert "".join(v for k, v in items if k == "content").strip() == content


def test_call_grammar_shapes():
    auto = json.loads(call_grammar([LIGHT], "auto", parallel=True).text)["format"]
    assert auto["type"] == "triggered_tags" and not auto["at_least_one"]
    assert not auto["stop_after_first"]
    required = json.loads(call_grammar([LIGHT], "required", parallel=False).text)["format"]
    assert required["at_least_one"] and required["stop_after_first"]
    named = json.loads(call_grammar([LIGHT], "set_light", parallel=True).text)["format"]
    assert named["type"] == "tag" and '"name": "set_light"' in named["begin"]
    none = json.loads(call_grammar([LIGHT], "none", parallel=True).text)["format"]
    assert none == {"type": "any_text", "excludes": ["<tool_call>"]}


def test_tools_go_into_the_system_prompt_and_history_renders_as_text():
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
         "function": {"name": "set_light", "arguments": '{"on": false}'}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"}]
    req = parse_chat({"messages": history, "tools": TOOLS}, 1000)
    system, user, assistant, tool = req.messages
    assert system["role"] == "system" and '"name": "set_light"' in system["content"]
    assert assistant == {"role": "assistant", "content": render_call(
        ToolCall("set_light", '{"on": false}'))}
    assert tool == {"role": "user", "content": "<tool_response>\ndone\n</tool_response>"}
    assert req.params.grammar is not None and req.extras.tools.choice == "auto"
    assert [p for p, _ in req.extras.grammar_checks] == [
        "tools[0].function.parameters", "tools[1].function.parameters", "tools"]


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function"}]}, "tools[0]"),
    ({"tools": "set_light"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {}, "strict": "yes"}}}, "response_format.json_schema.strict"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"functions": [{"name": "f"}]}, "functions"),
])
def test_bad_fields_are_400_naming_the_field(extra, param):
    with pytest.raises(ApiError) as e:
        parse_chat(dict({"messages": ASK}, **extra), 1000)
    assert e.value.status == 400 and e.value.param == param


def test_bad_history_entries_name_the_message():
    bad_args = [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}]
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": ASK + bad_args}, 1000)
    assert e.value.param == "messages[1].tool_calls[0].function.arguments"
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": ASK + [{"role": "tool", "content": 3}]}, 1000)
    assert e.value.param == "messages[1].content"


def test_logprobs_and_response_format_map_to_the_engine():
    extras = parse_extras({"logprobs": True, "top_logprobs": 4, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                               "strict": True}}})
    assert extras.logprobs == 4 and extras.grammar.kind == "json_schema" and extras.grammar.strict
    assert parse_extras({"logprobs": True}).logprobs == 0
    assert parse_extras({}).logprobs is None and parse_extras({}).grammar is None


def test_completions_take_a_grammar_as_response_format_and_give_it_back():
    from edge_runtime.engine.api import GrammarSpec
    from edge_runtime.engine.grammar import schema_text
    from edge_runtime.service.tool_format import call_grammar
    from edge_runtime.service.schema import parse_completion
    from edge_runtime.service.tools_api import as_response_format

    for spec in (call_grammar([LIGHT], "required", parallel=False), GrammarSpec("json_object"),
                 GrammarSpec("json_schema", schema_text(LIGHT.parameters), strict=False)):
        req = parse_completion({"prompt": [1, 2], "response_format": as_response_format(spec)},
                               1000)
        assert req.params.grammar == spec
    with pytest.raises(ApiError) as e:
        parse_completion({"prompt": "x", "response_format": {"type": "structural_tag"}}, 1000)
    assert e.value.param == "response_format.structural_tag"
