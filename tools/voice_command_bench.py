"""The spoken smart-home command set (voice/command_set.py: 47 commands to two homes, 15 actions,
26 naming devices the demo does not have), synthesized with espeak-ng, through Whisper tiny.en and
the built-in model's constrained calls:

1. word error rate without the vocabulary bias, and with it given as faster-whisper's `hotwords`
   or as its `initial_prompt` (each home's device and action names);
2. the calls the model makes (greedy, the voice loop's grammar: one call of one declared action),
   with the system prompt's worked examples left out or in, from the typed command, from what was
   heard without the bias and from what was heard with it: parsed, valid for the schema, right
   function, right arguments.

    .venv/bin/python tools/voice_command_bench.py --out voice_command_bench.json
    .venv/bin/python tools/voice_command_bench.py --model MODEL --typed-only --out qwen.json

`--model` takes any model name or path the runtime serves (`edge-runtime models`); `--typed-only`
skips recognition and scores the typed commands only (recognition does not depend on the model),
which is how two models' calls are compared.

`--jump-forward` measures the engine's jump-forward instead (engine/emission.py,
engine/forced_drafts.py): the typed commands in the loop's setting (examples in, narrowing on),
one call at a time as one stream asks them, on three engines over the one loaded model (on; single
forced tokens only, no drafts; off), the order rotated command by command, each engine warmed
first (both homes' system prompts cached, the grammar compiled). Per call: engine wall and
process-CPU milliseconds from the request to its result, model steps (forwards), generated tokens,
single forced tokens, draft tokens computed and kept, and whether the calls' tokens are identical.

    .venv/bin/python tools/voice_command_bench.py --jump-forward --out jump_forward.json

`--api` asks through the service instead, as an OpenAI client such as Home Assistant's does:
`edge-runtime serve --config cpu-dev` with the model, one chat completion per typed command (the
home's intro and device list as the system message, its actions as `tools`, `tool_choice`
"required", greedy), one request at a time; the calls the service returns are scored as above,
with each request's latency.

    .venv/bin/python tools/voice_command_bench.py --api --model MODEL --out api.json

Prints tables (and every command's row for the voice loop's own setting: heard with the hotwords
bias, examples in), writes JSON. The WAVs are synthesized into the cache folder on the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from edge_runtime.bench.stats import percentile  # noqa: E402
from edge_runtime.voice.call_scoring import accuracy, score_call  # noqa: E402
from edge_runtime.voice.command_set import COMMANDS, HOMES, build_command_wavs  # noqa: E402
from edge_runtime.voice.prompting import load_system_prompt  # noqa: E402
from edge_runtime.voice.report import word_errors  # noqa: E402

BIASES = ("none", "hotwords", "initial_prompt")
LOOP_BIAS = "hotwords"  # what `edge-runtime voice` uses (voice/asr.py)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() \
            else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def transcribe_all(wavs: list[Path], bias: str) -> list[str]:
    from edge_runtime.voice.asr import WhisperRecognizer, default_whisper_folder
    from edge_runtime.voice.wav_file import read_wav

    folder, out = default_whisper_folder(), []
    recognizers = {}
    for home, path in HOMES.items():
        hint = "" if bias == "none" else load_system_prompt(path).vocabulary
        recognizers[home] = WhisperRecognizer(folder, threads=1, hint=hint,
                                              hint_as="hotwords" if bias == "none" else bias)
    for i, (command, wav) in enumerate(zip(COMMANDS, wavs)):
        out.append(recognizers[command.home].transcribe(read_wav(wav)))
        if (i + 1) % 10 == 0:
            log(f"  {bias}: {i + 1}/{len(wavs)} recognized")
    return out


def wer_row(bias: str, transcripts: list[str]) -> dict:
    row = {"bias": bias}
    for part in ("all", "home", "flat"):
        pairs = [(c.text, t) for c, t in zip(COMMANDS, transcripts) if part in ("all", c.home)]
        edits = [word_errors(r, h) for r, h in pairs]
        row[f"wer_{part}"] = sum(e for e, _ in edits) / max(sum(n for _, n in edits), 1)
    return row


def recognized_before(path: Path) -> dict[str, list[str]]:
    heard = json.loads(path.read_text())["transcripts"]
    if set(heard) != set(BIASES) or any(len(t) != len(COMMANDS) for t in heard.values()):
        sys.exit(f"{path}: its transcripts are not of this command set; run without "
                 f"--transcripts-from")
    return heard


class CallMaker:
    """A model (the built-in one unless named) with each home's system prompt and the voice loop's
    grammar."""

    def __init__(self, model: str | None = None):
        import torch

        from edge_runtime.engine.backend import prepare_model, select_backend
        from edge_runtime.model.loader import DEFAULT_MODEL, load_model

        torch.set_num_threads(1)
        self.loaded = load_model(model or DEFAULT_MODEL)
        prepare_model(self.loaded.model, select_backend("cpu", "cpu"))
        self.engine = self.new_engine()
        self.functions = {home: [a.function for a in load_system_prompt(p).actions]
                          for home, p in HOMES.items()}

    def new_engine(self, num_pages: int = 256, **settings):
        from edge_runtime.engine.config import EngineConfig
        from edge_runtime.engine.engine import Engine

        return Engine(self.loaded, EngineConfig(num_pages=num_pages, **settings))

    def requests(self, texts: list[str], examples: bool, narrow: bool) -> tuple[list, list]:
        """(prompt ids, SamplingParams) of each command's call, as the voice loop asks for it."""
        from edge_runtime.voice.call_narrowing import narrow_functions
        from edge_runtime.voice.loop import action_params
        from edge_runtime.voice.prompting import encode_text, render

        systems = {h: load_system_prompt(p, examples=examples).text for h, p in HOMES.items()}
        prompts = [encode_text(self.loaded.tokenizer, render(self.loaded.tokenizer, [
            {"role": "system", "content": systems[c.home]}, {"role": "user", "content": text}]))
            for c, text in zip(COMMANDS, texts)]
        params = [action_params(narrow_functions(self.functions[c.home], text) if narrow
                                else self.functions[c.home], 48)
                  for c, text in zip(COMMANDS, texts)]
        return prompts, params

    def calls(self, texts: list[str], examples: bool, narrow: bool) -> list[str]:
        prompts, params = self.requests(texts, examples, narrow)
        return [r.text for r in self.engine.generate(prompts, params)]


