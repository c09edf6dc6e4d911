"""OpenAI chat fields for tools and constrained output: `tools`, `tool_choice`,
`parallel_tool_calls`, `response_format`, `logprobs`/`top_logprobs`, assistant `tool_calls` and
`role: "tool"` messages in the history -> what the engine gets (a grammar, a log-prob count, the
messages rendered as text by service/tool_format.py).

Invariants:
- Like schema.py: any body raises only ApiError (400 naming the field) or returns `ChatExtras`.
- Schemas are only checked for shape here; whether the grammar library can compile one is checked
  by the service before admission (`grammar_checks`: the field each spec came from), so a schema it
  cannot use is a 400 naming that field, not an engine error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from edge_runtime.engine.api import MAX_TOP_LOGPROBS, GrammarSpec
from edge_runtime.engine.grammar import schema_text
from edge_runtime.service.tool_format import (NAME_PATTERN, ToolCall, ToolFunction, call_grammar,
                                            render_call, tool_response_text, tools_system_text)
from edge_runtime.service.api_error import ApiError

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class ToolRequest:
    functions: tuple[ToolFunction, ...]
    choice: str  # "none" | "auto" | "required" | a function's name
    parallel: bool


@dataclass(frozen=True)
class ChatExtras:
    tools: ToolRequest | None = None
    grammar: GrammarSpec | None = None
    grammar_checks: tuple[tuple[str, GrammarSpec], ...] = ()  # (field, spec) to compile first
    logprobs: int | None = None

    @property
    def parses_calls(self) -> bool:
        return self.tools is not None and self.tools.choice != "none"


def parse_extras(body: dict) -> ChatExtras:
    if body.get("functions") not in (None, []):
        raise _bad("functions", "is the deprecated form of 'tools'; send 'tools' instead")
    tools = _tools(body)
    fmt_grammar, fmt_checks = _response_format(body.get("response_format"))
    checks = list(fmt_checks)
    grammar = fmt_grammar
    if tools is not None:
        checks += [(f"tools[{i}].function.parameters",
                    GrammarSpec("json_schema", f.parameters_json, strict=False,
                                what=f"'tools[{i}].function.parameters'"))
                   for i, f in enumerate(tools.functions)]
        if tools.choice != "none" and fmt_grammar is not None:
            raise _bad("response_format", "cannot be combined with tools the model may call; "
                       "set tool_choice to \"none\" or drop response_format")
        if fmt_grammar is None:
            grammar = call_grammar(list(tools.functions), tools.choice, tools.parallel)
            checks.append(("tools", grammar))
    return ChatExtras(tools, grammar, tuple(checks), _logprobs(body))


def completion_extras(body: dict) -> ChatExtras:
    """/v1/completions: `response_format` only, which also takes the extension
    {"type": "structural_tag", "structural_tag": {...}} (xgrammar's format; the voice loop's
    --server mode sends its actions' grammar this way)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "structural_tag":
        tag = fmt.get("structural_tag")
        if not isinstance(tag, dict):
            raise _bad("response_format.structural_tag", "must be an xgrammar structural tag "
                       "object")
        spec = GrammarSpec("structural_tag", _schema_json("response_format.structural_tag", tag),
                           what="'response_format.structural_tag'")
        return ChatExtras(grammar=spec, grammar_checks=(("response_format.structural_tag",
                                                         spec),))
    grammar, checks = _response_format(fmt)
    return ChatExtras(grammar=grammar, grammar_checks=checks)


def as_response_format(spec: GrammarSpec) -> dict:
    """The `response_format` that gives `spec` back through completion_extras."""
    if spec.kind == "json_object":
        return {"type": "json_object"}
    if spec.kind == "json_schema":
        return {"type": "json_schema", "json_schema": {
            "name": "schema", "schema": json.loads(spec.text), "strict": spec.strict}}
    return {"type": "structural_tag", "structural_tag": json.loads(spec.text)}


def _tools(body: dict) -> ToolRequest | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools in (None, []):
        if choice not in (None, "none"):
            raise _bad("tool_choice", "needs a non-empty 'tools' list")
        return None
    if not isinstance(tools, list) or len(tools) > 128:
        raise _bad("tools", "must be a list of up to 128 {type: function, function: {...}} objects")
    functions = tuple(_function(i, t) for i, t in enumerate(tools))
    names = [f.name for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _bad(f"tools[{i}].function.name", f"repeats the name {name!r}; names must be unique")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", "must be a boolean")
    return ToolRequest(functions, _choice(choice, names), True if parallel is None else parallel)


def _function(i: int, tool) -> ToolFunction:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" \
            or not isinstance(tool.get("function"), dict):
        raise _bad(param, "must be {\"type\": \"function\", \"function\": {name, parameters}}")
    fn = tool["function"]
    name, desc, params = fn.get("name"), fn.get("description"), fn.get("parameters")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise _bad(f"{param}.function.name", "must be 1 to 64 letters, digits, '_' or '-'")
    if desc is not None and not isinstance(desc, str):
        raise _bad(f"{param}.function.description", "must be a string")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise _bad(f"{param}.function.parameters", "must be a JSON schema object")
    return ToolFunction(name, desc or "", _schema_json(f"{param}.function.parameters", params))


def _choice(choice, names: list[str]) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise _bad("tool_choice", f"must be one of {list(CHOICES)} or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        return choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) \
        and isinstance(choice.get("function"), dict) and choice.get("type") == "function" else None
    if not isinstance(name, str):
        raise _bad("tool_choice", "must be a string or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}")
    if name not in names:
        raise _bad("tool_choice", f"names the function {name!r}, which is not in 'tools'")
    return name


def _response_format(fmt) -> tuple[GrammarSpec | None, tuple]:
    if fmt is None:
        return None, ()
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None, ()
    if kind == "json_object":
        return GrammarSpec("json_object", what="'response_format'"), ()
    if kind != "json_schema":
        raise _bad("response_format", "must be {\"type\": \"text\" | \"json_object\" | "
                   "\"json_schema\"}")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise _bad("response_format.json_schema", "must be an object with a 'name' and a 'schema'")
    schema, strict = spec.get("schema"), spec.get("strict")
    if not isinstance(schema, dict):
        raise _bad("response_format.json_schema.schema", "must be a JSON schema object")
    if strict is not None and not isinstance(strict, bool):
        raise _bad("response_format.json_schema.strict", "must be a boolean")
    field = "response_format.json_schema.schema"
    grammar = GrammarSpec("json_schema", _schema_json(field, schema), strict=bool(strict),
                          what=f"'{field}'")
    return grammar, ((field, grammar),)


def _schema_json(field: str, schema: dict) -> str:
    try:
        return schema_text(schema)
    except (ValueError, TypeError, RecursionError):  # e.g. a NaN, or nesting past the limit
        raise _bad(field, "is not a JSON schema this server can read") from None


def _logprobs(body: dict) -> int | None:
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise _bad("logprobs", "must be a boolean")
    if top is not None:
        if not want:
            raise _bad("top_logprobs", "needs \"logprobs\": true")
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _bad("top_logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")
    return (top or 0) if want else None


# --- messages -------------------------------------------------------------------------------
def tool_message(i: int, m: dict) -> dict | None:
    """A `tool` message, or an assistant message with `tool_calls`, as {role, content} text;
    None for any other message (schema.py's own rules apply)."""
    param = f"messages[{i}]"
    if m.get("role") == "tool":
        content = m.get("content")
        if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                             for p in content):
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"{param}.content", "must be the tool's result as a string")
        return {"role": "user", "content": tool_response_text(content)}
    if m.get("role") != "assistant" or m.get("tool_calls") in (None, []):
        return None
    calls = m["tool_calls"]
    if not isinstance(calls, list):
        raise _bad(f"{param}.tool_calls", "must be a list of tool calls")
    text = m.get("content") or ""
    if not isinstance(text, str):
        raise _bad(f"{param}.content", "must be a string or null")
    rendered = [render_call(_history_call(f"{param}.tool_calls[{j}]", c))
                for j, c in enumerate(calls)]
    return {"role": "assistant", "content": "\n".join(([text] if text else []) + rendered)}


def _history_call(param: str, call) -> ToolCall:
    fn = call.get("function") if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    args = fn.get("arguments", "{}") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or not isinstance(args, str):
        raise _bad(param, "must be {\"type\": \"function\", \"function\": {\"name\", "
                   "\"arguments\": JSON text}}")
    try:
        parsed = json.loads(args)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise _bad(f"{param}.function.arguments", "must be the JSON text of an object")
    return ToolCall(name, json.dumps(parsed))


def with_tools_prompt(messages: tuple[dict, ...], tools: ToolRequest | None) -> tuple[dict, ...]:
    """The tools' signatures at the end of the first system message (or as one)."""
    if tools is None:
        return messages
    block = tools_system_text(list(tools.functions))
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=messages[0]["content"] + "\n\n" + block)
        return (first,) + messages[1:]
    return ({"role": "system", "content": block},) + messages


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}' {message}", "invalid_value", param)
