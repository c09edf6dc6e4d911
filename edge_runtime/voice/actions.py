"""Actions a home offers (the system prompt YAML's `actions:`), and their dispatch.

Each action is a function with JSON-schema parameters (device names as enums, numbers with
ranges); the voice loop renders them as tools into the shared system prompt and decodes every
command as exactly one call of one of them (service/tool_format.py's grammar), then `dispatch` runs
the action's handler:

- `events` (default): nothing runs; the call and its arguments are recorded in the events file;
- `command: [argv...]`: the program runs with the arguments as JSON on stdin; its stdout (first
  line) is the result, a non-zero exit or a timeout is a failure;
- `http: URL`: the arguments are POSTed as JSON to a URL on this machine (localhost only, e.g.
  Home Assistant's REST API); the response body is the result, an HTTP error a failure.

Invariants:
- Every YAML mistake is a ConfigError naming the action and the key, raised before models load.
- `dispatch` never raises: a failing or slow handler gives an `Outcome` with `ok=False` and a
  sentence saying why, which is spoken and logged; the stream goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import urlparse

from edge_runtime.errors import ConfigError
from edge_runtime.service.tool_format import NAME_PATTERN, ToolCall, ToolFunction

log = logging.getLogger(__name__)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Action:
    function: ToolFunction
    handler: str = "events"  # "events" | "command" | "http"
    target: tuple[str, ...] = ()  # command: argv; http: (url,)
    timeout_s: float = DEFAULT_TIMEOUT_S
    say: str = ""  # spoken on success; {argument} fields and {result} are filled in


@dataclass
class Outcome:
    name: str
    arguments: dict
    handler: str
    ok: bool
    result: str = ""
    error: str | None = None
    duration_s: float = 0.0
    spoken: str = field(default="")

    def to_event(self) -> dict:
        out = {"name": self.name, "arguments": self.arguments, "handler": self.handler,
               "ok": self.ok, "result": self.result, "duration_s": round(self.duration_s, 4)}
        if self.error is not None:
            out["error"] = self.error
        return out


def load_actions(entries, source: str) -> list[Action]:
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: 'actions:' must be a non-empty list of actions")
    actions = [_action(entry, f"{source}: actions[{i}]") for i, entry in enumerate(entries)]
    names = [a.function.name for a in actions]
    dup = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if dup:
        raise ConfigError(f"{source}: two actions are named {dup!r}; names must be unique")
    return actions


def _action(entry, where: str) -> Action:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a mapping with name, parameters, handler")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: 'name' must be 1 to 64 letters, digits, '_' or '-'")
    where = f"{where} ({name})"
    params = entry.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: 'parameters' must be a JSON schema (a mapping)")
    odd = _non_string_key(params)
    if odd is not None:  # YAML 1.1 reads a bare on/off/yes/no key as a boolean
        raise ConfigError(f"{where}: 'parameters' has the key {odd!r}, which is not a string; "
                          f"quote it (\"on\": ...)")
    timeout = entry.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 600:
        raise ConfigError(f"{where}: 'timeout_s' must be a number of seconds in (0, 600]")
    handler, target = _handler(entry.get("handler", "events"), where)
    fn = ToolFunction(name, str(entry.get("description", "")), json.dumps(params))
    return Action(fn, handler, target, float(timeout), str(entry.get("say", "")))


def actions_prompt_text(actions: list[Action]) -> str:
    """The actions as system-prompt lines, one per action with its arguments' choices, and the
    call format. Plainer than the service's JSON signatures (service/tool_format.py), which the
    135M model follows worse: tools/voice_action_probe.py, docs/voice.md "Actions"."""
    lines = ["Functions:"]
    for action in actions:
        props = action.function.parameters.get("properties", {})
        args = "; ".join(f"{name}: {_choices(spec)}" for name, spec in props.items())
        lines.append(f"- {action.function.name}({args}): {action.function.description}")
    lines.append("Answer with one call:\n<tool_call>\n"
                 '{"name": <function>, "arguments": {...}}\n</tool_call>')
    return "\n".join(lines)


def _choices(spec) -> str:
    if not isinstance(spec, dict):
        return "any"
    if "enum" in spec:
        return " | ".join(str(v) for v in spec["enum"])
    if spec.get("type") in ("integer", "number") and ("minimum" in spec or "maximum" in spec):
        return f"{spec['type']} {spec.get('minimum', '')}-{spec.get('maximum', '')}"
    return str(spec.get("type", "any"))


def _non_string_key(value):
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return key
            found = _non_string_key(item)
            if found is not None:
                return found
    if isinstance(value, list):
        for item in value:
            found = _non_string_key(item)
            if found is not None:
                return found
    return None


def _handler(spec, where: str) -> tuple[str, tuple[str, ...]]:
    if spec == "events":
        return "events", ()
    if isinstance(spec, dict) and set(spec) == {"command"}:
        argv = spec["command"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ConfigError(f"{where}: 'handler.command' must be a non-empty list of strings")
        return "command", tuple(argv)
    if isinstance(spec, dict) and set(spec) == {"http"}:
        url = spec["http"]
        parsed = urlparse(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") \
                or parsed.hostname not in LOCAL_HOSTS:
            raise ConfigError(f"{where}: 'handler.http' must be an http(s) URL on this machine "
                              f"({', '.join(LOCAL_HOSTS)}), got {url!r}")
        return "http", (url,)
    raise ConfigError(f"{where}: 'handler' must be events, {{command: [argv...]}} or "
                      f"{{http: URL}}, got {spec!r}")


class Dispatcher:
    def __init__(self, actions: list[Action]):
        self.actions = {a.function.name: a for a in actions}

    @property
    def functions(self) -> list[ToolFunction]:
        return [a.function for a in self.actions.values()]

    async def dispatch(self, call: ToolCall) -> Outcome:
        action = self.actions.get(call.name)
        args = json.loads(call.arguments)
        if action is None:  # the grammar allows only declared names: a bug if it happens
            return _spoken(Outcome(call.name, args, "none", False,
                                   error=f"there is no action named {call.name}"), None)
        t0 = time.perf_counter()
        try:
            result = await asyncio.wait_for(self._run(action, args), action.timeout_s)
            outcome = Outcome(call.name, args, action.handler, True, result)
        except asyncio.TimeoutError:
            outcome = Outcome(call.name, args, action.handler, False,
                              error=f"no answer within {action.timeout_s:g} s")
        except (OSError, HandlerError, ValueError) as exc:
            outcome = Outcome(call.name, args, action.handler, False, error=str(exc))
        outcome.duration_s = time.perf_counter() - t0
        if not outcome.ok:
            log.warning("action %s (%s) failed: %s", call.name, action.handler, outcome.error)
        return _spoken(outcome, action)

    async def _run(self, action: Action, args: dict) -> str:
        if action.handler == "command":
            return await _run_command(action.target, args)
        if action.handler == "http":
            return await asyncio.to_thread(_post_json, action.target[0], args, action.timeout_s)
        return "done"


class HandlerError(Exception):
    """A handler ran and said it failed (exit status, HTTP status)."""


async def _run_command(argv: tuple[str, ...], args: dict) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate(json.dumps(args).encode())
    except asyncio.CancelledError:  # the timeout: do not leave the program running
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise HandlerError(f"{argv[0]} exited with status {proc.returncode}: {tail[0]}")
    return _first_line(out.decode(errors="replace")) or "done"


def _post_json(url: str, args: dict, timeout_s: float) -> str:
    req = urllib.request.Request(url, data=json.dumps(args).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return _first_line(resp.read(4096).decode(errors="replace")) or "done"
    except urllib.error.HTTPError as exc:
        raise HandlerError(f"{url} answered HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        raise HandlerError(f"{url} is not reachable ({exc.reason})") from None


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def _spoken(outcome: Outcome, action: Action | None) -> Outcome:
    words = outcome.name.replace("_", " ")
    if not outcome.ok:
        outcome.spoken = f"Sorry, {words} failed: {outcome.error}."
        return outcome
    fields = {k: (v if not isinstance(v, bool) else ("on" if v else "off"))
              for k, v in outcome.arguments.items()}
    try:
        outcome.spoken = action.say.format(result=outcome.result, **fields) if action.say \
            else f"Done: {words}, {outcome.result}."
    except (KeyError, IndexError, ValueError):  # a template naming an argument not given
        outcome.spoken = f"Done: {words}, {outcome.result}."
    return outcome
