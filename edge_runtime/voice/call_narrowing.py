"""Narrowing a command's grammar to the actions and values it names, before the model decodes the
call (the way Home Assistant's Assist matches local intents before an LLM): the 135M model
follows the first token it likes ("turn off ..." -> turn_on, a number from a worked example), so
what the command says outright is taken from the words heard and the model decides the rest.

Rules, on the transcript's normalised words (voice/report.py's `normalize`; a trailing plural "s"
ignored, so "porch lights" names "porch light"):
- actions: one whose name's words all occur ("turn_off": turn, off; "is_locked": is, locked) is
  named; when none is, one whose words after its verb all occur ("switch off ...": off;
  "what is the temperature": temperature) is; when some are, only they are candidates, else all;
- devices (string enums): a value whose words occur in order is heard; when some are, a candidate
  stays only if each of its string enums can take a heard value, cut down to those; when none is
  heard but some value shares a word with the command ("location lights": lights; a word like one
  of its words counts: "Close, no bliders": blinds), the mishearing maps onto those values, and the actions that take no device stay beside them (ask_back among
  them, so the model can ask which one); when no device word occurs at all, only the candidates
  that need none stay (no string enum, or one with a single value: "play" in a home with one
  player), else the actions that take no device (a command naming an unknown device is asked
  back about, not guessed);
- numbers (integer properties): the numbers said, as digits or words ("21", "twenty one") and in
  the property's range, become its only choices and the property is required; with none said, an
  optional one is left out;
- at least one action is always left, and each is a declared action whose schema admits a subset
  of the declared one's values: a narrowed call is always valid for the full schema.
"""

from __future__ import annotations

import json
from difflib import SequenceMatcher

from edge_runtime.service.tool_format import ToolFunction
from edge_runtime.voice.report import normalize, number_words

# difflib's ratio above which a heard word stands for a device's word: "bliders" for "blinds"
# (0.73 after the plural), "porch"/"torch" (0.8); unrelated words of the command set stay below
# (turn/curtain 0.55, hole/hall 0.5, location/kitchen 0.27)
SIMILAR_WORD = 0.72


def narrow_functions(functions: list[ToolFunction], heard: str) -> list[ToolFunction]:
    words = _words(heard)
    named = [f for f in functions if _named(f.name.lower().split("_"), words)] \
        or [f for f in functions if _named(f.name.lower().split("_")[1:], words)]
    candidates = named or list(functions)
    no_device = [f for f in functions if not _string_enums(f.parameters)]
    values = {v for f in functions for v in _enum_values(f) if _occurs(v, words)}
    near = {v for f in functions for v in _enum_values(f) if _shares_a_word(v, words)}
    if values:
        left = _restricted(candidates, values) or _restricted(functions, values) \
            or [f for f in candidates if f in no_device] or candidates
    elif near:
        left = _restricted(candidates, near) + no_device
    else:
        left = [f for f in named if _needs_no_device(f)] or no_device or candidates
    numbers = _numbers(words)
    return [_with_numbers(f, numbers) for f in left]


def _named(name_words: list[str], words: list[str]) -> bool:
    return bool(name_words) and all(_singular(w) in words for w in name_words)


def _restricted(functions: list[ToolFunction], values: set[str]) -> list[ToolFunction]:
    """Each function whose string enums can all take one of `values`, with them cut down."""
    out = []
    for f in functions:
        schema = f.parameters
        props = schema.get("properties", {})
        keys = _string_enums(schema)
        cut = {k: [v for v in props[k]["enum"] if v in values] for k in keys}
        if keys and all(cut.values()):
            for k in keys:
                props[k] = dict(props[k], enum=cut[k])
            out.append(ToolFunction(f.name, f.description, json.dumps(schema)))
    return out


def _with_numbers(f: ToolFunction, numbers: list[int]) -> ToolFunction:
    schema = f.parameters
    props = schema.get("properties", {})
    changed = False
    for key in [k for k, spec in props.items() if isinstance(spec, dict)
                and spec.get("type") == "integer"]:
        lo, hi = props[key].get("minimum", -2**31), props[key].get("maximum", 2**31)
        said = [n for n in numbers if lo <= n <= hi]
        if said:  # a number said is meant for it: it must be given
            props[key] = dict(props[key], enum=said)
            schema["required"] = list(dict.fromkeys([*schema.get("required", []), key]))
            changed = True
        elif not numbers and key not in schema.get("required", []):
            del props[key]
            schema["additionalProperties"] = False  # nothing said: nothing to put there
            changed = True
    return ToolFunction(f.name, f.description, json.dumps(schema)) if changed else f


def _numbers(words: list[str]) -> list[int]:
    """Numbers 0-100 said in `words` (normalize writes digits as words), longest phrases first,
    so "twenty one" is 21 and not also 20 and 1."""
    phrases = sorted(((n, number_words(n).split()) for n in range(101)), key=lambda p: -len(p[1]))
    taken, found = [False] * len(words), []
    for n, phrase in phrases:
        k = len(phrase)
        for i in range(len(words) - k + 1):
            if words[i:i + k] == phrase and not any(taken[i:i + k]):
                taken[i:i + k] = [True] * k
                found.append((i, n))
    return list(dict.fromkeys(n for _, n in sorted(found)))


def _needs_no_device(f: ToolFunction) -> bool:
    props = f.parameters.get("properties", {})
    return all(len(props[k]["enum"]) == 1 for k in _string_enums(f.parameters))


def _string_enums(schema: dict) -> list[str]:
    return [k for k, spec in schema.get("properties", {}).items()
            if isinstance(spec, dict) and isinstance(spec.get("enum"), list)
            and all(isinstance(v, str) for v in spec["enum"])]


def _enum_values(f: ToolFunction) -> list[str]:
    props = f.parameters.get("properties", {})
    return [v for k in _string_enums(f.parameters) for v in props[k]["enum"]]


def _words(text: str) -> list[str]:
    return [_singular(w) for w in normalize(text)]


def _shares_a_word(value: str, words: list[str]) -> bool:
    """A word of `value` occurs, or one like it ("bliders": blinds) as Whisper mishears them."""
    return any(w == v or (min(len(w), len(v)) >= 4 and SequenceMatcher(None, w, v).ratio()
                          >= SIMILAR_WORD)
               for v in _words(value) for w in words)


def _occurs(value: str, words: list[str]) -> bool:
    phrase = _words(value)
    n = len(phrase)
    return n > 0 and any(words[i:i + n] == phrase for i in range(len(words) - n + 1))


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word
