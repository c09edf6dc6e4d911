"""Wiring of one voice run: CPU split, model + engine, recognizer pool, loop, events file.

Used by `edge-runtime voice` and by the end-to-end tests, so both exercise the same path.
Order matters for the CPU split: torch's thread count is set before the model is loaded, the ASR
pool is bounded by the config, and the engine's step thread is the only torch user.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edge_runtime.errors import ConfigError
from edge_runtime.voice.asr import ASRPool, make_recognizer
from edge_runtime.voice.audio_input import Source
from edge_runtime.voice.config import VoiceConfig
from edge_runtime.voice.loop import LoopSettings, StreamReport, VoiceLoop
from edge_runtime.voice.actions import Dispatcher
from edge_runtime.voice.prompting import load_system_prompt
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.kernels import cpu_threads
from edge_runtime.voice.remote import RemoteEngine


def print_stderr(msg: str) -> None:
    print(f"edge-runtime voice: {msg}", file=sys.stderr, flush=True)


@dataclass
class Runtime:
    """What stays loaded between runs (the tests reuse it): tokenizer, engine, recognizer.
    `aengine` is an in-process AsyncEngine, or a RemoteEngine talking to `edge-runtime serve`."""

    tokenizer: object
    eos_token_ids: tuple[int, ...]
    aengine: object
    recognizer: object | None
    load_s: dict = field(default_factory=dict)

    def close(self) -> None:
        self.aengine.shutdown()


def engine_config(num_streams: int, budget, loaded, placement, jump_forward: bool = True):
    """`budget`: a loaded Budget (configs/orin/*.yaml) or None for the engine's defaults;
    `placement`: device and back end (engine/placement.py); `jump_forward`: VoiceConfig's."""
    # start-up time: imports torch
    from edge_runtime.engine.config import EngineConfig, budget_engine_config

    overrides = dict(max_num_seqs=max(8, num_streams), jump_forward=jump_forward,
                     **placement.engine_settings())
    if budget is not None:
        return budget_engine_config(budget, loaded, overrides)[0]
    return EngineConfig(**overrides)


def _engine_threads(config: VoiceConfig) -> str:
    """Set the engine's CPU team policy: cpu.engine_threads pins it; 0 adapts it to the cores
    other programs leave free, at most the cores left after ASR (kernels/cpu_threads.py)."""
    cap = config.resolved_engine_threads()
    if config.engine_threads:
        cpu_threads.configure(pinned=cap)
        return f"{cap} thread(s)"
    cpu_threads.configure(cap=cap)
    return f"up to {cap} thread(s), fewer while other programs take cores"


def _local_engine(config: VoiceConfig, model: str, num_streams: int, budget: str | None,
                  device: str, progress: Callable[[str], None], backend: str | None = None,
                  weights: str = "auto"):
    from edge_runtime.engine.async_engine import AsyncEngine  # start-up time: imports torch
    from edge_runtime.engine.engine import Engine  # start-up time: imports torch

    if budget:  # a bad budget name fails before the model load, not after
        from edge_runtime.budget import load_budget

        budget = load_budget(budget)
    threads = _engine_threads(config)
    progress(f"CPU split: engine {threads}; ASR {config.asr_workers} worker(s) x "
             f"{config.asr_threads} thread(s)")
    placement = resolve(device, backend, budget or None)
    progress(f"loading model {model} on the {placement.backend} back end ({placement.device}, "
             f"--weights {weights}) ...")
    loaded = load_for(model, placement, weights=weights)
    aengine = AsyncEngine(Engine(loaded, engine_config(num_streams, budget, loaded, placement,
                                                       config.jump_forward)))
    return loaded.tokenizer, tuple(loaded.config.eos_token_ids), aengine


def _remote_engine(model: str, server: str, progress: Callable[[str], None], retry_s: float):
    # start-up time: imports torch
    from edge_runtime.model.loader import load_tokenizer, resolve_model_folder

    progress(f"using the service at {server}; loading the tokenizer of {model} ...")
    tokenizer = load_tokenizer(resolve_model_folder(model, progress=None))
    eos = tuple(t for t in (tokenizer.eos_token_id,) if t is not None)
    return tokenizer, eos, RemoteEngine(server, tokenizer, retry_window_s=retry_s)


def load_runtime(config: VoiceConfig, model: str, num_streams: int, budget: str | None = None,
                 device: str = "auto", need_asr: bool = True,
                 progress: Callable[[str], None] = print_stderr, server: str | None = None,
                 backend: str | None = None, weights: str = "auto") -> Runtime:
    """`server`: the Unix socket of a running `edge-runtime serve` (then no model is loaded here:
    only its tokenizer, to build the prompts); `weights`: `--weights` (model/weights_option.py)."""
    times = {}
    t0 = time.perf_counter()
    if server:
        tokenizer, eos, aengine = _remote_engine(model, server, progress, config.server_retry_s)
    else:
        tokenizer, eos, aengine = _local_engine(config, model, num_streams, budget, device, progress,
                                                backend, weights)
    times["model_s"] = time.perf_counter() - t0
    recognizer = None
    if need_asr:
        t0 = time.perf_counter()
        progress(f"loading speech recognizer {config.asr} ...")
        hint = load_system_prompt(config.system_prompt).vocabulary if config.asr_hint else ""
        recognizer = make_recognizer(config.asr, config.asr_threads, config.asr_workers, hint)
        times["asr_s"] = time.perf_counter() - t0
    progress("loaded (" + ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in times.items()) + ")")
    return Runtime(tokenizer, eos, aengine, recognizer, times)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during `run_streams`: `reports` holds what the streams did until then."""

    def __init__(self, reports: list[StreamReport]):
        super().__init__()
        self.reports = reports


class EventsFile:
    """The --events sink: one JSON line per event, flushed. A failed write (a full disk,
    /dev/full) is one warning and turns the events off; the streams and their results go on."""

    def __init__(self, path: Path, warn: Callable[[str], None]):
        self.path = path
        self.warn = warn
        try:
            self._file = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--events {path}: cannot open ({exc.strerror})") from exc

    def write(self, event: dict) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps(event) + "\n")
            self._file.flush()
        except OSError as exc:
            self._fail(exc)

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.warn(f"--events {self.path}: write failed ({exc.strerror or exc}); events are off "
                  "from here")
        file, self._file = self._file, None
        try:
            file.close()  # the unwritten lines fail again: nothing more to say about them
        except OSError:
            pass


def build_loop(runtime: Runtime, config: VoiceConfig, settings: LoopSettings,
               pool: ASRPool | None, on_event: Callable[[dict], None] | None = None,
               on_text: Callable[[int, str], None] | None = None) -> VoiceLoop:
    """The loop over `runtime` with the config's system prompt and actions (the streams of
    `run_streams`, the connections of the Wyoming server)."""
    system = load_system_prompt(config.system_prompt)
    return VoiceLoop(runtime.aengine, runtime.tokenizer, pool, system.text, settings,
                     runtime.eos_token_ids, on_event=on_event, on_text=on_text,
                     actions=Dispatcher(list(system.actions)) if system.actions else None)


def run_streams(runtime: Runtime, config: VoiceConfig, sources: list[Source],
                realtime: bool = False, stagger_s: float = 0.0, tts_dir: Path | None = None,
                half_duplex: bool = False, tts_play: bool = False,
                events_path: Path | None = None,
                on_event: Callable[[dict], None] | None = None,
                on_text: Callable[[int, str], None] | None = None,
                on_warning: Callable[[str], None] = print_stderr) -> list[StreamReport]:
    """Run the loop over `sources` (one per stream) to the end of every input. Ctrl-C raises
    `Interrupted` carrying the reports so far."""
    settings = LoopSettings(vad=config.vad, max_tokens=config.max_tokens,
                            history_tokens=config.history_tokens, realtime=realtime,
                            stagger_s=stagger_s, tts_dir=tts_dir, half_duplex=half_duplex,
                            tts_play=tts_play)
    pool = ASRPool(runtime.recognizer, config.asr_workers) if runtime.recognizer else None
    sink = EventsFile(events_path, on_warning) if events_path else None

    def emit(event: dict) -> None:
        if sink:
            sink.write(event)
        if on_event:
            on_event(event)

    loop = build_loop(runtime, config, settings, pool, on_event=emit, on_text=on_text)
    try:
        return asyncio.run(loop.run(sources))
    except KeyboardInterrupt as exc:
        raise Interrupted(loop.reports) from exc
    finally:
        if pool:
            pool.close()
        if sink:
            sink.close()