COUNTED = {"steps": "steps", "forced": "forced_tokens", "draft": "draft_tokens",
           "kept": "draft_tokens_kept"}


def timed_call(engine, prompt: list[int], params) -> dict:
    """One call alone on `engine`: its engine time, model steps and tokens."""
    before = {k: engine.counters[c] for k, c in COUNTED.items()}
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = engine.generate([prompt], params)[0]
    return {"ms": (time.perf_counter() - t0) * 1e3, "cpu_ms": (time.process_time() - cpu0) * 1e3,
            "tokens": len(result.token_ids), "token_ids": result.token_ids,
            **{k: engine.counters[c] - before[k] for k, c in COUNTED.items()}}


VARIANTS = {"on": {}, "single tokens only": {"forced_text_drafts": False},
            "off": {"jump_forward": False}}


def jump_forward_rows(maker: CallMaker) -> tuple[list[dict], list[dict]]:
    """Every typed command's call under each of VARIANTS, the order rotated per command ->
    (summary rows, calls)."""
    import statistics

    prompts, params = maker.requests([c.text for c in COMMANDS], examples=True, narrow=True)
    engines = {name: maker.new_engine(num_pages=32, **settings)
               for name, settings in VARIANTS.items()}
    warm = [next(i for i, c in enumerate(COMMANDS) if c.home == h) for h in HOMES]
    for engine in engines.values():
        engine.generate([prompts[i] for i in warm], [params[i] for i in warm])
    names, calls = list(VARIANTS), []
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        order = names[i % len(names):] + names[:i % len(names)]
        got = {name: timed_call(engines[name], prompt, sp) for name in order}
        calls.append({"command": COMMANDS[i].text, **got,
                      "identical": all(g["token_ids"] == got["off"]["token_ids"]
                                       for g in got.values())})
        if (i + 1) % 10 == 0:
            log(f"  {i + 1}/{len(prompts)} commands")
    rows = []
    for name in names:
        runs = [c[name] for c in calls]
        ms = sorted(r["ms"] for r in runs)
        rows.append({"jump_forward": name, "calls": len(runs),
                     "ms_p50": statistics.median(ms), "ms_p95": ms[int(0.95 * (len(ms) - 1))],
                     "ms_mean": statistics.fmean(ms),
                     "cpu_ms_p50": statistics.median(r["cpu_ms"] for r in runs),
                     "steps_mean": statistics.fmean(r["steps"] for r in runs),
                     "tokens_mean": statistics.fmean(r["tokens"] for r in runs),
                     "forced_mean": statistics.fmean(r["forced"] for r in runs),
                     "draft_mean": statistics.fmean(r["draft"] for r in runs),
                     "kept_mean": statistics.fmean(r["kept"] for r in runs),
                     "identical": sum(c["identical"] for c in calls)})
    return rows, calls


