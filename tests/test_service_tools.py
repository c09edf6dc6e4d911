"""Tools, response_format and logprobs through a real `edge-runtime serve` (SmolLM2) on a Unix
socket, read by the real openai client: answers parse and validate, come back in the client's
types (streamed too), bad schemas and tool lists are 400s naming the field."""

from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import openai
import pytest

from service_helpers import start_server, stop_server, wait_ready, write_config

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
LIMITS = {"max_concurrent_sequences": 4, "max_queue": 8, "max_tokens": 256}
LIGHT = {"type": "object",
         "properties": {"device": {"enum": ["kitchen light", "hall light", "porch light"]},
                        "on": {"type": "boolean"}},
         "required": ["device", "on"], "additionalProperties": False}
THERMOSTAT = {"type": "object",
              "properties": {"celsius": {"type": "integer", "minimum": 10, "maximum": 30}},
              "required": ["celsius"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "set_light", "description": "Switch a light",
                                           "parameters": LIGHT}},
         {"type": "function", "function": {"name": "set_thermostat",
                                           "description": "Set the heating temperature",
                                           "parameters": THERMOSTAT}}]
SCHEMAS = {"set_light": LIGHT, "set_thermostat": THERMOSTAT}
ASK = [{"role": "system", "content": "You control a smart home."},
       {"role": "user", "content": "Turn off the kitchen light."}]


@pytest.fixture(scope="module")
def oai(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("svc-tools")
    sock = str(tmp / "api.sock")
    # one OpenMP thread: on a shared 2-core machine a second one stalls every op at its barrier
    proc = start_server(sock, write_config(tmp / "budget.yaml", LIMITS), MODEL,
                        extra_env={"OMP_NUM_THREADS": "1"})
    try:
        wait_ready(proc, sock)
        http = httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=120)
        yield openai.OpenAI(base_url="http://localhost/v1", api_key="unused", http_client=http,
                            max_retries=0)
        http.close()
    finally:
        code, out = stop_server(proc)
        assert code == 0, out


def _chat(oai, **kw):
    kw = dict(dict(messages=ASK, temperature=0, max_tokens=40), **kw)
    return oai.chat.completions.create(model=MODEL, **kw)


def _check_calls(calls):
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_json_schema_answer_parses_and_validates(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "light", "schema": LIGHT,
                                                  "strict": True}}
    res = _chat(oai, response_format=fmt)
    assert res.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(res.choices[0].message.content), LIGHT)
    obj = _chat(oai, response_format={"type": "json_object"}).choices[0]
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.message.content), dict)
    else:
        assert obj.finish_reason == "length" and obj.message.content.startswith("{")


def test_forced_and_required_tool_calls_come_back_as_tool_calls(oai):
    forced = _chat(oai, tools=TOOLS, tool_choice={"type": "function",
                                                  "function": {"name": "set_thermostat"}})
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["set_thermostat"]
    _check_calls(choice.message.tool_calls)
    one = _chat(oai, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert one.choices[0].finish_reason == "tool_calls"
    assert len(one.choices[0].message.tool_calls) == 1
    _check_calls(one.choices[0].message.tool_calls)


def test_auto_choice_gives_a_valid_call_or_text(oai):
    res = _chat(oai, tools=TOOLS, tool_choice="auto")
    msg, finish = res.choices[0].message, res.choices[0].finish_reason
    if msg.tool_calls:
        assert finish == "tool_calls"
        _check_calls(msg.tool_calls)
    else:
        assert finish in ("stop", "length") and msg.content
    none = _chat(oai, tools=TOOLS, tool_choice="none", max_tokens=12)
    assert not none.choices[0].message.tool_calls and "<tool_call>" not in \
        none.choices[0].message.content


def test_streamed_tool_call_matches_the_non_streamed_one(oai):
    kw = dict(tools=TOOLS, tool_choice="required")
    _chat(oai, max_tokens=1, **kw)  # cache the prompt: both runs below start from it
    full = _chat(oai, **kw).choices[0].message
    with oai.chat.completions.stream(model=MODEL, messages=ASK, temperature=0, max_tokens=60,
                                     **kw) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in full.tool_calls]


def test_tool_results_in_the_history_are_accepted(oai):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {
                "name": "set_light", "arguments": '{"device": "kitchen light", "on": false}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'}]
    res = _chat(oai, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert res.choices[0].message.content and res.usage.prompt_tokens > 100


def test_max_tokens_inside_a_constrained_answer_is_length_with_the_text_so_far(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "light", "schema": LIGHT}}
    full = _chat(oai, response_format=fmt).choices[0].message.content
    cut = _chat(oai, response_format=fmt, max_tokens=3).choices[0]
    assert cut.finish_reason == "length" and full.startswith(cut.message.content)
    calls = _chat(oai, tools=TOOLS, tool_choice="required", max_tokens=5).choices[0]
    assert calls.finish_reason == "length" and calls.message.content.startswith("<tool_call>")


def test_logprobs_and_top_logprobs(oai):
    res = _chat(oai, logprobs=True, top_logprobs=3, max_tokens=6)
    content = res.choices[0].logprobs.content
    assert len(content) == res.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely token
    streamed = [e for chunk in _chat(oai, logprobs=True, max_tokens=6, stream=True)
                if chunk.choices and chunk.choices[0].logprobs
                for e in chunk.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


@pytest.mark.parametrize("kw, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nonsense"}}}), "response_format.json_schema.schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}),
     "response_format.json_schema.schema"),
    (dict(tools=[{"type": "function", "function": {"description": "no name"}}]),
     "tools[0].function.name"),
    (dict(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/x"}}}}}]),
     "tools[0].function.parameters"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "open_door"}}),
     "tool_choice"),
    (dict(tools=TOOLS + TOOLS[:1]), "tools[2].function.name"),
    (dict(top_logprobs=2), "top_logprobs"),
])
def test_bad_schemas_and_tool_lists_are_400_naming_the_field(oai, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        _chat(oai, **kw)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body


def test_constrained_and_unconstrained_together_give_what_they_give_alone(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "light", "schema": LIGHT}}
    asks = [dict(response_format=fmt), dict(max_tokens=12),
            dict(tools=TOOLS, tool_choice="required")]
    for kw in asks:  # cache the prompts: every request below starts from a cached prefix
        _chat(oai, **dict(kw, max_tokens=1))
    alone = [_chat(oai, **kw).choices[0].message for kw in asks]
    together: list = [None] * len(asks)

    def run(i):
        together[i] = _chat(oai, **asks[i]).choices[0].message

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [m.content for m in together] == [m.content for m in alone]
    assert [[c.function.arguments for c in m.tool_calls or []] for m in together] == \
        [[c.function.arguments for c in m.tool_calls or []] for m in alone]
