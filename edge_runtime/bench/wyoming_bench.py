"""`edge-runtime bench wyoming`: satellites talking to the Wyoming server at once, in real time.

Method: the model, Whisper and the Wyoming server are loaded in this process (voice/
wyoming_service.py, the `voice --wyoming` path) on 127.0.0.1; `--clients` satellites
(voice/wyoming_satellite.py, the `wyoming` package's client) each stream `--turns` of the demo's
spoken commands (voice/command_set.py's, one espeak-ng voice per satellite) with `run-pipeline`
asr -> tts, started `--stagger` s apart. Headline: end of speech (the client sent the chunk with
the command's last speech sample) -> the first audio-chunk of its reply at the client, p50 / p95.
The split, from the server's turn events (seconds, each command's):
- vad: end of speech -> utterance cut (the VAD's min-silence wait);
- asr: the cut -> the transcript ready (waiting for the ASR worker + Whisper, less what ran before
  the cut: recognition starts from the VAD's settled draft, `pad_ms` into the silence), with
  Whisper's own run time shown apart;
- engine: recognized -> answer complete (this stream's previous turn, the actions' grammar
  narrowed to the command and compiled, queue, prefill, decode, the action's dispatch), with the
  grammar's compile and queue + prefill + decode shown apart;
- tts: espeak-ng started -> first reply chunk sent.
Also: commands heard, answered and spoken back, those recognized from the VAD's settled draft
(the others were recognized again at the cut: speech resumed after pad_ms), the word error rate
of what was heard, the prompt tokens later turns got from the prefix cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

from edge_runtime.bench.report import Column, machine_info, markdown_table, write_json
from edge_runtime.bench.stats import percentile
from edge_runtime.voice.report import wer
from edge_runtime.bench.checks import check_min
from edge_runtime.errors import InputError

SPLIT = (("reply_s", "end of speech -> first reply audio (client)"),
         ("vad_s", "vad: end of speech -> cut"),
         ("asr_s", "asr: cut -> transcript (queue + Whisper, less the part before the cut)"),
         ("whisper_s", "asr part: Whisper's run"),
         ("engine_s", "engine: recognized -> answer (+ action)"),
         ("grammar_s", "engine part: narrowed grammar compile"),
         ("decode_s", "engine part: queue + prefill + decode"),
         ("tts_s", "tts: espeak-ng -> first chunk"),
         ("server_reply_s", "end of speech -> first reply chunk sent (server)"))
COLUMNS = [Column("what", "seconds"), Column("p50", "p50", "{:.2f}"),
           Column("p95", "p95", "{:.2f}"), Column("mean", "mean", "{:.2f}"),
           Column("n", "n")]


def _progress(msg: str) -> None:
    print(f"bench wyoming: {msg}", file=sys.stderr, flush=True)


def split_of(turn: dict) -> dict:
    """A server turn event -> its split (voice/loop.py's and voice/wyoming_turns.py's fields)."""
    heard = turn.get("asr_done_s")  # end of speech -> transcript (recognition may start early)
    if heard is None:
        heard = turn["vad_s"] + turn["asr_queue_s"] + turn["asr_s"]
    heard = max(heard, turn["vad_s"])
    return {"vad_s": turn["vad_s"], "asr_s": heard - turn["vad_s"], "whisper_s": turn["asr_s"],
            "engine_s": turn["total_s"] - heard,
            "grammar_s": turn.get("grammar_s"),
            "decode_s": turn["engine_queue_s"] + turn["prefill_s"] + turn["answer_s"],
            "tts_s": turn.get("tts_s"), "server_reply_s": turn.get("reply_audio_s")}


def rows_of(values: dict[str, list[float]]) -> list[dict]:
    rows = []
    for key, what in SPLIT:
        xs = [x for x in values.get(key, []) if x is not None]
        rows.append({"key": key, "what": what, "p50": percentile(xs, 50),
                     "p95": percentile(xs, 95), "mean": sum(xs) / len(xs) if xs else None,
                     "n": len(xs)})
    return rows


async def measure(runtime, config, model: str, clients: int, turns: int, stagger_s: float):
    from edge_runtime.voice.wyoming_satellite import run_satellite, spoken_commands  # optional library
    from edge_runtime.voice.command_set import SPEED, VOICES  # start-up time: imports numpy
    from edge_runtime.voice.demo import DEMO_COMMANDS  # start-up time: imports numpy
    from edge_runtime.voice.wyoming_service import wyoming_server  # optional library: wyoming

    spoken = [spoken_commands(list(DEMO_COMMANDS[i % len(DEMO_COMMANDS)][:turns]),
                              VOICES[i % len(VOICES)], SPEED) for i in range(clients)]
    server_turns: list[dict] = []
    async with wyoming_server(runtime, config, "127.0.0.1", 0, model,
                              on_turn=server_turns.append) as (server, (host, port)):
        _progress(f"{clients} satellites streaming {turns} commands each in real time to "
                  f"tcp://{host}:{port} ...")
        runs = await asyncio.gather(*(run_satellite(host, port, s, i * stagger_s)
                                      for i, s in enumerate(spoken)))
    return spoken, runs, server_turns, server.stats()  # after stop(): every connection closed


def summarize(spoken, runs, server_turns) -> dict:

    replies = [r for run in runs for r in run.replies]
    values: dict[str, list[float]] = {"reply_s": [r.latency_s for r in replies]}
    for turn in server_turns:
        for key, value in split_of(turn).items():
            values.setdefault(key, []).append(value)
    pairs = [(text, r.transcript or "") for s, run in zip(spoken, runs)
             for text, r in zip(s.texts, run.replies)]
    later = [t for t in server_turns if t["utterance"] >= 1 and t.get("prompt_tokens")]
    return {
        "commands": len(replies),
        "transcribed": sum(r.transcript is not None for r in replies),
        "answered": sum(bool(r.answer) for r in replies),
        "from_draft": sum(bool(t.get("asr_from_draft")) for t in server_turns),
        "spoken_back": sum(r.done and r.audio_bytes > 0 for r in replies),
        "errors": [e for run in runs for e in run.errors],
        "wer": wer(pairs),
        "later_turns_cached": (sum(t["cached_prompt_tokens"] for t in later)
                               / max(1, sum(t["prompt_tokens"] for t in later))) if later else None,
        "rows": rows_of(values),
        "turns": [{k: v for k, v in t.items() if isinstance(v, (int, float, str, bool))}
                  for t in server_turns],
    }


def run(args) -> int:
    from edge_runtime.model.loader import DEFAULT_MODEL  # start-up time: imports numpy, torch
    from edge_runtime.voice.config import load_voice_config  # start-up time: imports numpy
    from edge_runtime.voice.session import load_runtime  # start-up time: imports numpy

    check_min(args, clients=1, turns=1)
    if args.turns > 4:
        raise InputError(f"--turns is at most 4 (the demo's commands per stream), got "
                         f"{args.turns}")
    if not 0 <= args.stagger <= 60:
        raise InputError(f"--stagger must be 0-60 seconds, got {args.stagger}")
    config = load_voice_config(args.voice_config)
    if args.system_prompt:
        config = dataclasses.replace(config, system_prompt=args.system_prompt)
    model = args.model or DEFAULT_MODEL
    runtime = load_runtime(config, model, args.clients, args.config, progress=_progress)
    try:
        spoken, runs, server_turns, stats = asyncio.run(
            measure(runtime, config, model, args.clients, args.turns, args.stagger))
    finally:
        runtime.close()
    result = summarize(spoken, runs, server_turns)
    print(f"{args.clients} Wyoming satellites x {args.turns} spoken commands, real time; "
          f"model {model}, system prompt {config.system_prompt.name}")
    print(markdown_table(result["rows"], COLUMNS))
    cached = result["later_turns_cached"]
    print(f"commands {result['commands']}: transcribed {result['transcribed']}, answered "
          f"{result['answered']}, spoken back {result['spoken_back']}; recognized from the VAD's "
          f"settled draft {result['from_draft']}; WER {result['wer']:.1%}; "
          f"later turns' prompt tokens from the prefix cache "
          f"{'n/a' if cached is None else f'{cached:.0%}'}; server errors "
          f"{len(result['errors'])}; connections {stats}")
    if args.json:
        write_json(args.json, {"bench": "wyoming", "model": model, "clients": args.clients,
                               "turns": args.turns, "stagger_s": args.stagger,
                               "system_prompt": str(config.system_prompt), "server": stats,
                               "machine": machine_info(), **result})
    return 0 if result["spoken_back"] == result["commands"] else 1


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("wyoming", help="satellites streaming spoken commands to the "
                                              "Wyoming server at once: end of speech -> first "
                                              "reply audio, with the VAD/ASR/engine/TTS split")
    p.add_argument("--clients", type=int, default=5, help="satellites at once (default 5)")
    p.add_argument("--turns", type=int, default=2, help="commands per satellite, 1-4 (default 2)")
    p.add_argument("--stagger", type=float, default=0.6,
                   help="seconds between satellite starts (default 0.6, as the demo)")
    p.add_argument("--model", default=None, help="model (default: smollm2-135m-instruct)")
    p.add_argument("--config", help="memory budget YAML or name (configs/orin/*.yaml)")
    p.add_argument("--voice-config", type=Path, help="voice settings YAML "
                                                     "(default: configs/voice/default.yaml)")
    p.add_argument("--system-prompt", type=Path,
                   default=Path(__file__).resolve().parents[2] / "configs/voice/home-actions.yaml",
                   help="devices and actions YAML (default: configs/voice/home-actions.yaml)")
    p.add_argument("--json", help="write the rows, every turn and the machine description here")
    p.set_defaults(func=run)