def print_jump_forward(rows: list[dict]) -> None:
    print(f"\n{'jump-forward':<20}{'calls':>6}{'ms p50':>8}{'ms p95':>8}{'ms mean':>9}"
          f"{'CPU ms p50':>11}{'steps':>7}{'tokens':>8}{'forced':>8}{'drafted':>9}{'kept':>6}"
          f"{'identical':>11}")
    for r in rows:
        print(f"{r['jump_forward']:<20}{r['calls']:>6}{r['ms_p50']:>8.0f}{r['ms_p95']:>8.0f}"
              f"{r['ms_mean']:>9.0f}{r['cpu_ms_p50']:>11.0f}{r['steps_mean']:>7.1f}"
              f"{r['tokens_mean']:>8.1f}{r['forced_mean']:>8.1f}{r['draft_mean']:>9.1f}"
              f"{r['kept_mean']:>6.1f}{r['identical']:>6}/{r['calls']}")
    print("(per call, means: model steps, generated tokens, single forced tokens appended without "
          "a step, draft tokens computed and kept)")


def api_calls(model: str | None) -> tuple[list[str], list[float]]:
    """Each typed command's call through `edge-runtime serve`'s chat completions with `tools`
    (as the assistant would write it, for score_call), and each request's seconds."""
    import tempfile

    import httpx

    from edge_runtime.bench.peer_servers import ServerProcess, edge_spec
    from edge_runtime.model.loader import DEFAULT_MODEL
    from edge_runtime.service.tool_format import ToolCall, render_call

    prompts = {h: load_system_prompt(p) for h, p in HOMES.items()}
    tools = {h: [a.function.signature() for a in sp.actions] for h, sp in prompts.items()}
    folder = Path(tempfile.mkdtemp(prefix="voice-command-api-"))
    spec = edge_spec(Path(model or DEFAULT_MODEL), str(folder / "api.sock"), "cpu-dev", [])
    calls, seconds = [], []
    with ServerProcess(spec, folder / "serve.log"), httpx.Client(
            transport=httpx.HTTPTransport(uds=spec.socket_path), base_url="http://localhost",
            timeout=300) as client:
        served = client.get("/v1/models").json()["data"][0]["id"]
        for c in COMMANDS:
            body = {"model": served, "temperature": 0, "max_tokens": 96,
                    "messages": [{"role": "system", "content": prompts[c.home].home},
                                 {"role": "user", "content": c.text}],
                    "tools": tools[c.home], "tool_choice": "required"}
            t0 = time.perf_counter()
            resp = client.post("/v1/chat/completions", json=body)
            seconds.append(time.perf_counter() - t0)
            resp.raise_for_status()
            message = resp.json()["choices"][0]["message"]
            calls.append("".join(render_call(ToolCall(t["function"]["name"], t["function"]["arguments"]))
                                 for t in message.get("tool_calls") or []) or (message.get("content") or ""))
    return calls, seconds


def score_rows(texts: list[str], call_texts: list[str]) -> list[dict]:
    schemas = {h: {a.function.name: a.function.parameters for a in load_system_prompt(p).actions}
               for h, p in HOMES.items()}
    rows = []
    for command, text, call_text in zip(COMMANDS, texts, call_texts):
        s = score_call(call_text, command.name, command.arguments, schemas[command.home])
        rows.append({"command": command.text, "home": command.home, "heard": text,
                     "expected": command.name, "expected_arguments": command.arguments,
                     "got": s.got, "parsed": s.parsed, "valid": s.valid,
                     "right_function": s.right_function, "right_arguments": s.right_arguments})
    return rows


def accuracy_row(rows: list[dict], **labels) -> dict:
    from edge_runtime.voice.call_scoring import CallScore

    out = dict(labels)
    for part in ("all", "home", "flat"):
        scores = [CallScore(r["parsed"], r["valid"], r["right_function"], r["right_arguments"],
                            r["got"]) for r in rows if part in ("all", r["home"])]
        out[part] = accuracy(scores).shares()
    return out


