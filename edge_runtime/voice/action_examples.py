"""Worked examples of command -> call (the system prompt YAML's `examples:`), shown to the model
after the functions in the shared system prompt, so they cost prefill once (the prefix cache holds
the system prompt for every stream and turn).

    examples:
      - {say: switch off the bedroom lights, call: turn_off, arguments: {device: bedroom lights}}

Invariants: every example names a declared action and its arguments validate against that
action's schema (else a ConfigError naming the example, before models load); an example is
rendered exactly as the grammar makes the model write the call's JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema

from edge_runtime.errors import ConfigError


@dataclass(frozen=True)
class ActionExample:
    say: str  # the spoken command
    call: str  # the action's name
    arguments: dict


def load_examples(entries, actions, source: str) -> tuple[ActionExample, ...]:
    """`actions`: voice/actions.py Actions the examples must call."""
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: 'examples:' must be a list of {{say, call, arguments}}")
    schemas = {a.function.name: a.function.parameters for a in actions}
    return tuple(_example(entry, schemas, f"{source}: examples[{i}]")
                 for i, entry in enumerate(entries))


def _example(entry, schemas: dict, where: str) -> ActionExample:
    if not isinstance(entry, dict) or not isinstance(entry.get("say"), str) \
            or not entry["say"].strip():
        raise ConfigError(f"{where} must be a mapping with 'say' (the command), 'call', "
                          f"'arguments'")
    name, arguments = entry.get("call"), entry.get("arguments", {})
    if name not in schemas:
        raise ConfigError(f"{where} ({entry['say']!r}): 'call' must be one of the actions "
                          f"({', '.join(schemas)}), got {name!r}")
    try:
        jsonschema.validate(arguments, schemas[name])
    except jsonschema.ValidationError as exc:
        raise ConfigError(f"{where} ({entry['say']!r}): the arguments do not fit {name}'s "
                          f"parameters: {exc.message}") from None
    return ActionExample(entry["say"].strip(), name, arguments)


def examples_prompt_text(examples: tuple[ActionExample, ...]) -> str:
    if not examples:
        return ""
    lines = ["Examples:"]
    for ex in examples:  # the call's JSON as the grammar writes it (", " and ": ")
        lines.append(f"- {ex.say} -> " + json.dumps({"name": ex.call, "arguments": ex.arguments}))
    return "\n".join(lines)
