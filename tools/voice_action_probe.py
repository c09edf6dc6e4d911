"""Which action the built-in model calls for typed commands (voice/actions.py, greedy, the same
grammar as the voice loop): function right / arguments right, per command and in total.

    .venv/bin/python tools/voice_action_probe.py configs/voice/home-actions.yaml

A probe, not the spoken-command evaluation: 12 typed commands over the 8 actions of
home-actions.yaml (one names a device the home does not have: ask_back is right).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


CASES = [
    ("turn off the kitchen lights", "set_light", {"device": "kitchen lights", "state": "off"}),
    ("turn on the bedroom lights", "set_light", {"device": "bedroom lights", "state": "on"}),
    ("dim the living room lights to thirty percent", "dim_light",
     {"device": "living room lights", "brightness": 30}),
    ("set the thermostat to twenty one degrees", "set_thermostat", {"celsius": 21}),
    ("what is the temperature in the hall", "report_temperature", {}),
    ("lock the front door", "set_lock", {"action": "lock"}),
    ("is the front door locked", "set_lock", {"action": "report"}),
    ("open the garage door", "move_door", {"device": "garage door", "action": "open"}),
    ("close the blinds", "move_door", {"device": "blinds", "action": "close"}),
    ("play the radio", "radio", {"action": "play"}),
    ("turn the volume down", "radio", {"action": "volume down"}),
    ("turn on the porch fountain", "ask_back", None),  # any question is right
]


def main() -> None:
    from edge_runtime.engine.backend import prepare_model, select_backend
    from edge_runtime.engine.config import EngineConfig
    from edge_runtime.engine.engine import Engine
    from edge_runtime.model.loader import DEFAULT_MODEL, load_model
    from edge_runtime.model.tool_format import parse_calls
    from edge_runtime.voice.actions import Dispatcher
    from edge_runtime.voice.loop import action_params
    from edge_runtime.voice.prompting import encode_text, load_system_prompt, render

    from edge_runtime.kernels.cpu_threads import configure

    configure(pinned=1)
    system = load_system_prompt(Path(sys.argv[1]))
    loaded = load_model(DEFAULT_MODEL)
    prepare_model(loaded.model, select_backend("cpu", "cpu"))
    engine = Engine(loaded, EngineConfig(num_pages=64))
    params = action_params(Dispatcher(list(system.actions)), 48)
    prompts = [encode_text(loaded.tokenizer, render(loaded.tokenizer, [
        {"role": "system", "content": system.text}, {"role": "user", "content": c}]))
        for c, _, _ in CASES]
    t0 = time.perf_counter()
    results = engine.generate(prompts, [params] * len(prompts))
    right_fn = right_args = 0
    for (command, name, args), res in zip(CASES, results):
        calls = parse_calls(res.text)[1]
        got = calls[0] if calls else None
        fn = got is not None and got.name == name
        ok = fn and (args is None or json.loads(got.arguments) == args)
        right_fn, right_args = right_fn + fn, right_args + ok
        print(f"{'both' if ok else 'fn' if fn else 'no':>4}  {command!r} -> {got}")
    print(f"right function {right_fn}/{len(CASES)}, right arguments {right_args}/{len(CASES)} "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
