"""Where an engine step's time goes: the decoder layers, the LM head, and everything else (the
Python of scheduling, KV indexing, sampling and detokenizing, and the small torch ops between).

`StepPhases(model)` times a CausalLM's layer stack (the one-call C stack, kernels/cpu_decoder.py,
or the torch layer loop) and its LM head until `remove()`; `take()` returns the seconds spent in
each since the last `take()`. Used by `bench step` (docs/perf.md); it changes nothing it measures
beyond two clock reads per phase.
"""
from __future__ import annotations

import time


class _TimedCall:
    """A callable that adds its wall time to `phases.seconds[name]` and delegates."""

    def __init__(self, fn, phases: "StepPhases", name: str) -> None:
        self.fn, self.phases, self.name = fn, phases, name

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.phases.seconds[self.name] += time.perf_counter() - t0


class StepPhases:
    def __init__(self, model) -> None:
        self.model = model
        self.seconds = {"layers": 0.0, "lm_head": 0.0}
        self._fused = model.fused_decoder
        if self._fused is not None:
            model.fused_decoder = _TimedCall(self._fused, self, "layers")
        layers = model.model.layers
        self._hooks = [
            layers[0].register_forward_pre_hook(lambda *_: self._start("layers")),
            layers[-1].register_forward_hook(lambda *_: self._stop("layers")),
            model.lm_head.register_forward_pre_hook(lambda *_: self._start("lm_head")),
            model.lm_head.register_forward_hook(lambda *_: self._stop("lm_head")),
        ]
        self._started: dict[str, float] = {}

    def _start(self, name: str) -> None:
        self._started[name] = time.perf_counter()

    def _stop(self, name: str) -> None:
        self.seconds[name] += time.perf_counter() - self._started.pop(name)

    def take(self) -> dict[str, float]:
        """Seconds per phase since the last take (or since the start)."""
        out, self.seconds = self.seconds, {name: 0.0 for name in self.seconds}
        return out

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self.model.fused_decoder = self._fused
