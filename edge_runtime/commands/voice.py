"""`edge-runtime voice`: N concurrent voice-command streams through VAD, Whisper, the engine and
(optionally) espeak-ng. `--demo` synthesizes 5 streams of spoken commands and runs them (docs/voice.md).

Inputs: `--input SPEC` per stream (repeatable; with fewer inputs than --streams they are reused
round-robin). SPEC is `[wav:|folder:|pcm:|text:]PATH` (see edge_runtime/voice/audio_input.py).
Exit status: 0 when every stream ran clean, 1 when some stream reported a fault (each printed as
one line naming the file and the problem) or the events file could not be written, 2 for a
usage/config error, 130 after Ctrl-C (the turns answered so far are printed first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.voice.usage import check_pipes_unshared as _check_pipes_unshared
from edge_runtime.errors import ConfigError, EdgeError
from edge_runtime.voice import report
from edge_runtime.voice.prompting import load_system_prompt
from edge_runtime.voice.usage import check_device, check_outputs, check_stagger
from edge_runtime.voice.wyoming_config import parse_listen


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "voice", help="the voice-command loop: N audio streams -> VAD -> ASR -> engine -> answers",
        description="Run concurrent voice-command streams: each input is cut into utterances by "
                    "VAD, recognised by Whisper tiny.en (or pocketsphinx / a model folder), and "
                    "answered by the engine with the stream's own history. Prints answers, a "
                    "table per stream and the latency split; writes JSON-lines events.")
    p.add_argument("--config", help="memory budget YAML or name (configs/orin/*.yaml) that sizes "
                                    "the engine's page pool (default: the engine's defaults)")
    p.add_argument("--voice-config", type=Path,
                   help="voice settings YAML (default: configs/voice/default.yaml)")
    p.add_argument("--model", default=None, help="model name or path (default: smollm2-135m-instruct)")
    p.add_argument("--streams", type=int, default=None, help="number of streams (default: one per "
                                                              "--input; 5 with --demo)")
    p.add_argument("--input", action="append", default=[], metavar="SPEC",
                   help="[wav:|folder:|pcm:|text:]PATH; repeat for several streams")
    p.add_argument("--demo", action="store_true", help="synthesize 5 streams of spoken commands "
                                                       "with espeak-ng and run them")
    p.add_argument("--turns", type=int, default=4, help="commands per stream with --demo (1-4)")
    p.add_argument("--tts", action="store_true", help="speak answers with espeak-ng into WAVs")
    p.add_argument("--tts-play", action="store_true",
                   help="speak answers on the default audio device (one at a time)")
    p.add_argument("--tts-dir", type=Path, default=Path("voice-answers"),
                   help="folder for the spoken answers (default: ./voice-answers)")
    p.add_argument("--events", type=Path, help="write one JSON line per utterance/fault here")
    p.add_argument("--asr", help="whisper | pocketsphinx | PATH (overrides the voice config)")
    p.add_argument("--no-asr-hint", action="store_true",
                   help="do not give Whisper the device names from the system-prompt YAML")
    p.add_argument("--system-prompt", type=Path, help="system prompt YAML (configs/voice/home.yaml)")
    p.add_argument("--max-tokens", type=int, help="answer length limit (overrides the config)")
    p.add_argument("--realtime", action="store_true",
                   help="feed audio at 1x speed, as a microphone would (the demo's default)")
    p.add_argument("--fast", action="store_true", help="with --demo: feed audio as fast as possible")
    p.add_argument("--duplex", choices=["half", "full"], default=None,
                   help="half: a stream's next command is read only after its previous answer "
                        "(a person waiting for the reply; the demo's default); full: keep "
                        "reading while answering (live microphones; the default otherwise)")
    p.add_argument("--stagger", type=float, default=None,
                   help="seconds between stream starts in --realtime mode (demo: 0.6)")
    p.add_argument("--server", metavar="SOCKET",
                   help="use a running `edge-runtime serve` on this Unix socket instead of loading "
                        "the model here (--model then only picks the tokenizer)")
    p.add_argument("--wyoming", metavar="HOST:PORT",
                   help="serve the Wyoming protocol here instead of reading inputs: speech-to-text, "
                        "text-to-speech and intent handling for Home Assistant and satellites, one "
                        "stream per connection. A port alone binds to 127.0.0.1; Wyoming has no "
                        "authentication, so name 0.0.0.0 or an address only on a trusted network "
                        "(default: the voice config's wyoming.listen, used when no --input/--demo)")
    add_placement_arguments(p)
    add_weights_option(p)
    p.add_argument("--quiet", action="store_true", help="no per-utterance progress lines")
    p.set_defaults(func=run)


def _config(args):
    import dataclasses

    from edge_runtime.voice.config import load_voice_config  # start-up time: imports numpy

    config = load_voice_config(args.voice_config)
    changes = {}
    if args.asr:
        changes["asr"] = args.asr
    if args.system_prompt:
        changes["system_prompt"] = args.system_prompt
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        changes["max_tokens"] = args.max_tokens
    if args.no_asr_hint:
        changes["asr_hint"] = False
    config = dataclasses.replace(config, **changes) if changes else config
    load_system_prompt(config.system_prompt)  # a bad prompt YAML fails before the model load
    return config


def _sources(args, progress):
    # start-up time: imports numpy
    from edge_runtime.voice.audio_input import Source, parse_input_spec
    # start-up time: imports numpy
    from edge_runtime.voice.demo import DEMO_COMMANDS, build_demo_inputs  # start-up time: imports numpy

    if args.streams is not None and args.streams < 1:
        raise ConfigError(f"--streams must be >= 1, got {args.streams}")
    references = None
    specs = list(args.input)
    if args.demo:
        if specs:
            raise ConfigError("--demo makes its own inputs; drop --input")
        if not 1 <= args.turns <= 4:
            raise ConfigError(f"--turns must be between 1 and 4, got {args.turns}")
        streams = args.streams or len(DEMO_COMMANDS)
        if streams > len(DEMO_COMMANDS):
            raise ConfigError(f"--demo has 1-{len(DEMO_COMMANDS)} streams, got --streams "
                              f"{streams} (give --input SPECs for more streams)")
        demo = build_demo_inputs(streams, args.turns, progress=progress)
        specs = [str(wav) for wav, _ in demo]
        references = [cmds for _, cmds in demo]
    if not specs:
        raise ConfigError("give at least one --input SPEC (or --demo)")
    n = args.streams or len(specs)
    if n < len(specs):
        raise ConfigError(f"{len(specs)} inputs but --streams {n}: every input needs its own "
                          f"stream (raise --streams to {len(specs)} or drop inputs)")
    parsed = []
    for i, spec in enumerate(specs):
        try:
            parsed.append(parse_input_spec(spec))
        except EdgeError as exc:
            raise ConfigError(f"input {i}: {exc}") from exc
    sources = [Source(parsed[i % len(parsed)]) for i in range(n)]
    _check_pipes_unshared(sources)
    return sources, references


def run(args: argparse.Namespace) -> int:
    from edge_runtime.model.loader import DEFAULT_MODEL  # start-up time: imports numpy, torch
    from edge_runtime.voice.config import DEFAULT_CONFIG  # start-up time: imports numpy
    # start-up time: imports numpy
    from edge_runtime.voice.session import load_runtime, print_stderr  # start-up time: imports numpy

    progress = (lambda msg: None) if args.quiet else print_stderr
    config = _config(args)
    address = _wyoming_address(args, config)
    if address is not None:
        return _serve_wyoming(args, config, address)
    check_stagger(args.stagger)
    check_device(args.device, args.server)
    sources, references = _sources(args, progress)
    check_outputs(sources, args.events, args.tts_dir if args.tts else None,
                  {"--voice-config": args.voice_config or DEFAULT_CONFIG,
                   "--system-prompt": config.system_prompt})
    need_asr = any(s.spec.kind != "text" for s in sources)
    runtime = load_runtime(config, args.model or DEFAULT_MODEL, len(sources), args.config,
                           args.device, need_asr, progress=print_stderr, server=args.server,
                           backend=args.backend, weights=args.weights)
    out, events_failed = _Stdout(), []
    reports, engine_stats, interrupted = _serve(args, runtime, config, sources, out,
                                                events_failed)
    _print_summary(reports, references, out)
    if engine_stats:
        _print_engine(engine_stats, out)
    if args.events and not events_failed:
        print_stderr(f"events written to {args.events}")
    if interrupted:
        print_stderr("interrupted: the tables above hold the turns answered before Ctrl-C")
        return 130
    return 1 if events_failed or any(r.faults for r in reports) else 0


def _wyoming_address(args, config):
    """(host, port) to serve Wyoming on, or None for the input streams."""

    if args.wyoming is None:
        if args.input or args.demo or config.wyoming.listen is None:
            return None
        return parse_listen(config.wyoming.listen, "wyoming.listen")
    clash = [flag for flag, given in (("--input", args.input), ("--demo", args.demo),
                                      ("--tts", args.tts), ("--tts-play", args.tts_play),
                                      ("--streams", args.streams is not None))
             if given]
    if clash:
        raise ConfigError(f"--wyoming serves its connections' audio; drop {', '.join(clash)} "
                          "(a connection asks for speech with `synthesize`)")
    return parse_listen(args.wyoming)


def _serve_wyoming(args, config, address) -> int:
    """Load the model and recognizer, then serve Wyoming until Ctrl-C or SIGTERM."""
    from edge_runtime.model.loader import DEFAULT_MODEL  # start-up time: imports numpy, torch
    # start-up time: imports numpy
    from edge_runtime.voice.session import EventsFile, load_runtime, print_stderr
    from edge_runtime.voice.wyoming_service import run_wyoming  # optional library: wyoming

    check_device(args.device, args.server)
    model = args.model or DEFAULT_MODEL
    runtime = load_runtime(config, model, config.wyoming.max_connections, args.config,
                           args.device, True, progress=print_stderr, server=args.server,
                           backend=args.backend, weights=args.weights)
    sink = EventsFile(args.events, print_stderr) if args.events else None
    printer, _ = _printers(args.quiet, False, print_stderr, _Stdout())

    def on_event(event: dict) -> None:
        if sink:
            sink.write(event)
        printer(event)

    try:
        stats = run_wyoming(runtime, config, *address, model, print_stderr, on_event)
    finally:
        runtime.close()
        if sink:
            sink.close()
    if stats:
        print_stderr("stopped: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    return 0


def _serve(args, runtime, config, sources, out: _Stdout, events_failed: list):
    """Run the streams -> (reports, engine stats or None, interrupted). Ctrl-C keeps the
    reports so far; a failed events write is appended to `events_failed`."""
    # start-up time: imports numpy
    from edge_runtime.voice.session import Interrupted, print_stderr, run_streams

    realtime = args.realtime or (args.demo and not args.fast)
    stagger = args.stagger if args.stagger is not None else (0.6 if args.demo else 0.0)
    half = (args.duplex or ("half" if args.demo else "full")) == "half"
    print_stderr(f"running {len(sources)} stream(s) ({'real time' if realtime else 'as fast as possible'}"
            f", {'half' if half else 'full'} duplex)")
    live = len(sources) == 1 and not args.quiet  # one stream: its answers stream to stdout
    on_event, on_text = _printers(args.quiet, live, print_stderr, out)
    try:
        reports = run_streams(runtime, config, sources, realtime=realtime, stagger_s=stagger,
                              tts_dir=args.tts_dir if args.tts else None, half_duplex=half,
                              tts_play=args.tts_play, events_path=args.events,
                              on_event=on_event, on_text=on_text,
                              on_warning=lambda msg: (events_failed.append(msg), print_stderr(msg)))
        engine = getattr(runtime.aengine, "engine", None)  # None with --server
        return reports, (engine.stats() if engine is not None else None), False
    except Interrupted as exc:  # Ctrl-C: what was answered so far, then exit 130
        return exc.reports, None, True
    finally:
        runtime.close()


class _Stdout:
    """stdout that goes quiet once its reader is gone (`| head -c 3`): the streams, the events
    file and the exit status carry on, and no BrokenPipeError traceback is printed."""

    def __init__(self) -> None:
        self.closed = False

    def print(self, *args, **kwargs) -> None:
        if self.closed:
            return
        try:
            print(*args, **kwargs, flush=True)
        except BrokenPipeError:
            self.closed = True
            try:  # Python's own advice: point fd 1 at devnull so the exit flush succeeds too
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError):  # a stdout without a file descriptor
                sys.stdout = open(os.devnull, "w")


def _printers(quiet: bool, live: bool, note, out: _Stdout):
    """(on_event, on_text): progress lines, fault lines, a one-time TTS warning, live text."""
    warned_tts: list = []  # say it once, not once per answer

    def on_text(stream: int, delta: str) -> None:
        out.print(delta, end="")

    def on_event(ev: dict) -> None:
        if live and "answer" in ev:
            out.print()
        if ev["kind"] == "error":
            print(f"edge-runtime voice: stream {ev['stream']}: {ev['problem']}", file=sys.stderr)
            return
        if ev.get("tts_error") and not warned_tts:
            warned_tts.append(True)
            note(f"warning: {ev['tts_error']}")
        if not quiet:
            tail = (f"-> {ev['answer']!r} (first token {ev['first_token_s']:.2f}s after speech, "
                    f"cached {ev['cached_prompt_tokens']}/{ev['prompt_tokens']})"
                    if "answer" in ev else f"({ev.get('skipped')})")
            note(f"[stream {ev['stream']} #{ev['utterance']}] {ev['transcript']!r} {tail}")

    return on_event, (on_text if live else None)


def _print_engine(stats: dict, out: _Stdout) -> None:
    """How the streams' generations were batched (decode tokens per engine step)."""
    steps = max(1, stats["steps"])
    out.print(f"engine: {stats['steps']} steps, {stats['decode_tokens']} decode tokens "
              f"({stats['decode_tokens'] / steps:.2f} per step: the streams' answers batched), "
              f"{stats['prefill_tokens']} prefill tokens computed, {stats['preemptions']} "
              "preemptions")


def _print_summary(reports, references, out: _Stdout | None = None) -> None:
    """Per-stream tables, the WER over every reference command (aligned with what was heard, so
    a dropped or split utterance is counted, never shifts the rows), the latency split."""
    out = out or _Stdout()
    events = [ev for r in reports for ev in r.events]
    for r in reports:
        refs = references[r.stream] if references and r.stream < len(references) else None
        out.print(report.stream_table(r.stream, r.events, refs))
        for fault in r.faults:
            out.print(f"  fault: {fault['problem']}")
    if references:
        scores = [report.score(refs, [ev["transcript"] for ev in r.events])
                  for r, refs in zip(reports, references)]
        total = report.Score.total(scores)
        if total.words:
            out.print(f"word error rate: {total.wer:.1%} over {total.commands} commands"
                      + total.gaps())
    if any("first_token_s" in ev for ev in events):
        out.print("latency split (seconds from the end of speech; see docs/voice.md):")
        out.print(report.split_table(report.latency_split(events)))
    out.print(json.dumps({"answered": sum("answer" in ev for ev in events),
                          "utterances": len(events),
                          "faults": sum(len(r.faults) for r in reports)}))
