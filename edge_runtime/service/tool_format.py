"""How tools and tool calls look in the model's text (the Hermes / Qwen 2.5 convention, which the
service and the voice loop share), and the grammar that makes the model write them.

SmolLM2's chat template knows no tools, so they are rendered here: the function signatures go at
the end of the system message; a call is

    <tool_call>
    {"name": "set_light", "arguments": {"device": "kitchen light", "on": false}}
    </tool_call>

and a tool's result comes back as a user turn holding `<tool_response>...</tool_response>`.
`call_grammar` builds an xgrammar structural tag for this format (engine/grammar.py compiles it):
the call's name is one of the tools' and its arguments follow that tool's JSON schema.

Invariants:
- Function names match NAME_PATTERN (so they can be put into the format's text unescaped).
- `parse_calls(text)` and `CallStreamParser` split the same text into the same content and calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from edge_runtime.engine.api import GrammarSpec

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL_BLOCK = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.S)
_TOOLS_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
_TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


@dataclass(frozen=True)
class ToolFunction:
    name: str
    description: str = ""
    parameters_json: str = '{"type": "object", "properties": {}}'  # a JSON schema, as text

    @property
    def parameters(self) -> dict:
        return json.loads(self.parameters_json)

    def signature(self) -> dict:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object


def tools_system_text(functions: list[ToolFunction]) -> str:
    """The block appended to the system message (one line of JSON per function)."""
    lines = "\n".join(json.dumps(f.signature()) for f in functions)
    return _TOOLS_INTRO + lines + _TOOLS_OUTRO


def render_call(call: ToolCall) -> str:
    """A call as the assistant writes it (for assistant turns in the history)."""
    return f'{CALL_OPEN}\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n{CALL_CLOSE}'


def tool_response_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"


def _call_tag(f: ToolFunction) -> dict:
    return {"type": "tag", "begin": f'{CALL_OPEN}\n{{"name": "{f.name}", "arguments": ',
            "content": {"type": "json_schema", "json_schema": f.parameters,
                        "max_whitespace_cnt": 1},
            "end": f"}}\n{CALL_CLOSE}"}


def call_grammar(functions: list[ToolFunction], choice: str, parallel: bool,
                 what: str = "'tools'") -> GrammarSpec:
    """choice: "auto" (text, calls, or both), "required" (at least one call), "none" (text with
    no call), or a function's name (exactly one call of it)."""
    if choice == "none":
        fmt: dict = {"type": "any_text", "excludes": [CALL_OPEN]}
    elif choice in ("auto", "required"):
        fmt = {"type": "triggered_tags", "triggers": [CALL_OPEN],
               "tags": [_call_tag(f) for f in functions], "at_least_one": choice == "required",
               "stop_after_first": not parallel}
    else:
        fmt = _call_tag(next(f for f in functions if f.name == choice))
    # as engine/grammar.py's schema_text (compact, key order kept: it is the answer's order)
    text = json.dumps({"type": "structural_tag", "format": fmt}, separators=(",", ":"))
    return GrammarSpec("structural_tag", text, what=what)


def parse_calls(text: str) -> tuple[str, list[ToolCall]]:
    """(the text outside the call blocks, stripped; the calls in order). A block that is not a
    {"name", "arguments"} object (a cut-off call) stays in the text."""
    calls, content, pos = [], [], 0
    for m in _CALL_BLOCK.finditer(text):
        call = _parse_block(m.group(1))
        if call is None:
            continue
        content.append(text[pos:m.start()])
        calls.append(call)
        pos = m.end()
    content.append(text[pos:])
    return "".join(content).strip(), calls


def _parse_block(inner: str) -> ToolCall | None:
    try:
        obj = json.loads(inner)
    except ValueError:
        return None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
            and isinstance(obj.get("arguments", {}), dict)):
        return None
    return ToolCall(obj["name"], json.dumps(obj.get("arguments", {})))


class CallStreamParser:
    """Splits streamed text into content deltas and whole calls: text that may be the start of a
    call block is held back until it is known to be one (then it becomes a call) or not."""

    def __init__(self):
        self._buf = ""

    def feed(self, delta: str) -> list[tuple[str, object]]:
        """[("content", str) | ("call", ToolCall)] that are final after `delta`."""
        self._buf += delta
        out: list[tuple[str, object]] = []
        while self._buf:
            start = self._buf.find(CALL_OPEN)
            if start == -1:
                keep = _partial_suffix(self._buf, CALL_OPEN)
                self._emit_text(out, self._buf[:len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep:]
                break
            end = self._buf.find(CALL_CLOSE, start)
            if end == -1:
                self._emit_text(out, self._buf[:start])
                self._buf = self._buf[start:]
                break
            block_end = end + len(CALL_CLOSE)
            self._emit_text(out, self._buf[:start])
            content, calls = parse_calls(self._buf[start:block_end])
            out += [("call", c) for c in calls] or [("content", content)]
            self._buf = self._buf[block_end:]
        return out

    def finish(self) -> list[tuple[str, object]]:
        """What is still held back (an unfinished call block) as content."""
        rest, self._buf = self._buf, ""
        return [("content", rest)] if rest else []

    @staticmethod
    def _emit_text(out: list, text: str) -> None:
        if text:
            out.append(("content", text))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
