"""System prompt (from YAML) and per-stream conversation history, rendered with the model's chat
template so that consecutive turns share a token prefix.

Prefix invariant (what makes the prefix cache useful): unless older turns had to be dropped,
turn t's prompt ids start with exactly `prompt_ids(t-1) + answer_ids(t-1)`, where answer_ids are
the ids the engine *generated* (not a re-tokenization of the answer text, which BPE need not
reproduce). We get there by rendering the whole conversation as text with the chat template,
checking that the new text starts with the previous prompt text + answer text, and tokenizing only
the new part (it starts with the template's end-of-turn marker, a special token, so the token
boundary is clean). A template that breaks the text-prefix property falls back to a full
re-encoding for that turn (`reused_tokens == 0`).

History budget: the earlier turns kept in a prompt cost at most `history_tokens` tokens (user part
plus answer, as measured when the turn was added); when a new turn would exceed it, the oldest
whole turns are dropped down to half the budget (so the following turns extend the prefix again
instead of each dropping one turn), the prompt is re-encoded from the system prompt on (the system prompt is
still shared with the other streams), and the prefix invariant holds again from the next turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from edge_runtime.errors import ConfigError, InputError, RequestError
from edge_runtime.model.chat import control_tokens
from edge_runtime.voice.action_examples import examples_prompt_text, load_examples
from edge_runtime.voice.actions import actions_prompt_text, load_actions


@dataclass(frozen=True)
class SystemPrompt:
    name: str
    text: str
    vocabulary: str  # device and action names: a recognition hint for Whisper (voice/asr.py)
    actions: tuple = ()  # voice/actions.py Action: each command is decoded as a call of one
    # the intro and device list alone: what an API client (which sends the actions as `tools`)
    # says about the home in its own system message
    home: str = ""


def load_system_prompt(path: Path, examples: bool = True) -> SystemPrompt:
    """configs/voice/*.yaml -> the system prompt text (intro, device list, answer format, actions
    and their worked examples; `examples=False` leaves the examples out, for measuring them)."""
    if not path.is_file():
        raise InputError(f"{path}: system prompt YAML not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("intro"), str):
        raise ConfigError(f"{path}: needs at least an 'intro:' text (and 'devices:', 'answer_format:')")
    lines = [data["intro"].strip()]
    devices = data.get("devices") or []
    if devices:
        lines.append("Devices:")
        for dev in devices:
            if not isinstance(dev, dict) or "name" not in dev:
                raise ConfigError(f"{path}: each device needs a 'name:', got {dev!r}")
            where = ", ".join(str(dev[k]) for k in ("kind", "room") if dev.get(k))
            actions = ", ".join(str(a) for a in dev.get("actions") or [])
            lines.append(f"- {dev['name']}" + (f" ({where})" if where else "")
                         + (f": {actions}" if actions else ""))
    home = "\n".join(lines)  # what the home is, before how to answer and the actions
    if data.get("answer_format"):
        lines.append(str(data["answer_format"]).strip())
    actions = tuple(load_actions(data["actions"], str(path))) if "actions" in data else ()
    if actions:  # part of the shared system prompt, so cached once
        lines.append(actions_prompt_text(list(actions)))
    if "examples" in data:
        if not actions:
            raise ConfigError(f"{path}: 'examples:' are calls of 'actions:', which it has none of")
        shown = load_examples(data["examples"], actions, str(path))
        if examples and shown:
            lines.append(examples_prompt_text(shown))
    return SystemPrompt(str(data.get("name", path.stem)), "\n".join(lines), _vocabulary(devices),
                        actions, home)


def _vocabulary(devices: list[dict]) -> str:
    names = list(dict.fromkeys(str(d["name"]) for d in devices))
    actions = list(dict.fromkeys(str(a) for d in devices for a in d.get("actions") or []))
    if not names:
        return ""
    return f"Devices: {', '.join(names)}. Actions: {', '.join(actions)}."


def render(tokenizer, messages: list[dict]) -> str:
    """The chat template's text for `messages`, ending with the assistant generation prompt."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(text, str), type(text)
    return text


def encode_text(tokenizer, text: str) -> list[int]:
    """Tokenize rendered template text (special-token markers in it are parsed, none added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class Turn:
    user: str
    answer: str
    tokens: int  # what this turn adds to a prompt: its user part and its answer


@dataclass(frozen=True)
class PromptPlan:
    prompt_ids: list[int]
    text: str  # the rendered prompt
    reused_tokens: int  # leading tokens equal to the previous prompt + answer
    history_turns: int  # earlier turns in this prompt
    dropped_turns: int  # turns dropped for the budget while building this prompt


@dataclass
class Conversation:
    """One stream's history. `build(command)` then `record(plan, command, answer, answer_ids)`."""

    tokenizer: object
    system: str
    history_tokens: int = 600
    eos_token_ids: tuple[int, ...] = ()
    turns: list[Turn] = field(default_factory=list)
    _ids: list[int] = field(default_factory=list)  # last prompt + its generated answer
    _text: str = ""  # the text those ids stand for

    def __post_init__(self) -> None:
        if self.history_tokens < 0:
            raise ConfigError(f"history_tokens must be >= 0, got {self.history_tokens}")

    def _messages(self, command: str | None) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}]
        for turn in self.turns:
            msgs += [{"role": "user", "content": turn.user},
                     {"role": "assistant", "content": turn.answer}]
        if command is not None:
            msgs.append({"role": "user", "content": command})
        return msgs

    def build(self, command: str) -> PromptPlan:
        """The prompt for `command`; a RequestError when it holds a control token's text."""
        found = [c for c in control_tokens(self.tokenizer) if c in command]
        if found:  # encode_text parses them: the command could end its turn and forge the next
            raise RequestError(f"the command contains the text of the model's control token(s) "
                               f"{', '.join(found)}, which a command cannot carry; not sent")
        dropped = 0
        if sum(t.tokens for t in self.turns) > self.history_tokens:
            # drop to half the budget, not just under it: otherwise every later turn would drop
            # one more turn and miss the cache; this way the next few turns extend the prefix
            while self.turns and sum(t.tokens for t in self.turns) > self.history_tokens // 2:
                self.turns.pop(0)
                dropped += 1
        text = render(self.tokenizer, self._messages(command))
        if not dropped and self._ids and text.startswith(self._text):
            ids = self._ids + encode_text(self.tokenizer, text[len(self._text) :])
            reused = len(self._ids)
        else:
            ids, reused = encode_text(self.tokenizer, text), 0
        return PromptPlan(ids, text, reused, len(self.turns), dropped)

    def record(self, plan: PromptPlan, command: str, answer: str, answer_ids: list[int]) -> None:
        """The engine answered `plan`: extend the history so the next prompt extends these ids."""
        answer_ids = list(answer_ids)
        while answer_ids and answer_ids[-1] in self.eos_token_ids:
            answer_ids.pop()  # the template writes its own end-of-turn marker
        if plan.reused_tokens:
            base = plan.reused_tokens
        else:  # tokens before this turn's user message, measured once after a re-encoding
            base = len(encode_text(self.tokenizer, self._history_text()))
        self.turns.append(Turn(command, answer, len(plan.prompt_ids) - base + len(answer_ids)))
        self._ids = plan.prompt_ids + answer_ids
        self._text = plan.text + answer

    def _history_text(self) -> str:
        """The rendered history before the newest user message (for a turn's token cost)."""
        return self.tokenizer.apply_chat_template(self._messages(None), tokenize=False,
                                                  add_generation_prompt=False)
