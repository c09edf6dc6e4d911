"""Greedy decoding through an Engine and the prompts the greedy checks share: the engine tests
(tests/engine_helpers.py, tests/test_generate_matches_hf.py) and tools/weights_agreement.py read
them from here, so a tool never imports from tests/."""

from __future__ import annotations

from edge_runtime.engine.api import SamplingParams

PLAIN = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 5, 8, 13,",
    "The three laws of thermodynamics are",
]
CHAT = [
    "Turn on the kitchen lights.",
    "What is the boiling point of water at sea level?",
    "Write a haiku about autumn.",
    "Explain in two sentences why the sky is blue, then give one example of Rayleigh scattering "
    "that happens at sunset, and finish with a short summary of the whole answer for a child.",
    "Set a timer for ten minutes and remind me to check the oven.",
]


def greedy_tokens(engine, ids: list[int], max_tokens: int) -> list[int]:
    """One prompt's greedy tokens, the engine stepped until it has nothing left."""
    rid = engine.add_request(ids, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    tokens = []
    while engine.has_unfinished():
        for ev in engine.step():
            if ev.request_id == rid:
                tokens += ev.token_ids
    return tokens
