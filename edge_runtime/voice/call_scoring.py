"""Scoring the calls the model made of spoken commands against the calls they should be
(voice/command_set.py): does the text parse as one call, do its arguments validate against the
action's schema, is it the right function, are they the right arguments.

Right arguments means equal as JSON values (so 21 == 21.0 but "21" != 21), and implies the right
function; an expected `arguments` of None (ask_back's question) accepts any valid arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema

from edge_runtime.service.tool_format import parse_calls


@dataclass(frozen=True)
class CallScore:
    parsed: bool  # exactly one call with a JSON object of arguments
    valid: bool  # ... naming a declared action, its arguments valid for that action's schema
    right_function: bool
    right_arguments: bool
    got: str  # the call as name(arguments), or what was generated when nothing parsed


def score_call(call_text: str, expected_name: str, expected_arguments: dict | None,
               schemas: dict[str, dict]) -> CallScore:
    """`schemas`: each declared action's name -> its parameters' JSON schema."""
    calls = parse_calls(call_text)[1]
    if len(calls) != 1:
        return CallScore(False, False, False, False, call_text.strip()[:120])
    call = calls[0]
    try:
        arguments = json.loads(call.arguments)
    except json.JSONDecodeError:
        return CallScore(False, False, False, False, call_text.strip()[:120])
    got = f"{call.name}({json.dumps(arguments)})"
    parsed = isinstance(arguments, dict)
    valid = parsed and call.name in schemas and _validates(arguments, schemas[call.name])
    right_function = valid and call.name == expected_name
    right_arguments = right_function and (expected_arguments is None
                                          or arguments == expected_arguments)
    return CallScore(parsed, valid, right_function, right_arguments, got)


def _validates(arguments: dict, schema: dict) -> bool:
    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError:
        return False
    return True


@dataclass(frozen=True)
class Accuracy:
    total: int
    parsed: int
    valid: int
    right_function: int
    right_arguments: int

    def shares(self) -> dict:
        n = max(self.total, 1)
        return {"commands": self.total, "parsed": self.parsed / n, "valid": self.valid / n,
                "right_function": self.right_function / n,
                "right_arguments": self.right_arguments / n}


def accuracy(scores: list[CallScore]) -> Accuracy:
    return Accuracy(len(scores), sum(s.parsed for s in scores), sum(s.valid for s in scores),
                    sum(s.right_function for s in scores), sum(s.right_arguments for s in scores))