def print_tables(wer_rows: list[dict], acc_rows: list[dict], detail: list[dict]) -> None:
    if wer_rows:
        print(f"\n{'Whisper bias':<16}{'WER all':>9}{'home':>8}{'flat':>8}")
    for r in wer_rows:
        print(f"{r['bias']:<16}{r['wer_all']:>9.1%}{r['wer_home']:>8.1%}{r['wer_flat']:>8.1%}")
    print(f"\n{'narrowing':<11}{'examples':<10}{'input':<18}{'parsed':>8}{'valid':>8}{'fn':>8}{'args':>8}"
          f"{'fn home':>9}{'args home':>10}{'fn flat':>9}{'args flat':>10}{'47 calls s':>11}")
    for r in acc_rows:
        a, h, f = r["all"], r["home"], r["flat"]
        print(f"{r['narrowing']:<11}{r['examples']:<10}{r['input']:<18}{a['parsed']:>8.0%}{a['valid']:>8.0%}"
              f"{a['right_function']:>8.0%}{a['right_arguments']:>8.0%}"
              f"{h['right_function']:>9.0%}{h['right_arguments']:>10.0%}"
              f"{f['right_function']:>9.0%}{f['right_arguments']:>10.0%}{r['calls_s']:>11.1f}")
    print("\nper command (examples in, narrowing on, the last input above):")
    for r in detail:
        mark = "both" if r["right_arguments"] else "fn" if r["right_function"] else "no"
        print(f"{mark:>4}  {r['home']:<5}{r['command'][:38]:<39}{r['heard'][:38]:<39}{r['got']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="voice_command_bench.json")
    ap.add_argument("--transcripts-from", type=Path, metavar="JSON",
                    help="take the transcripts from an earlier run's JSON instead of recognizing "
                         "again (the same commands; recognition does not depend on the model)")
    ap.add_argument("--model", default=None, help="the model making the calls (default: built-in)")
    ap.add_argument("--typed-only", action="store_true",
                    help="no recognition: the calls from the typed commands only")
    ap.add_argument("--jump-forward", action="store_true",
                    help="only compare the engine with jump-forward on and off (typed commands)")
    ap.add_argument("--api", action="store_true",
                    help="the typed commands through `edge-runtime serve` with `tools` instead")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.api:
        log("starting edge-runtime serve")
        texts = [c.text for c in COMMANDS]
        calls, seconds = api_calls(args.model)
        rows = score_rows(texts, calls)
        acc = accuracy_row(rows, narrowing="api", examples="-", input="typed",
                           calls_s=round(sum(seconds), 1))
        ms = [1e3 * s for s in seconds]
        latency = {"p50_ms": round(percentile(ms, 50), 1), "p95_ms": round(percentile(ms, 95), 1)}
        print_tables([], [acc], rows)
        print(f"\nrequest latency: p50 {latency['p50_ms']:.0f} ms, p95 {latency['p95_ms']:.0f} ms")
        write_out(args.out, {"model": args.model or "built-in", "api": True, "accuracy": [acc],
                             "latency": latency, "calls": {"api, typed": rows}}, t0)
        return
    if args.jump_forward:
        log("loading the model")
        rows, calls = jump_forward_rows(CallMaker(args.model))
        print_jump_forward(rows)
        write_out(args.out, {"model": args.model or "built-in", "jump_forward": rows,
                             "calls": calls}, t0)
        return
    heard = {}
    if args.transcripts_from and not args.typed_only:
        heard = recognized_before(args.transcripts_from)
    elif not args.typed_only:
        wavs = build_command_wavs(progress=log)
        for bias in BIASES:
            log(f"recognizing {len(wavs)} commands, bias {bias}")
            heard[bias] = transcribe_all(wavs, bias)
    wer_rows = [wer_row(b, heard[b]) for b in BIASES if b in heard]
    log("loading the model")
    maker = CallMaker(args.model)
    inputs = {"typed": [c.text for c in COMMANDS]}
    if heard:
        inputs.update({"heard, no bias": heard["none"], f"heard, {LOOP_BIAS}": heard[LOOP_BIAS]})
    acc_rows, details = [], {}
    for narrow in (False, True):
        for examples in (False, True):
            for name, texts in inputs.items():
                labels = {"narrowing": "on" if narrow else "off",
                          "examples": "in" if examples else "out", "input": name}
                log(f"calls: {labels}")
                start = time.perf_counter()
                call_texts = maker.calls(texts, examples, narrow)
                seconds = time.perf_counter() - start
                rows = score_rows(texts, call_texts)
                details[", ".join(f"{k} {v}" for k, v in labels.items())] = rows
                acc_rows.append(accuracy_row(rows, **labels, calls_s=round(seconds, 1)))
    detail = details[f"narrowing on, examples in, input {'heard, ' + LOOP_BIAS if heard else 'typed'}"]
    print_tables(wer_rows, acc_rows, detail)
    write_out(args.out, {"model": args.model or "built-in", "wer": wer_rows,
                         "accuracy": acc_rows, "transcripts": heard, "calls": details}, t0)


def write_out(path: str, data: dict, t0: float) -> None:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    with open(path, "w") as f:
        json.dump({"commit": commit, "machine": cpu_model(), "cores": os.cpu_count(),
                   "load_average": os.getloadavg()[0],
                   "seconds": round(time.perf_counter() - t0, 1), **data}, f, indent=1)
    log(f"wrote {path} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
